"""Who may see a request's values in the admin: a viewer who may view its record's model there.

The request log's own view permission shows every request's record, status and outcome; its values (the
changes, and an error that may quote them) only where :func:`may_view` says so. A request of no record
(an ``@idempotent`` task's, a batch item's) has no model to ask: its values are shown to a viewer with the
log's permission ``safeupdates.view_recordless_values`` (:func:`may_view_recordless`; a superuser has it).
A request is re-driven (:mod:`safeupdates.admin.failed`) by a user with ``safeupdates.redrive_failedrequest``
who may change its record's model (:func:`may_change`).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib import admin
from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.http import HttpRequest

from safeupdates.models import LockVersionMixin, ProcessedRequest

#: The permission (of the request log, ``safeupdates.<codename>``) that shows the values of the requests
#: of no record: tasks and batch items.
RECORDLESS_VALUES = "view_recordless_values"
#: The request log's fields that hold a request's values (an error may quote them).
VALUE_FIELDS = frozenset({"changes", "error"})
#: What stands for the values of a request of no record, to a viewer without :data:`RECORDLESS_VALUES`.
RECORDLESS_HIDDEN = "hidden: you may not view the values of requests with no record"
#: What stands for the values of a request whose model is gone: no one may view it.
MODEL_GONE_HIDDEN = "hidden: the model of this request is gone"


def may_view(request: HttpRequest, model: type[models.Model], site: admin.AdminSite) -> bool:
    """Whether the viewer may view ``model`` in the admin: its ``ModelAdmin`` says; a model without one, as
    Django's admin would: by its view or its change permission (a superuser has them all)."""
    if site.is_registered(model):
        return bool(site.get_model_admin(model).has_view_permission(request))
    user: Any = request.user
    return any(
        user.has_perm(f"{model._meta.app_label}.{action}_{model._meta.model_name}") for action in ("view", "change")
    )


def may_change(request: HttpRequest, model: type[models.Model], site: admin.AdminSite) -> bool:
    """Whether the viewer may change ``model`` in the admin (to re-drive its requests, which write its rows):
    its ``ModelAdmin`` says; a model without one, its change permission (a superuser has them all)."""
    if site.is_registered(model):
        return bool(site.get_model_admin(model).has_change_permission(request))
    user: Any = request.user
    return bool(user.has_perm(f"{model._meta.app_label}.change_{model._meta.model_name}"))


def may_view_recordless(request: HttpRequest) -> bool:
    """Whether the viewer may see the values of the requests of no record (tasks, batch items): the
    request log's permission :data:`RECORDLESS_VALUES` (a superuser has it)."""
    user: Any = request.user
    return bool(user.has_perm(f"{ProcessedRequest._meta.app_label}.{RECORDLESS_VALUES}"))


def shown_rows(request: HttpRequest, site: admin.AdminSite) -> models.Q:
    """The requests whose values the viewer may see: of a model the viewer may view, or of no record
    with :func:`may_view_recordless`."""
    shown = models.Q(content_type_id__in=viewable_content_types(request, site))
    return shown | models.Q(content_type__isnull=True) if may_view_recordless(request) else shown


def viewable_content_types(request: HttpRequest, site: admin.AdminSite) -> list[int]:
    """The content types of the models that use safeupdates and that the viewer may view (asked once per
    request): only their requests' values are shown to this viewer."""
    cached: list[int] | None = getattr(request, "_safeupdates_viewable", None)
    if cached is None:
        versioned = [m for m in apps.get_models() if issubclass(m, LockVersionMixin) and not m._meta.proxy]
        allowed = [model for model in versioned if may_view(request, model, site)]
        types = ContentType.objects.get_for_models(*allowed).values() if allowed else []
        cached = sorted(content_type.pk for content_type in types)
        request._safeupdates_viewable = cached  # type: ignore[attr-defined]
    return cached


def values_shown(obj: ProcessedRequest) -> bool:
    """Whether ``obj``'s values may be shown to the viewer its queryset was made for (see
    :meth:`ProcessedRequestAdmin.get_queryset`; a row from elsewhere is shown as the log's permission allows)."""
    return bool(getattr(obj, "safeupdates_shown", True))


def hidden_values(obj: ProcessedRequest) -> str:
    """What stands for the values of a request whose model the viewer may not view."""
    if obj.content_type_id is None:
        return RECORDLESS_HIDDEN
    try:
        content_type = obj.content_type
    except ContentType.DoesNotExist:
        content_type = None
    if content_type is None:  # the log has no foreign key: its content type was deleted
        return MODEL_GONE_HIDDEN
    return f"hidden: you may not view {content_type.app_label}.{content_type.model}"
