"""The request log as an event log: derive a record's fields from it, and find drift."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, connections, models, router, transaction
from django.db.models import Value
from django.db.models.functions import Cast

from safeupdates.database import statements
from safeupdates.database.cursors import fetch_all
from safeupdates.database.registry import concrete_field
from safeupdates.models import LockVersionMixin

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
    object_id = str(obj.pk)
    return _derived(type(obj), {object_id: obj.field_versions}, using).get(object_id, {})


def _derived(model: type[models.Model], versions: dict[str, Any], using: str) -> dict[str, dict[str, Any]]:
    """:func:`replay` of the records whose ``field_versions`` are ``versions`` (by object id), on database
    ``using``, in one query: per record and field with a version of its own, the value of the applied
    request at that version (a version is handed out once: it names the request that wrote the field
    last). Records the log derives nothing of are left out."""
    fields = {field.name: field for field in model._meta.concrete_fields}
    wanted = [
        (object_id, name, version)
        for object_id, field_versions in versions.items()
        if isinstance(field_versions, dict)
        for name, version in field_versions.items()
        # A field's own entry (not "*", the last full save's); a JSON null is no entry.
        if name in fields and isinstance(version, int) and not isinstance(version, bool)
    ]
    if not wanted:
        return {}
    connection = connections[using]
    statement = statements.applied_values(connection.vendor)
    content_type = ContentType.objects.db_manager(using).get_for_model(model)
    rows = statement.rows(fetch_all(connection, statement.sql, statement.params(content_type.pk, wanted)))
    derived: dict[str, dict[str, Any]] = {}
    for object_id, name, value in rows:
        derived.setdefault(object_id, {})[name] = fields[name].to_python(value)
    return derived


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
    pk_field = model._meta.pk
    assert pk_field is not None
    # Rows as tuples, not instances: most of a pass is reading them.
    columns = [field.attname for field in model._meta.concrete_fields]
    pk_at, versions_at = columns.index(pk_field.attname), columns.index("field_versions")
    rows = model._base_manager.db_manager(using).order_by("pk").values_list(*columns)
    checked = 0
    while True:
        batch = list((rows if after is None else rows.filter(pk__gt=after))[:batch_size])
        if not batch:
            return
        by_id = {str(row[pk_at]): row for row in batch}
        derived = _derived(model, {object_id: row[versions_at] for object_id, row in by_id.items()}, using)
        for object_id, values in derived.items():
            row = by_id[object_id]
            for name, value in values.items():
                field = concrete_field(model, name)
                stored = row[columns.index(field.attname)]
                if stored != value and stored != _as_stored(model, row[pk_at], using, field, value):
                    yield Drift(model._meta.label, row[pk_at], name, stored, value)
        checked += len(batch)
        after = batch[-1][pk_at]
        if progress is not None:
            progress(checked, after)


def _as_stored(model: type[models.Model], pk: Any, using: str, field: models.Field[Any, Any], value: Any) -> Any:
    """``value`` as the database stores it in ``field``'s column and Django reads it back.

    The request log keeps a value as it was requested; the column may hold something else that is no
    drift: PostgreSQL reads a naive datetime in the session's time zone (a local time in a daylight
    saving gap moves by an hour) and stores an aware one converted, Django makes a naive datetime aware
    under ``USE_TZ``, a decimal is rounded to its places. The database itself says what it makes of the
    value: PostgreSQL through a cast to the column's type; SQLite stores what Django adapted, unchanged.
    """
    expression: Any = Value(value, output_field=field)
    if connections[using].vendor == "postgresql":
        expression = Cast(expression, output_field=field)
    query = (
        model._base_manager.using(using)
        .filter(pk=pk)
        .annotate(_safeupdates_as_stored=expression)
        .values_list("_safeupdates_as_stored", flat=True)
    )
    try:
        # A savepoint: a value the database refuses must not break the caller's transaction.
        with transaction.atomic(using=using):
            return query.first()
    except (DatabaseError, TypeError, ValueError):
        return value  # the column cannot hold it: compare as logged (it differs from what is stored)
