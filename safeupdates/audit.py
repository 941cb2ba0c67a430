"""The request log as an event log: derive a record's fields from it, and find drift."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, connections, models, router, transaction
from django.db.models import Value
from django.db.models.functions import Cast

from safeupdates import statements
from safeupdates.guard import concrete_field
from safeupdates.models import LockVersionMixin
from safeupdates.statements import stored_version

__all__ = ["Drift", "find_drift", "replay"]


def replay(obj: models.Model) -> dict[str, Any]:
    """Return ``{field: value}`` derived from the request log: per field, the newest applied request.

    Only fields whose latest write came through a request are included: the version stored for the
    field in ``obj.field_versions`` must be that request's version (a later ``save()`` or timestamp-mode
    write took the field out of the log's hands). ``obj`` is used as loaded; refresh it first.
    """
    if not isinstance(obj, LockVersionMixin):
        raise TypeError(f"replay() needs a model with LockVersionMixin, got {type(obj).__name__}.")
    using = obj._state.db or router.db_for_read(type(obj), instance=obj)
    return next(_replayed(type(obj), [obj], using), (obj, {}))[1]


def _replayed(
    model: type[models.Model], objs: Sequence[models.Model], using: str
) -> Iterator[tuple[models.Model, dict[str, Any]]]:
    """:func:`replay` of each of ``objs`` (of ``model``, on database ``using``) that the log derives any
    field of, in one query: per record and field, the newest applied request that changed the field."""
    connection = connections[using]
    content_type = ContentType.objects.db_manager(using).get_for_model(model)
    by_id = {str(obj.pk): obj for obj in objs}
    if connection.vendor == "postgresql":
        object_ids: Any = list(by_id)
    else:
        object_ids = json.dumps(list(by_id))
    fields = {field.name: field for field in model._meta.concrete_fields}
    derived: dict[str, dict[str, Any]] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            statements.newest_applied(connection.vendor), {"content_type": content_type.pk, "object_ids": object_ids}
        )
        for object_id, name, version, value in cursor.fetchall():
            obj = by_id[object_id]
            versions = obj.field_versions or {}  # type: ignore[attr-defined]
            # Its own entry, at this request's version: the field's latest write is this request's.
            if name not in fields or name not in versions or stored_version(versions, name) != version:
                continue
            # JSON text: on PostgreSQL the value (Django reads jsonb undecoded), on SQLite the whole changes.
            value = json.loads(value) if connection.vendor == "postgresql" else json.loads(value)[name]
            derived.setdefault(object_id, {})[name] = fields[name].to_python(value)
    for object_id, values in derived.items():
        yield by_id[object_id], values


@dataclass(frozen=True)
class Drift:
    """A field whose stored value differs from the value the request log derives."""

    label: str
    pk: Any
    field: str
    stored: Any
    derived: Any


#: Records per batch of :func:`find_drift`: one query of the records, one of their requests.
BATCH_SIZE = 1000


def find_drift(
    model: type[LockVersionMixin],
    *,
    using: str | None = None,
    after: Any = None,
    batch_size: int = BATCH_SIZE,
    progress: Callable[[int, Any], None] | None = None,
) -> Iterator[Drift]:
    """Yield every field of ``model``'s rows that differs from :func:`replay` of the request log.

    The rows are read in primary key order, ``batch_size`` at a time, each batch with its records'
    requests in one query, so memory stays flat however large the table and the log. ``after`` starts
    after that primary key (to resume a pass). ``progress(records checked so far, last pk)`` is called
    after each batch. ``using``: the database of the rows and of their requests (default: where the
    router writes ``model``; a replica may lag behind its primary).
    """
    using = using or router.db_for_write(model)
    rows = model._default_manager.db_manager(using).order_by("pk")
    checked = 0
    while True:
        batch = list((rows if after is None else rows.filter(pk__gt=after))[:batch_size])
        if not batch:
            return
        for obj, values in _replayed(model, batch, using):
            for name, derived in values.items():
                field = concrete_field(model, name)
                stored = getattr(obj, field.attname)
                if stored != derived and stored != _as_stored(obj, field, derived):
                    yield Drift(model._meta.label, obj.pk, name, stored, derived)
        checked += len(batch)
        after = batch[-1].pk
        if progress is not None:
            progress(checked, after)


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
