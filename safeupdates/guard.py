"""The guarded UPDATE: one statement that checks and writes per-field versions atomically.

A field is written only if the version of its own last write is lower than the incoming version; the
version of a field with no entry of its own in ``field_versions`` is the one under ``"*"`` (the last full
``save()``), else 0. Because the check sits in the statement's ``WHERE`` and ``CASE`` expressions, the
database re-evaluates it on the newest row version after waiting for a concurrent writer's lock
(PostgreSQL's READ COMMITTED recheck), so there is no window between check and write.

SQL is built once per model, field set and database vendor, and cached.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models.expressions import RawSQL

from safeupdates import conf
from safeupdates.exceptions import SafeUpdatesError
from safeupdates.internals import prepared_cursor_class
from safeupdates.versions import SEQUENCE_NAME, next_version

SUPPORTED_VENDORS = frozenset({"postgresql", "sqlite"})

#: Key of ``field_versions`` that holds the version of the last full ``save()``: the version of every
#: field that has no entry of its own.
BASE_VERSION_KEY = "*"


@dataclass(frozen=True)
class GuardedUpdate:
    """The SQL of a guarded update of ``fields`` on ``model`` for one database vendor.

    ``sql`` runs ``UPDATE ... WHERE pk = %s AND (any field's guard passes)``. Parameters come from
    :meth:`params`: ``values`` is one ``(db value, version)`` pair per field, in ``fields`` order, so
    that a merged batch can carry a different version per field. In timestamp mode ``sql`` also sets
    ``last_synced_at`` and requires it to be older; :meth:`params` then takes ``synced_at``.
    ``recorded_sql`` (PostgreSQL only) also records the request in the request log, in the same
    statement; it returns the recorded status, or NULL if the request id was already there.
    """

    fields: tuple[str, ...]
    sql: str
    recorded_sql: str | None
    timestamp: bool
    versions_column: str
    vendor: str

    @property
    def sql_returning_versions(self) -> str:
        """``sql`` that also returns the row's new ``field_versions`` (no row: nothing written)."""
        return f"{self.sql} RETURNING {self.versions_column}"

    def load_versions(self, value: Any) -> dict[str, int]:
        """Decode the ``field_versions`` returned by :attr:`sql_returning_versions`."""
        return json.loads(value) if isinstance(value, (str, bytes)) else dict(value)

    def params(
        self, pk: Any, values: Sequence[tuple[Any, int]], synced_at: Any = None, *, lock_version: int | None = None
    ) -> list[Any]:
        """The parameters of :attr:`sql`. ``lock_version`` is the row's new change token where the
        database has no sequence to take it from inside the statement (SQLite); PostgreSQL ignores it."""
        params: list[Any] = []
        for value, version in values:
            params += (version, value)
        for _value, version in values:
            params += (version, version)
        if self.vendor != "postgresql":
            if lock_version is None:
                raise SafeUpdatesError("a guarded update on this database needs the row's new lock_version.")
            params.append(lock_version)
        if self.timestamp:
            params.append(synced_at)
        params.append(pk)
        params += (version for _value, version in values)
        if self.timestamp:
            params.append(synced_at)
        return params

    def recorded_params(
        self,
        pk: Any,
        values: Sequence[tuple[Any, int]],
        *,
        request_id: Any,
        content_type_id: int,
        version: int,
        changes_json: str,
    ) -> list[Any]:
        return [
            *self.params(pk, values),
            request_id,
            request_id,
            content_type_id,
            str(pk),
            version,
            changes_json,
            pk,
            pk,
            request_id,
        ]


@contextmanager
def statement_cursor(connection: BaseDatabaseWrapper) -> Iterator[CursorWrapper]:
    """A cursor for the guarded statements; on PostgreSQL with psycopg 3 they run prepared.

    Django binds parameters on the client, so PostgreSQL parses and plans every execution anew, and
    the recorded statement (an UPDATE and an INSERT in CTEs) spends longer in the planner than in the
    executor. This cursor binds on the server and prepares each statement once per connection
    (psycopg's prepared statement cache); Django still wraps it, so ``connection.execute_wrapper()``
    sees every statement. ``SAFEUPDATES_PREPARED_STATEMENTS = False`` turns this off, for poolers
    without prepared statement support (PgBouncer before 1.21 in transaction mode).
    """
    cursor_class = prepared_cursor_class() if connection.vendor == "postgresql" else None
    # While queries are logged (DEBUG, assertNumQueries), Django's own cursor: the log then shows
    # every statement with its values, which a prepared statement's log entry would not.
    if cursor_class is None or connection.queries_logged or not conf.prepared_statements():
        with connection.cursor() as cursor:
            yield cursor
        return
    # What connection.cursor() does, with our cursor class: health check, connect, thread check, wrap.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.make_cursor(cursor_class(connection.connection)) as cursor:
        yield cursor


def guarded_update(
    model: type[models.Model], fields: Sequence[str], connection: BaseDatabaseWrapper, *, timestamp: bool = False
) -> GuardedUpdate:
    """Return the (cached) guarded update of ``fields`` on ``model`` for ``connection``'s vendor."""
    if connection.vendor not in SUPPORTED_VENDORS:
        raise SafeUpdatesError(
            f"safeupdates supports PostgreSQL and SQLite; database {connection.alias!r} is {connection.vendor}."
        )
    return _build(model, tuple(fields), connection.vendor, timestamp)


def concrete_field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    """The concrete field ``name`` of ``model`` (names were validated before they get here)."""
    return cast("models.Field[Any, Any]", model._meta.get_field(name))


def column(model: type[models.Model], name: str) -> str:
    """The database column of field ``name`` (or ``"pk"``) of ``model``."""
    field = model._meta.pk if name == "pk" else concrete_field(model, name)
    return str(field.column)  # type: ignore[union-attr]


@lru_cache(maxsize=1024)
def _build(model: type[models.Model], fields: tuple[str, ...], vendor: str, timestamp: bool) -> GuardedUpdate:
    from django.db import connections

    # Field names are spliced into JSON keys and paths; they were validated as model fields upstream, and
    # a model field's name is an identifier. Refuse anything else rather than trust that.
    for name in fields:
        if not name.isidentifier():
            raise SafeUpdatesError(f"not a field name: {name!r}")
    # Any connection of the vendor quotes and casts the same way.
    connection = next(c for c in connections.all(initialized_only=False) if c.vendor == vendor)
    qn = connection.ops.quote_name
    # The table that holds the versions (a proxy's concrete table; callers send a child of multi-table
    # inheritance, whose fields live in two tables, to write_if_newer's locked path instead).
    table = qn(versions_model(model)._meta.db_table)
    fv = qn(column(model, "field_versions"))
    lock = qn(column(model, "lock_version"))
    pk_column = qn(column(model, "pk"))

    if vendor == "postgresql":

        def stored(name: str) -> str:
            return f"({fv}->>'{name}')::bigint"
    else:

        def stored(name: str) -> str:
            return f"json_extract({fv}, '$.\"{name}\"')"

    def guard(name: str) -> str:
        return f"COALESCE({stored(name)}, {stored(BASE_VERSION_KEY)}, 0) < %s"

    sets = []
    for name in fields:
        quoted = qn(column(model, name))
        placeholder = "%s"
        if vendor == "postgresql":
            # Explicit cast: a bare parameter in a CASE branch would be typed as text.
            placeholder = f"%s::{concrete_field(model, name).cast_db_type(connection)}"  # type: ignore[attr-defined]
        sets.append(f"{quoted} = CASE WHEN {guard(name)} THEN {placeholder} ELSE {quoted} END")

    if vendor == "postgresql":
        pairs = ", ".join(f"'{name}', CASE WHEN {guard(name)} THEN %s::bigint END" for name in fields)
        sets.append(f"{fv} = {fv} || jsonb_strip_nulls(jsonb_build_object({pairs}))")
        # A change token: a fresh version on every write, even when only an older request won a field,
        # so that no instance loaded before this write can save over it.
        sets.append(f"{lock} = nextval('{SEQUENCE_NAME}')")
    else:
        # A JSON merge patch (json_patch), not json_set: a null in the patch removes a key, so a field
        # that does not pass and has no entry of its own gets none (json_set wrote a JSON null), and
        # one that has an entry keeps it.
        pairs = ", ".join(f"'{name}', CASE WHEN {guard(name)} THEN %s ELSE {stored(name)} END" for name in fields)
        sets.append(f"{fv} = json_patch({fv}, json_object({pairs}))")
        sets.append(f"{lock} = %s")  # a fresh version from the counter, taken before the statement

    where = f"{pk_column} = %s AND ({' OR '.join(guard(name) for name in fields)})"
    if timestamp:
        synced = qn(column(model, "last_synced_at"))
        sets.append(f"{synced} = %s")
        where += f" AND ({synced} IS NULL OR {synced} < %s)"
    sql = f"UPDATE {table} SET {', '.join(sets)} WHERE {where}"

    recorded_sql = None
    if vendor == "postgresql" and not timestamp:
        recorded_sql = _recorded(sql, table, pk_column)
    return GuardedUpdate(
        fields=fields, sql=sql, recorded_sql=recorded_sql, timestamp=timestamp, versions_column=fv, vendor=vendor
    )


def _recorded(update_sql: str, table: str, pk_column: str) -> str:
    """Wrap ``update_sql`` so that it also records the request, in one statement and one round trip.

    The update runs only if the request id is not in the log yet. A concurrent duplicate that passed
    that test too waits for the first one's row lock, then fails the per-field guard on the recheck
    (the first one wrote exactly its versions), and its INSERT hits the unique request id: it writes
    nothing and returns NULL.
    """
    from django.db import connection

    from safeupdates.models import ProcessedRequest

    log = connection.ops.quote_name(ProcessedRequest._meta.db_table)
    # No ON CONFLICT DO NOTHING: a concurrent call with the same request id passed the NOT EXISTS tests on
    # the same snapshot, and may have written its row already. Its INSERT must fail, so that the whole
    # statement (and with it that write) is undone; the caller then takes the claiming path.
    return (
        f"WITH upd AS ({update_sql} AND NOT EXISTS "
        f"(SELECT 1 FROM {log} WHERE request_id = %s) RETURNING 1), "
        f"ins AS (INSERT INTO {log} (kind, key, request_id, content_type_id, object_id, version, changes, "
        f"status, error, attempts, queue, created_at, processed_at) "
        f"SELECT 'update', '', %s, %s, %s, %s, %s::jsonb, "
        f"CASE WHEN EXISTS (SELECT 1 FROM upd) THEN 'applied' "
        f"WHEN EXISTS (SELECT 1 FROM {table} WHERE {pk_column} = %s) THEN 'stale' ELSE 'rejected' END, "
        f"CASE WHEN EXISTS (SELECT 1 FROM upd) OR EXISTS (SELECT 1 FROM {table} WHERE {pk_column} = %s) "
        f"THEN '' ELSE 'the target object does not exist' END, 1, '', now(), now() "
        f"WHERE NOT EXISTS (SELECT 1 FROM {log} WHERE request_id = %s) RETURNING status) "
        f"SELECT (SELECT status FROM ins)"
    )


def versions_model(model: type[models.Model]) -> type[models.Model]:
    """The concrete model whose table holds ``lock_version`` and ``field_versions``.

    ``model`` itself, its concrete model for a proxy, and the parent that inherits the mixin for a child
    of multi-table inheritance.
    """
    return cast("type[models.Model]", concrete_field(model, "lock_version").model._meta.concrete_model)


def spans_tables(model: type[models.Model]) -> bool:
    """True for a child of multi-table inheritance: its fields live in more than one table."""
    return model._meta.concrete_model is not versions_model(model)


def stored_version(versions: dict[str, Any] | None, name: str) -> int:
    """The version of field ``name``'s last write in a ``field_versions`` map, as the guards read it.

    A field's own entry, else ``"*"`` (the last full save), else 0. A JSON null (written on SQLite by
    earlier releases) counts as no entry.
    """
    versions = versions or {}
    for key in (name, BASE_VERSION_KEY):
        if versions.get(key) is not None:
            return int(versions[key])
    return 0


def write_if_newer(
    model: type[models.Model],
    pk: Any,
    values: dict[str, tuple[Any, int]],
    connection: BaseDatabaseWrapper,
    *,
    synced_at: Any = None,
) -> dict[str, int] | None:
    """Write ``values`` (``{field: (python value, version)}``) to row ``pk`` where each is newer.

    Returns ``{field: version}`` of the fields written, or None if nothing was (every field held a
    newer write, the timestamp was not newer, or there is no such row: ask the table which). Moves
    ``lock_version`` to a fresh version whenever anything is written. One statement where the model's
    fields live in one table; for a child of multi-table inheritance the rows are locked first, the
    guards decided on the locked versions, then each table written. Run it in a transaction.
    """
    if spans_tables(model):
        return _write_across_tables(model, pk, values, connection, synced_at=synced_at)
    fields = tuple(sorted(values))
    statement = guarded_update(model, fields, connection, timestamp=synced_at is not None)
    params = [
        (concrete_field(model, name).get_db_prep_save(values[name][0], connection), values[name][1]) for name in fields
    ]
    lock_version = None if connection.vendor == "postgresql" else next_version(connection.alias)
    with statement_cursor(connection) as cursor:
        cursor.execute(
            statement.sql_returning_versions, statement.params(pk, params, synced_at, lock_version=lock_version)
        )
        row = cursor.fetchone()
    if row is None:
        return None
    stored = statement.load_versions(row[0])
    # A field was written by us iff it now carries exactly our version: versions are unique.
    return {name: version for name, (_value, version) in values.items() if stored.get(name) == version} or None


def _write_across_tables(
    model: type[models.Model],
    pk: Any,
    values: dict[str, tuple[Any, int]],
    connection: BaseDatabaseWrapper,
    *,
    synced_at: Any = None,
) -> dict[str, int] | None:
    """:func:`write_if_newer` for a child of multi-table inheritance: lock, decide, then write each table.

    The child's manager joins the parent table, so the row lock covers both tables and a missing child
    row (a parent that is not of this model) is never written.
    """
    alias = connection.alias
    names = ["field_versions", *(["last_synced_at"] if synced_at is not None else [])]
    locked = model._base_manager.using(alias).select_for_update(no_key=True).filter(pk=pk).values_list(*names).first()
    if locked is None:
        return None
    if synced_at is not None and locked[1] is not None and not locked[1] < synced_at:
        return None
    current = locked[0]
    written = {name: version for name, (_value, version) in values.items() if stored_version(current, name) < version}
    if not written:
        return None
    changes = {name: values[name][0] for name in written}
    changes.update(field_versions={**(current or {}), **written}, lock_version=_next_version_expression(connection))
    if synced_at is not None:
        changes["last_synced_at"] = synced_at
    # One UPDATE per table, each through the model that owns the table.
    by_table: dict[type[models.Model], dict[str, Any]] = {}
    for name, value in changes.items():
        owner = concrete_field(model, name).model._meta.concrete_model
        assert owner is not None
        by_table.setdefault(owner, {})[name] = value
    for table_model, columns in by_table.items():
        table_model._base_manager.using(alias).filter(pk=pk).update(**columns)
    return written


def _next_version_expression(connection: BaseDatabaseWrapper) -> Any:
    """A fresh version as a value of an ORM ``update()``: taken in the statement where the database can."""
    if connection.vendor == "postgresql":
        return RawSQL(f"nextval('{SEQUENCE_NAME}')", [], output_field=models.BigIntegerField())
    return next_version(connection.alias)


#: The WITH clause that a save()'s UPDATE starts with on PostgreSQL: one fresh version for the statement.
#: A CTE referenced twice is evaluated once, and only when first read: a row that does not match (a
#: stale save) takes no version.
SAVE_VERSION_CTE = f"WITH safeupdates_save AS MATERIALIZED (SELECT nextval('{SEQUENCE_NAME}') AS v)"
_SAVE_VERSION = "(SELECT v FROM safeupdates_save)"


def saved_versions(
    connection: BaseDatabaseWrapper, field: models.Field[Any, Any], names: Sequence[str] | None, version: int | None
) -> tuple[Any, Any]:
    """The values of ``lock_version`` and ``field_versions`` in the UPDATE of a ``save()``.

    ``names`` are the fields of ``update_fields`` (None: a full save, every field under ``"*"``); their
    entries are merged into the row's map in the statement, never written from the instance's copy.
    ``version`` None (PostgreSQL): the statement takes the version itself, from
    :data:`SAVE_VERSION_CTE`, which the caller puts in front of it, so that a save is one round trip;
    ``lock_version`` and the fields' entries get the same version.
    """
    column = connection.ops.quote_name(field.column)
    postgresql = connection.vendor == "postgresql"
    if version is None:
        lock: Any = RawSQL(_SAVE_VERSION, [], output_field=models.BigIntegerField())
        value = _SAVE_VERSION
    else:
        lock, value = version, "%s"
    names = [BASE_VERSION_KEY] if names is None else list(names)
    params: list[Any] = []
    for name in names:
        params += [name] if version is None else [name, version]
    if postgresql:
        pairs = ", ".join(f"%s::text, {value}" for _name in names)
        patch = f"jsonb_build_object({pairs})"
    else:
        pairs = ", ".join(f"%s, {value}" for _name in names)
        patch = f"json_object({pairs})"
    if names == [BASE_VERSION_KEY]:
        return lock, RawSQL(patch, params, output_field=field)  # a full save: every field at this version
    if postgresql:
        return lock, RawSQL(f"COALESCE({column}, '{{}}'::jsonb) || {patch}", params, output_field=field)
    return lock, RawSQL(f"json_patch(COALESCE({column}, '{{}}'), {patch})", params, output_field=field)
