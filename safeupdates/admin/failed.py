"""The failed and rejected requests in the admin (:class:`FailedRequestAdmin`), and the action that re-drives
them: Sidekiq's dead set, SQS's redrive, for the request log.

A request fails when transient errors outlast its job's retries (a long outage), and is rejected when its
values are refused or its row is gone; neither wrote anything. Here they are listed with their last error
and attempts, filtered by model and by error, and, once the cause is fixed, re-driven: each made pending
again and its record's job delivered on commit, once (:func:`safeupdates.jobs.redrive`).

Who may do what, as for the request log's values (:mod:`safeupdates.admin.permissions`): whoever may view
the log may view this list, the values and errors of a request only if they may view its model; the
action is offered to users with ``safeupdates.redrive_failedrequest``, and re-drives the requests of the
models they may change, no other.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.http import HttpRequest
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from safeupdates import jobs
from safeupdates.admin.permissions import may_change, shown_rows
from safeupdates.admin.requestlog import ProcessedRequestAdmin, RequestLogPaginator, SafeUpdateModelsFilter
from safeupdates.models import FailedRequest, LockVersionMixin, ProcessedRequest, RequestKind, RequestStatus

#: The statuses listed here: the requests an operator may want to re-drive.
UNRESOLVED = (RequestStatus.FAILED, RequestStatus.REJECTED)


class OutcomeFilter(admin.SimpleListFilter):
    """ "By outcome": failed or rejected."""

    title = _("outcome")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(status.value, status.label) for status in UNRESOLVED]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> models.QuerySet[Any]:
        value = self.value()
        return queryset.filter(status=value) if value in {s.value for s in UNRESOLVED} else queryset


class ErrorFilter(admin.SimpleListFilter):
    """ "By error": the most frequent errors, with their counts, of the requests whose values the viewer may
    see (an error may quote the values); filtering by one looks at those requests only."""

    title = _("error")
    parameter_name = "error"
    #: How many errors are offered, the most frequent first.
    limit = 20

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        errors = (
            ProcessedRequest.objects.using(model_admin.get_queryset(request).db)
            .filter(shown_rows(request, model_admin.admin_site), status__in=UNRESOLVED)
            .exclude(error="")
            .values("error")
            .annotate(count=models.Count("pk"))
            .order_by("-count", "error")[: self.limit]
        )
        return [(row["error"], f"{Truncator(row['error']).chars(80)} ({row['count']})") for row in errors]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> models.QuerySet[Any]:
        value = self.value()
        return queryset.filter(error=value, safeupdates_shown=True) if value else queryset


class FailedModelsFilter(SafeUpdateModelsFilter):
    """ "By model", among the models that have failed or rejected requests only (a project's other
    models would be a long list of choices that show nothing)."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        present = set(model_admin.get_queryset(request).order_by().values_list("content_type", flat=True).distinct())
        return [choice for choice in super().field_choices(field, request, model_admin) if int(choice[0]) in present]


@admin.register(FailedRequest)
class FailedRequestAdmin(ProcessedRequestAdmin):
    """The failed and rejected requests, newest outcome first, and the action that re-drives them."""

    list_display = [
        "request_id",
        "target_link",
        "wanted",
        "status",
        "last_error",
        "attempts",
        "processed_at",
    ]
    list_filter = [OutcomeFilter, ("content_type", FailedModelsFilter), ErrorFilter]
    ordering = ["-processed_at", "-id"]
    actions = ["redrive"]

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[Any]:
        return super().get_queryset(request).filter(status__in=UNRESOLVED)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Whoever may view the request log may view its failed requests (or with this list's own view
        permission)."""
        log = (
            self.admin_site.get_model_admin(ProcessedRequest)
            if self.admin_site.is_registered(ProcessedRequest)
            else None
        )
        by_log = log is not None and log.has_view_permission(request, obj)
        return bool(by_log or super().has_view_permission(request, obj))

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        """The action's permission: ``safeupdates.redrive_failedrequest`` (a superuser has it)."""
        user: Any = request.user
        return bool(user.has_perm(f"{FailedRequest._meta.app_label}.redrive_failedrequest"))

    def get_paginator(
        self, request: HttpRequest, queryset: models.QuerySet[Any], per_page: int, *args: Any, **kwargs: Any
    ) -> RequestLogPaginator:
        return RequestLogPaginator(queryset, per_page, *args, **kwargs)  # counted (up to a bound), never estimated

    @admin.display(description=_("last error"))
    def last_error(self, obj: ProcessedRequest) -> str:
        """Why it failed or was rejected, short (the request's page shows all of it); hidden like its values."""
        return Truncator(self.error_shown(obj)).chars(200)

    @admin.action(
        description=_("Re-drive the selected requests (make them pending and deliver them)"), permissions=["redrive"]
    )
    def redrive(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> None:
        """Re-drive the selected requests of the models the user may change (:func:`safeupdates.jobs.redrive`)."""
        allowed = self._changeable_content_types(request)
        selected = list(queryset.values_list("pk", "kind", "content_type_id"))
        refused = [
            pk
            for pk, kind, content_type_id in selected
            if kind == RequestKind.UPDATE and content_type_id not in allowed
        ]
        not_updates = [pk for pk, kind, _content_type_id in selected if kind != RequestKind.UPDATE]
        chosen = [
            pk for pk, kind, content_type_id in selected if kind == RequestKind.UPDATE and content_type_id in allowed
        ]
        done = jobs.redrive(ProcessedRequest.objects.using(queryset.db).filter(pk__in=chosen))
        if done.requests:
            self.message_user(
                request,
                f"{done.requests} request(s) of {done.records} record(s) made pending again and delivered.",
                messages.SUCCESS,
            )
        # Selected on the page, gone from the list since (re-driven by another click or operator): not listed
        # in the queryset Django hands over, and not re-driven again.
        ticked = set(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))
        gone = 0 if request.POST.get("select_across") == "1" else max(0, len(ticked) - len(selected))
        if done.skipped + gone:
            self.message_user(
                request,
                f"{done.skipped + gone} request(s) not re-driven: no longer failed or rejected.",
                messages.WARNING,
            )
        if refused:
            names = self._model_names(queryset.filter(pk__in=refused))
            self.message_user(
                request, f"{len(refused)} request(s) not re-driven: you may not change {names}.", messages.WARNING
            )
        if not_updates:
            self.message_user(
                request,
                f"{len(not_updates)} request(s) not re-driven: only the update requests of a record are (a task's "
                "or a batch item's row is its own tool's).",
                messages.WARNING,
            )
        for warning in done.warnings:
            self.message_user(request, warning, messages.WARNING)

    def _changeable_content_types(self, request: HttpRequest) -> set[int]:
        """The content types of the models using safeupdates that the user may change."""
        versioned = [m for m in apps.get_models() if issubclass(m, LockVersionMixin) and not m._meta.proxy]
        allowed = [model for model in versioned if may_change(request, model, self.admin_site)]
        return (
            {content_type.pk for content_type in ContentType.objects.get_for_models(*allowed).values()}
            if allowed
            else set()
        )

    @staticmethod
    def _model_names(queryset: models.QuerySet[Any]) -> str:
        ids = set(queryset.values_list("content_type_id", flat=True))
        types = ContentType.objects.filter(pk__in=ids).order_by("app_label", "model")
        return ", ".join(f"{t.app_label}.{t.model}" for t in types) or "their model"
