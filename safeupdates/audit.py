"""The request log as an event log: derive a record's fields from it, and find drift."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models

from safeupdates.guard import concrete_field
from safeupdates.models import LockVersionMixin, ProcessedRequest, RequestKind, RequestStatus

__all__ = ["Drift", "find_drift", "replay"]


def replay(obj: models.Model) -> dict[str, Any]:
    """Return ``{field: value}`` derived from the request log: per field, the newest applied request.

    Only fields whose latest write came through a request are included: the version stored for the
    field in ``obj.field_versions`` must be that request's version (a later ``save()`` or timestamp-mode
    write took the field out of the log's hands). ``obj`` is used as loaded; refresh it first.
    """
    if not isinstance(obj, LockVersionMixin):
        raise TypeError(f"replay() needs a model with LockVersionMixin, got {type(obj).__name__}.")
    content_type = ContentType.objects.db_manager(obj._state.db).get_for_model(obj)
    requests = (
        ProcessedRequest.objects.using(obj._state.db)
        .filter(
            kind=RequestKind.UPDATE,
            content_type=content_type,
            object_id=str(obj.pk),
            status=RequestStatus.APPLIED,
        )
        .order_by("-version")
        .values_list("version", "changes")
    )
    pending_fields = {
        name for name in (obj.field_versions or {}) if name != "*"
    }  # only fields written by versioned updates can come from the log
    derived: dict[str, Any] = {}
    for version, changes in requests.iterator():
        for name, value in changes.items():
            if name in derived or name not in pending_fields:
                continue
            if obj.field_version(name) == version:
                derived[name] = concrete_field(type(obj), name).to_python(value)
            pending_fields.discard(name)
        if not pending_fields:
            break
    return derived


@dataclass(frozen=True)
class Drift:
    """A field whose stored value differs from the value the request log derives."""

    label: str
    pk: Any
    field: str
    stored: Any
    derived: Any


def find_drift(model: type[LockVersionMixin]) -> Iterator[Drift]:
    """Yield every field of ``model``'s rows that differs from :func:`replay` of the request log."""
    content_type = ContentType.objects.get_for_model(model)
    object_ids = (
        ProcessedRequest.objects.filter(
            kind=RequestKind.UPDATE, content_type=content_type, status=RequestStatus.APPLIED
        )
        .values_list("object_id", flat=True)
        .distinct()
    )
    pk_field = model._meta.pk
    assert pk_field is not None
    pks = [pk_field.to_python(object_id) for object_id in object_ids.iterator()]
    for start in range(0, len(pks), 500):
        for obj in model._default_manager.filter(pk__in=pks[start : start + 500]).order_by("pk"):
            for name, derived in replay(obj).items():
                stored = getattr(obj, concrete_field(model, name).attname)
                if stored != derived:
                    yield Drift(model._meta.label, obj.pk, name, stored, derived)
