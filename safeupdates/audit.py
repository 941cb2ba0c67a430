"""The request log as an event log: derive a record's fields from it, and find drift."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, connections, models, transaction
from django.db.models import Value
from django.db.models.functions import Cast

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
                field = concrete_field(model, name)
                stored = getattr(obj, field.attname)
                if stored != derived and stored != _as_stored(obj, field, derived):
                    yield Drift(model._meta.label, obj.pk, name, stored, derived)


def _as_stored(obj: models.Model, field: models.Field[Any, Any], value: Any) -> Any:
    """``value`` as the database stores it in ``field``'s column and Django reads it back.

    The request log keeps a value as it was requested; the column may hold something else that is no
    drift: PostgreSQL reads a naive datetime in the session's time zone (a local time in a daylight
    saving gap moves by an hour) and stores an aware one converted, Django makes a naive datetime aware
    under ``USE_TZ``, a decimal is rounded to its places. The database itself says what it makes of the
    value: PostgreSQL through a cast to the column's type; SQLite stores what Django adapted, unchanged.
    """
    using = obj._state.db or "default"
    expression: Any = Value(value, output_field=field)
    if connections[using].vendor == "postgresql":
        expression = Cast(expression, output_field=field)
    query = (
        type(obj)
        ._default_manager.using(using)
        .filter(pk=obj.pk)
        .annotate(_safeupdates_as_stored=expression)
        .values_list("_safeupdates_as_stored", flat=True)
    )
    try:
        # A savepoint: a value the database refuses must not break the caller's transaction.
        with transaction.atomic(using=using):
            return query.first()
    except (DatabaseError, TypeError, ValueError):
        return value  # the column cannot hold it: compare as logged (it differs from what is stored)
