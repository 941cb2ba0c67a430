"""What the write path needs to know about a model, without importing the models that use it.

Field and column lookups, the table that holds a model's versions, the request log model, and the model
of a content type, found through Django's app registry (as ``get_user_model()`` does): the mixins in
:mod:`safeupdates.write.mixins` import the write path, so the write path must not import them back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django.apps import apps
from django.core.signals import setting_changed
from django.db import models
from django.dispatch import receiver

if TYPE_CHECKING:
    from django.contrib.contenttypes.models import ContentType

    from safeupdates.models import ProcessedRequest, VersionCounter, WaitingMessage


def concrete_field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    """The concrete field ``name`` of ``model`` (names were validated before they get here)."""
    return cast("models.Field[Any, Any]", model._meta.get_field(name))


def column(model: type[models.Model], name: str) -> str:
    """The database column of field ``name`` (or ``"pk"``) of ``model``."""
    field = model._meta.pk if name == "pk" else concrete_field(model, name)
    return str(field.column)  # type: ignore[union-attr]


def versions_model(model: type[models.Model]) -> type[models.Model]:
    """The concrete model whose table holds ``lock_version`` and ``field_versions``.

    ``model`` itself, its concrete model for a proxy, and the parent that inherits the mixin for a child
    of multi-table inheritance.
    """
    try:
        return _versions_models[model]
    except KeyError:
        found = _versions_models[model] = cast(
            "type[models.Model]", concrete_field(model, "lock_version").model._meta.concrete_model
        )
        return found


#: :func:`versions_model` of each model asked about (a model without ``lock_version`` is not kept: it
#: raises again).
_versions_models: dict[type[models.Model], type[models.Model]] = {}


#: :func:`spans_tables` of each model asked about: a model's inheritance does not change.
_spans_tables: dict[type[models.Model], bool] = {}


def spans_tables(model: type[models.Model]) -> bool:
    """True for a child of multi-table inheritance: its fields live in more than one table."""
    try:
        return _spans_tables[model]
    except KeyError:
        spans = _spans_tables[model] = model._meta.concrete_model is not versions_model(model)
        return spans


def holds_versions(model: type[models.Model]) -> bool:
    """True if ``model`` has the versions of ``LockVersionMixin`` (``lock_version`` and ``field_versions``)."""
    # A marker that LockVersionMixin sets, rather than issubclass(): that would import the mixin back.
    return bool(getattr(model, "_safeupdates_versioned", False))


#: The request log model once looked up: the write path asks for it on every call, and the app
#: registry's look-up is a few frames deep. Forgotten when ``INSTALLED_APPS`` changes (:func:`_forget`).
_request_log: list[type[ProcessedRequest]] = []


def request_log() -> type[ProcessedRequest]:
    """The request log model, :class:`safeupdates.models.ProcessedRequest` (looked up once per process)."""
    if _request_log:
        return _request_log[0]
    model = cast("type[ProcessedRequest]", apps.get_model("safeupdates", "ProcessedRequest"))  # type: ignore[redundant-cast]
    _request_log.append(model)
    return model


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    """An ``override_settings(INSTALLED_APPS=...)`` (or its end) rebuilds the app registry: look again."""
    if setting == "INSTALLED_APPS":
        _request_log.clear()


def waiting_messages() -> type[WaitingMessage]:
    """The table of records whose apply message waits (Celery), :class:`safeupdates.models.WaitingMessage`."""
    return cast("type[WaitingMessage]", apps.get_model("safeupdates", "WaitingMessage"))  # type: ignore[redundant-cast]


def version_counter() -> type[VersionCounter]:
    """The version counter model of databases without sequences, :class:`safeupdates.models.VersionCounter`."""
    return cast("type[VersionCounter]", apps.get_model("safeupdates", "VersionCounter"))  # type: ignore[redundant-cast]


#: ``ContentType.objects.db_manager(alias)`` of each database alias, made once: a copy of the manager
#: that shares its cache (``ContentType.objects.clear_cache()`` empties it for all of them).
_content_type_managers: dict[str, Any] = {}


def content_type_of(model: type[models.Model], using: str) -> ContentType:
    """The ``ContentType`` of ``model`` on database ``using`` (from Django's cache once read)."""
    try:
        manager = _content_type_managers[using]
    except KeyError:
        from django.contrib.contenttypes.models import ContentType

        manager = _content_type_managers[using] = ContentType.objects.db_manager(using)
    return cast("ContentType", manager.get_for_model(model))


def model_of(content_type_id: int | None, using: str) -> type[models.Model] | None:
    """The model of content type ``content_type_id`` on database ``using`` (from Django's cache once read);
    None if there is none, the content type is gone, or its model is (an app removed since)."""
    if content_type_id is None:
        return None
    from django.contrib.contenttypes.models import ContentType

    try:
        return ContentType.objects.db_manager(using).get_for_id(content_type_id).model_class()
    except ContentType.DoesNotExist:
        return None
