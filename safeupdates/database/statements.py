"""Every hand-written SQL statement of safeupdates, per database vendor, each with its parameters.

The ORM writes everything else. What is here could not be said through it in one statement: the
guarded UPDATE that checks and writes per-field versions atomically (alone, and with the request log
in one round trip), the bulk write, the pending INSERT of ``enqueue_update()``, the save()'s versions,
the version sequence, the database's clock, scoped lock timeouts, the request log's maintenance (the
purge's batches, the verify pass's lookup) and the Celery delivery's note of a waiting message. Each
statement is built next to the code that builds its parameters; the guarded statements use named
parameters, so that no list has to follow the order of the placeholders in a text built elsewhere.
``tests/test_layout.py`` checks that no other module holds SQL.

The stored version of a field is one rule, kept here twice, side by side: :func:`stored_version` in
Python and :func:`stored_version_sql` in SQL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, NamedTuple

from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.expressions import RawSQL

from safeupdates.database.registry import column, concrete_field, request_log, versions_model, waiting_messages
from safeupdates.exceptions import SafeUpdatesError

SUPPORTED_VENDORS = frozenset({"postgresql", "sqlite"})

#: The PostgreSQL sequence that hands out versions (created by the app's migration).
SEQUENCE_NAME = "safeupdates_version_seq"

#: Key of ``field_versions`` that holds the version of the last full ``save()``: the version of every
#: field that has no entry of its own.
BASE_VERSION_KEY = "*"


def vendor_connection(vendor: str) -> BaseDatabaseWrapper:
    """Any connection of ``vendor``: they all quote and cast the same way (none is opened)."""
    return next(c for c in connections.all(initialized_only=False) if c.vendor == vendor)


# --- The stored version of a field: one rule, in Python and in SQL ------------------------------------


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


def stored_version_sql(vendor: str, versions_column: str, name: str) -> str:
    """:func:`stored_version` in SQL: the version of field ``name`` in the (quoted) ``versions_column``."""
    return f"COALESCE({_entry(vendor, versions_column, name)}, {_entry(vendor, versions_column, BASE_VERSION_KEY)}, 0)"


def _entry(vendor: str, versions_column: str, key: str) -> str:
    """The entry ``key`` of a ``field_versions`` map as a number, NULL if there is none."""
    if vendor == "postgresql":
        return f"({versions_column}->>'{key}')::bigint"
    return f"json_extract({versions_column}, '$.\"{key}\"')"


# --- The version source --------------------------------------------------------------------------------

NEXTVAL = f"SELECT nextval('{SEQUENCE_NAME}')"
LAST_VALUE = f"SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {SEQUENCE_NAME}"


def sequence_exists() -> tuple[str, list[Any]]:
    """One row: the sequence's regclass, NULL once ``migrate safeupdates zero`` dropped it."""
    return "SELECT to_regclass(%s)", [SEQUENCE_NAME]


def raise_sequence(floor: int) -> tuple[str, list[Any]]:
    """Move the sequence up to ``floor``, never down."""
    return f"SELECT setval('{SEQUENCE_NAME}', GREATEST(%s, (SELECT last_value FROM {SEQUENCE_NAME})))", [floor]


def next_version_expression() -> RawSQL:
    """A fresh version as a value of an ORM ``update()``, taken inside the statement (PostgreSQL)."""
    return RawSQL(f"nextval('{SEQUENCE_NAME}')", [], output_field=models.BigIntegerField())


# --- The database's clock and scoped lock timeouts -------------------------------------------------------

CURRENT_TIMESTAMP = "SELECT CURRENT_TIMESTAMP"
#: SQLite's CURRENT_TIMESTAMP has whole seconds; this has the milliseconds of the timestamps ``Now()`` stores.
SQLITE_NOW = "SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'NOW')"

# --- Replication, as the primary sees it (the status) ----------------------------------------------------

#: Whether this server is a standby; its ``synchronous_standby_names`` and this session's
#: ``synchronous_commit``; and its physical standbys: how many stream from it, how many of them are
#: synchronous (``sync``, or ``quorum`` under ``ANY n (...)``), and how many it does not show the state of
#: (a user without ``pg_monitor`` sees the rows of ``pg_stat_replication``, not their columns). Base
#: backups (``state = 'backup'``) and logical replication's walsenders (change data capture: no standby
#: to fail over to) are not standbys.
REPLICATION = """
WITH standbys AS (
    SELECT sync_state
    FROM pg_stat_replication
    WHERE state IS DISTINCT FROM 'backup'
      AND pid NOT IN (
          SELECT active_pid FROM pg_replication_slots WHERE slot_type = 'logical' AND active_pid IS NOT NULL
      )
)
SELECT pg_is_in_recovery(),
       current_setting('synchronous_standby_names'),
       current_setting('synchronous_commit'),
       count(*),
       count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')),
       count(*) FILTER (WHERE sync_state IS NULL)
FROM standbys
"""


@dataclass(frozen=True)
class _LockTimeout:
    """PostgreSQL: read, set for the transaction (``SET LOCAL``) and put back ``lock_timeout``."""

    current: str = "SELECT current_setting('lock_timeout')"

    @staticmethod
    def set_local(name: str, milliseconds: int) -> str:
        # SET takes no parameters: the value is an int, the name one of ours.
        return f"SET LOCAL {name} = {int(milliseconds)}"

    @staticmethod
    def restore(previous: str) -> tuple[str, list[Any]]:
        return "SELECT set_config('lock_timeout', %s, true)", [previous]


lock_timeout = _LockTimeout()


# --- save(), create() and delete() of a LockVersionMixin -------------------------------------------------

#: The WITH clause that a save()'s UPDATE or INSERT starts with on PostgreSQL: one fresh version for the
#: statement. A CTE referenced twice is evaluated once, and only when first read: a row that does not
#: match (a stale save) takes no version.
SAVE_VERSION_CTE = f"WITH safeupdates_save AS MATERIALIZED (SELECT nextval('{SEQUENCE_NAME}') AS v)"
_SAVE_VERSION = "(SELECT v FROM safeupdates_save)"


class SaveTable(NamedTuple):
    """The table that holds a model's versions, as the statements that write it name it.

    Those statements are cached by this and by the columns they write, never by the model class: a
    model whose ``db_table`` or columns change at run time (a tenant's schema, a test) gets statements
    of its own.
    """

    vendor: str
    table: str
    pk: str
    lock_version: str
    field_versions: str

    @classmethod
    def of(cls, model: type[models.Model], vendor: str) -> SaveTable:
        """The table that holds ``model``'s versions (its own, a proxy's concrete model's, or a multi-table
        child's parent's), on ``vendor``."""
        if vendor not in SUPPORTED_VENDORS:
            raise SafeUpdatesError(f"safeupdates supports PostgreSQL and SQLite, not {vendor}.")
        target = versions_model(model)
        return cls(
            vendor,
            target._meta.db_table,
            column(target, "pk"),
            column(target, "lock_version"),
            column(target, "field_versions"),
        )


class ChildTable(NamedTuple):
    """A multi-table child's table, as :func:`checked_save` writes it beside its parent's versions."""

    table: str
    pk: str  # its parent link, which holds the parent's primary key

    @classmethod
    def of(cls, model: type[models.Model]) -> ChildTable:
        return cls(model._meta.db_table, column(model, "pk"))


def _saved_versions_sql(vendor: str, versions_column: str, keys: Sequence[str], version: str, full: bool) -> str:
    """The new value of (quoted) ``versions_column`` after a save, as SQL.

    ``keys`` are the placeholders of the names written, ``version`` the SQL of their version. A save
    that wrote every field of the row (``full``) writes ``{"*": version}``: every field at this version.
    Any other save merges its fields' entries into the row's map, in the statement, never from the
    instance's copy.
    """
    if vendor == "postgresql":
        patch = f"jsonb_build_object({', '.join(f'{key}::text, {version}' for key in keys)})"
        return patch if full else f"COALESCE({versions_column}, '{{}}'::jsonb) || {patch}"
    patch = f"json_object({', '.join(f'{key}, {version}' for key in keys)})"
    return patch if full else f"json_patch(COALESCE({versions_column}, '{{}}'), {patch})"


def saved_versions(
    connection: BaseDatabaseWrapper, field: models.Field[Any, Any], names: Sequence[str] | None, version: int | None
) -> tuple[Any, Any]:
    """The values of ``lock_version`` and ``field_versions`` in an ORM-compiled UPDATE of a ``save()``.

    For the saves that :class:`CheckedSave` does not take (values that are expressions). ``names`` are
    the fields the save writes, merged into the row's map (None: every field of the row, under
    ``"*"``). ``version`` None (PostgreSQL): the statement takes the version itself, from
    :data:`SAVE_VERSION_CTE`, which the caller puts in front of it; ``lock_version`` and the fields'
    entries get the same version.
    """
    keys = [BASE_VERSION_KEY] if names is None else list(names)
    params: list[Any]
    if version is None:
        lock: Any = RawSQL(_SAVE_VERSION, [], output_field=models.BigIntegerField())
        value, params = _SAVE_VERSION, [*keys]
    else:
        lock, value, params = version, "%s", [p for key in keys for p in (key, version)]
    quoted = connection.ops.quote_name(str(field.column))
    sql = _saved_versions_sql(connection.vendor, quoted, ["%s"] * len(keys), value, names is None)
    return lock, RawSQL(sql, params, output_field=field)


@dataclass(frozen=True)
class CheckedSave:
    """The UPDATE of a ``LockVersionMixin.save()`` of an existing row, for one shape of save.

    ``UPDATE table SET lock_version = <new>, field_versions = <new>, column = %(value0)s, ...
    WHERE pk = %(pk)s AND lock_version IN <%(expected)s> RETURNING lock_version[, field_versions]``

    It matches only a row that still carries a version this instance loaded or wrote. ``expected`` is
    one parameter, an array on PostgreSQL and a JSON list on SQLite, so that the statement stays the
    same however many there are (they add up in a transaction that saves one instance again and
    again). It writes a fresh version: on PostgreSQL taken inside the statement
    (:data:`SAVE_VERSION_CTE`), on SQLite passed in. ``field_versions`` comes back only from a save
    that names its fields (``update_fields``, or the fields of a model that does not hold every field of
    its row), whose entries are merged into the row's map; after a save of the whole row it is
    ``{"*": lock_version}``. The ORM would compile this statement anew on every save; built once per
    shape (:func:`checked_save`) and run prepared, a checked save costs what Django's unchecked one
    does.
    """

    sql: str
    vendor: str
    names: tuple[str, ...] | None  # the fields written, by name; None: every field of the row
    per_field: bool = False  # checked per field (``update_fields``), not per row

    @property
    def returns_versions(self) -> bool:
        """RETURNING ``field_versions`` too: a save that names its fields merged their entries."""
        return self.names is not None

    def params(
        self,
        values: Sequence[Any],
        pk: Any,
        expected: Sequence[int | None],
        version: int | None,
        seen: Sequence[int | None] = (),
    ) -> dict[str, Any]:
        """The statement's parameters: ``values`` as the database takes them, in the order of the
        shape's columns; ``expected`` the versions the row may carry (per row), or ``seen`` the version
        at which the instance read each of ``names`` (per field)."""
        params: dict[str, Any] = {f"value{index}": value for index, value in enumerate(values)}
        params["expected"] = expected_versions(self.vendor, expected)
        if self.per_field:
            # The oldest version it may carry: one the instance read, before any save of its that a
            # rollback undid (a rolled-back save's version stays on the instance, and the row never had it).
            params["read"] = min((v for v in expected if v is not None), default=None)
            params.update({f"seen{index}": value for index, value in enumerate(seen)})
        keys = (BASE_VERSION_KEY,) if self.names is None else self.names
        params.update({f"key{index}": name for index, name in enumerate(keys)})
        params["pk"] = pk
        if version is not None:  # SQLite: taken before; PostgreSQL takes it in the statement
            params["version"] = version
        return params


@lru_cache(maxsize=1024)
def checked_save(
    table: SaveTable,
    columns: tuple[str, ...],
    names: tuple[str, ...] | None,
    child: ChildTable | None = None,
    *,
    per_field: bool = False,
) -> CheckedSave:
    """Return the (cached) :class:`CheckedSave` that writes ``columns`` of ``table`` and the versions of
    the fields ``names`` (None: every field of the row).

    With ``child`` (PostgreSQL), ``columns`` are the child's: a save whose ``update_fields`` names fields
    of a multi-table child only (where Django runs one UPDATE, the child's) checks and writes the
    versions in the parent's row and the fields in the child's, in one statement:
    ``WITH ..., checked AS (UPDATE parent ... RETURNING versions), written AS (UPDATE child ... WHERE
    EXISTS (SELECT 1 FROM checked)) SELECT versions, (SELECT count(*) FROM written) FROM checked``. No
    row: the check failed and nothing was written; a count of 0: the child's row is gone.

    ``per_field`` (a save with ``update_fields``): the row matches if none of ``names`` was written after
    the version the instance read it at (:func:`per_field_check`), whatever else moved on.
    """
    vendor = table.vendor
    takes_version = vendor == "postgresql"  # the statement takes its version (SAVE_VERSION_CTE)
    qn = vendor_connection(vendor).ops.quote_name
    lock, versions = qn(table.lock_version), qn(table.field_versions)
    keys = [f"%(key{index})s" for index in range(1 if names is None else len(names))]
    version = _SAVE_VERSION if takes_version else "%(version)s"
    sets = [
        f"{lock} = {version}",
        f"{versions} = {_saved_versions_sql(vendor, versions, keys, version, names is None)}",
    ]
    written = [f"{qn(name)} = %(value{index})s" for index, name in enumerate(columns)]
    matches = _carries_one_of(vendor, lock)
    if per_field:
        if names is None:
            raise SafeUpdatesError("a save checked per field names its fields.")
        # A version the row carried (it never moves down), or one this instance wrote before a rollback:
        # no lock_version set by hand above the row's gets a save through.
        matches = f"({lock} >= %(read)s OR {matches}) AND {per_field_check(vendor, versions, names)}"
    returning = f"{lock}, {versions}" if names is not None else lock
    where = f"WHERE {qn(table.pk)} = %(pk)s AND {matches}"
    if child is None:
        sql = f"UPDATE {qn(table.table)} SET {', '.join([*sets, *written])} {where} RETURNING {returning}"
        return CheckedSave(f"{SAVE_VERSION_CTE} {sql}" if takes_version else sql, vendor, names, per_field)
    if not takes_version or names is None:
        raise SafeUpdatesError("a child's fields are saved with their parent's versions on PostgreSQL only.")
    sql = (
        f"{SAVE_VERSION_CTE}, "
        f"safeupdates_checked AS (UPDATE {qn(table.table)} SET {', '.join(sets)} {where} RETURNING {returning}), "
        f"safeupdates_written AS (UPDATE {qn(child.table)} SET {', '.join(written)} "
        f"WHERE {qn(child.pk)} = %(pk)s AND EXISTS (SELECT 1 FROM safeupdates_checked) RETURNING 1) "
        f"SELECT {returning}, (SELECT count(*) FROM safeupdates_written) FROM safeupdates_checked"
    )
    return CheckedSave(sql, vendor, names, per_field)


@dataclass(frozen=True)
class VersionedInsert:
    """The INSERT of a new ``LockVersionMixin`` row, with its versions.

    ``[WITH safeupdates_save AS MATERIALIZED (SELECT nextval(...) AS v)] INSERT INTO table (lock_version,
    field_versions, column, ...) VALUES (v, {"*": v}, %(value0)s, ...) [ON CONFLICT (pk) DO NOTHING]
    RETURNING returned..., lock_version``

    One round trip, as Django's own INSERT: PostgreSQL takes the version inside the statement, SQLite
    gets it as ``%(version)s``. The new row's every field is at the version (``"*"``): a request
    allocated before it, for a row re-created under its old primary key, is stale; and a row just
    inserted has no multi-table child yet, whose fields a child's later save writes itself.
    ``unless_exists`` (a new instance that names its primary key) inserts nothing over a row that has
    that key: no row comes back. Columns whose value is the database's default are left out, so that
    the database fills them in. Built once per shape (:func:`versioned_insert`).
    """

    sql: str

    @staticmethod
    def params(values: Sequence[Any], version: int | None) -> dict[str, Any]:
        """``values`` as the database takes them, in the order of the shape's columns; ``version`` the
        row's version where the statement does not take it itself (SQLite)."""
        params: dict[str, Any] = {f"value{index}": value for index, value in enumerate(values)}
        params["key0"] = BASE_VERSION_KEY
        if version is not None:
            params["version"] = version
        return params


@lru_cache(maxsize=1024)
def versioned_insert(
    table: SaveTable, columns: tuple[str, ...], returning: tuple[str, ...], *, unless_exists: bool = False
) -> VersionedInsert:
    """Return the (cached) :class:`VersionedInsert` of ``columns`` into ``table``, returning the columns
    ``returning`` and then ``lock_version``."""
    vendor = table.vendor
    qn = vendor_connection(vendor).ops.quote_name
    lock, versions = qn(table.lock_version), qn(table.field_versions)
    version = _SAVE_VERSION if vendor == "postgresql" else "%(version)s"
    names = [lock, versions, *(qn(name) for name in columns)]
    values = [
        version,
        _saved_versions_sql(vendor, versions, ["%(key0)s"], version, full=True),
        *(f"%(value{index})s" for index in range(len(columns))),
    ]
    conflict = f" ON CONFLICT ({qn(table.pk)}) DO NOTHING" if unless_exists else ""
    sql = (
        f"INSERT INTO {qn(table.table)} ({', '.join(names)}) VALUES ({', '.join(values)}){conflict} "
        f"RETURNING {', '.join([*(qn(name) for name in returning), lock])}"
    )
    if vendor == "postgresql":
        sql = f"{SAVE_VERSION_CTE} {sql}"
    return VersionedInsert(sql)


@lru_cache(maxsize=256)
def checked_delete(table: SaveTable) -> str:
    """``DELETE`` of the row ``%(pk)s`` of ``table`` if it still carries one of the versions
    ``%(expected)s`` (an array on PostgreSQL, a JSON list on SQLite)."""
    qn = vendor_connection(table.vendor).ops.quote_name
    matches = _carries_one_of(table.vendor, qn(table.lock_version))
    return f"DELETE FROM {qn(table.table)} WHERE {qn(table.pk)} = %(pk)s AND {matches}"


def _carries_one_of(vendor: str, lock: str) -> str:
    """The condition that (quoted) ``lock`` is one of the versions of the parameter ``%(expected)s``."""
    if vendor == "postgresql":
        return f"{lock} = ANY(%(expected)s::bigint[])"
    return f"{lock} IN (SELECT value FROM json_each(%(expected)s))"


def per_field_check(vendor: str, versions: str, names: Sequence[str], *, positional: bool = False) -> str:
    """The condition that none of the fields ``names`` was written after the version at which the
    instance read it, the parameter ``%(seen<i>)s`` of the i-th name (``%s`` each, in order, if
    ``positional``): each field's stored version (:func:`stored_version_sql`, a write of every field
    counting for each) against it. ``versions`` is the quoted ``field_versions`` column."""
    return " AND ".join(
        f"{stored_version_sql(vendor, versions, name)} <= {'%s' if positional else f'%(seen{index})s'}"
        for index, name in enumerate(names)
    )


def expected_versions(vendor: str, versions: Sequence[int | None]) -> Any:
    """The versions a row may carry, as the parameter ``%(expected)s`` of a checked save or delete: an
    array on PostgreSQL, a JSON list on SQLite, so that the statement stays the same however many."""
    return list(versions) if vendor == "postgresql" else json.dumps(list(versions))


# --- The guarded UPDATE ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardedUpdate:
    """The guarded update of ``fields`` on a model for one database vendor.

    A field is written only if the version of its own last write is lower than the incoming version.
    Because the check sits in the statement's ``WHERE`` and ``CASE`` expressions, the database
    re-evaluates it on the newest row version after waiting for a concurrent writer's lock
    (PostgreSQL's READ COMMITTED recheck), so there is no window between check and write.

    ``sql`` runs ``UPDATE ... WHERE pk = %(pk)s AND (any field's guard passes)``; its parameters come
    from :meth:`params`, by name: ``values`` is one ``(db value, version)`` pair per field, in ``fields``
    order, so that a merged batch can carry a different version per field. In timestamp mode ``sql``
    also sets ``last_synced_at`` and requires it to be older. ``recorded_sql`` (PostgreSQL only) also
    records the request in the request log, in the same statement (:meth:`recorded_params`); it
    returns the recorded status (NULL if the request id was already there) and the row's new
    ``field_versions`` (NULL if nothing was written). ``claimed_sql`` (PostgreSQL only) is the apply
    job's one statement: it claims a record's pending requests, writes the newest value per field with
    the guard, and records each request's outcome (:meth:`claimed_params`, :func:`_claimed`).
    """

    fields: tuple[str, ...]
    sql: str
    recorded_sql: str | None
    claimed_sql: str | None
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
    ) -> dict[str, Any]:
        """The parameters of :attr:`sql`. ``lock_version`` is the row's new change token where the
        database has no sequence to take it from inside the statement (SQLite); PostgreSQL ignores it."""
        params: dict[str, Any] = {"pk": pk}
        for index, (value, version) in enumerate(values):
            params[f"value{index}"], params[f"version{index}"] = value, version
        if self.vendor != "postgresql":
            if lock_version is None:
                raise SafeUpdatesError("a guarded update on this database needs the row's new lock_version.")
            params["lock_version"] = lock_version
        if self.timestamp:
            params["synced_at"] = synced_at
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
        recorded: Mapping[str, str],
    ) -> dict[str, Any]:
        """The parameters of :attr:`recorded_sql`: those of :attr:`sql`, and the request's. ``recorded``
        holds what the lifecycle records: ``kind``, the statuses ``applied``, ``stale`` and ``missing``,
        and ``missing_error``."""
        return {
            **self.params(pk, values),
            **recorded,
            "request_id": request_id,
            "content_type_id": content_type_id,
            "object_id": str(pk),
            "version": version,
            "changes": changes_json,
        }

    def claimed_params(
        self,
        pk: Any,
        values: Sequence[tuple[Any, int]],
        *,
        requests: Sequence[int],
        winners: Sequence[int],
        recorded: Mapping[str, str],
    ) -> dict[str, Any]:
        """The parameters of :attr:`claimed_sql`: those of :attr:`sql`, the primary keys of the log's
        ``requests`` it claims (all of them, or it changes nothing), and per field (in ``fields`` order)
        the primary key of the request whose value it carries (``winners``). ``recorded`` holds what
        the lifecycle records: the statuses ``pending``, ``applied``, ``stale`` and ``missing``, and
        ``missing_error``."""
        return {
            **self.params(pk, values),
            **{name: recorded[name] for name in ("pending", "applied", "stale", "missing", "missing_error")},
            "requests": list(requests),
            "claimed": len(requests),
            "winners": list(winners),
            "names": list(self.fields),
            "versions": [version for _value, version in values],
        }


class _Shape(NamedTuple):
    """What a guarded or bulk statement says about its model: the table that holds the versions, the
    columns of the fields it writes and their casts (PostgreSQL). Those statements are cached by this,
    never by the model class, so that a model whose ``db_table`` or columns change at run time gets
    statements of its own."""

    table: SaveTable
    pk_cast: str
    fields: tuple[tuple[str, str, str], ...]  # (name, column, cast)
    last_synced_at: str  # the column, in timestamp mode; else ""
    request_log: str


def _shape(
    model: type[models.Model], fields: Sequence[str], vendor: str, *, timestamp: bool = False, pk_cast: bool = False
) -> _Shape:
    """The :class:`_Shape` of a statement writing ``fields`` of ``model``'s versions table on ``vendor``.

    Callers send a child of multi-table inheritance, whose fields live in two tables, to
    write_if_newer's locked path instead.
    """
    # Field names are spliced into JSON keys and paths; they were validated as model fields upstream, and
    # a model field's name is an identifier. Refuse anything else rather than trust that.
    for name in fields:
        if not name.isidentifier():
            raise SafeUpdatesError(f"not a field name: {name!r}")
    connection = vendor_connection(vendor)
    # Explicit casts (PostgreSQL): a bare parameter in a CASE branch or a VALUES list of NULLs would be
    # typed as text.
    casting = vendor == "postgresql"

    def cast(field: Any) -> str:
        return str(field.cast_db_type(connection)) if casting else ""

    return _Shape(
        table=SaveTable.of(model, vendor),
        pk_cast=cast(model._meta.pk) if pk_cast else "",
        fields=tuple((name, column(model, name), cast(concrete_field(model, name))) for name in fields),
        last_synced_at=column(model, "last_synced_at") if timestamp else "",
        request_log=request_log()._meta.db_table,
    )


def guarded_update(
    model: type[models.Model], fields: Sequence[str], connection: BaseDatabaseWrapper, *, timestamp: bool = False
) -> GuardedUpdate:
    """Return the (cached) guarded update of ``fields`` on ``model`` for ``connection``'s vendor."""
    if connection.vendor not in SUPPORTED_VENDORS:
        raise SafeUpdatesError(
            f"safeupdates supports PostgreSQL and SQLite; database {connection.alias!r} is {connection.vendor}."
        )
    fields = tuple(fields)
    # Keyed by what the SQL is made of that can change at run time (the table, the columns), and
    # the class: the shape itself, with its casts, is the key of the statement.
    try:
        columns = tuple(concrete_field(model, name).column for name in fields)
    except Exception:  # not a field: _shape() says so, as it always has
        return _guarded_update(_shape(model, fields, connection.vendor, timestamp=timestamp))
    return _guarded_update_of(model, fields, connection.vendor, timestamp, model._meta.db_table, columns)


@lru_cache(maxsize=1024)
def _guarded_update_of(
    model: type[models.Model],
    fields: tuple[str, ...],
    vendor: str,
    timestamp: bool,
    table: str,  # part of the key
    columns: tuple[str, ...],  # part of the key
) -> GuardedUpdate:
    return _guarded_update(_shape(model, fields, vendor, timestamp=timestamp))


@lru_cache(maxsize=1024)
def _guarded_update(shape: _Shape) -> GuardedUpdate:
    vendor = shape.table.vendor
    qn = vendor_connection(vendor).ops.quote_name
    table = qn(shape.table.table)
    fv = qn(shape.table.field_versions)
    lock = qn(shape.table.lock_version)
    pk_column = qn(shape.table.pk)
    fields = tuple(name for name, _column, _cast in shape.fields)

    def guard(index: int, name: str) -> str:
        return f"{stored_version_sql(vendor, fv, name)} < %(version{index})s"

    sets = []
    for index, (name, field_column, cast) in enumerate(shape.fields):
        quoted = qn(field_column)
        value = f"(%(value{index})s)::{cast}" if cast else f"%(value{index})s"  # (-32768)::smallint
        sets.append(f"{quoted} = CASE WHEN {guard(index, name)} THEN {value} ELSE {quoted} END")
    if vendor == "postgresql":
        pairs = ", ".join(
            f"'{name}', CASE WHEN {guard(index, name)} THEN %(version{index})s::bigint END"
            for index, name in enumerate(fields)
        )
        sets.append(f"{fv} = {fv} || jsonb_strip_nulls(jsonb_build_object({pairs}))")
        # A change token: a fresh version on every write, even when only an older request won a field,
        # so that no instance loaded before this write can save over it.
        sets.append(f"{lock} = nextval('{SEQUENCE_NAME}')")
    else:
        # A JSON merge patch (json_patch), not json_set: a null in the patch removes a key, so a field
        # that does not pass and has no entry of its own gets none (json_set wrote a JSON null), and
        # one that has an entry keeps it.
        pairs = ", ".join(
            f"'{name}', CASE WHEN {guard(index, name)} THEN %(version{index})s ELSE {_entry(vendor, fv, name)} END"
            for index, name in enumerate(fields)
        )
        sets.append(f"{fv} = json_patch({fv}, json_object({pairs}))")
        sets.append(f"{lock} = %(lock_version)s")  # a fresh version from the counter, taken before the statement

    where = f"{pk_column} = %(pk)s AND ({' OR '.join(guard(index, name) for index, name in enumerate(fields))})"
    timestamp = bool(shape.last_synced_at)
    if timestamp:
        synced = qn(shape.last_synced_at)
        sets.append(f"{synced} = %(synced_at)s")
        where += f" AND ({synced} IS NULL OR {synced} < %(synced_at)s)"
    sql = f"UPDATE {table} SET {', '.join(sets)} WHERE {where}"

    recorded_sql = claimed_sql = None
    if vendor == "postgresql" and not timestamp:
        recorded_sql = _recorded(sql, table, pk_column, qn(shape.request_log), fv)
        claimed_sql = _claimed(sql, table, pk_column, qn(shape.request_log), fv)
    return GuardedUpdate(
        fields=fields,
        sql=sql,
        recorded_sql=recorded_sql,
        claimed_sql=claimed_sql,
        timestamp=timestamp,
        versions_column=fv,
        vendor=vendor,
    )


def _recorded(update_sql: str, table: str, pk_column: str, log: str, versions_column: str) -> str:
    """Wrap ``update_sql`` so that it also records the request, in one statement and one round trip.

    The update runs only if the request id is not in the log yet. A concurrent duplicate that passed
    that test too waits for the first one's row lock, then fails the per-field guard on the recheck
    (the first one wrote exactly its versions), and its INSERT hits the unique request id: it writes
    nothing and returns NULL. No ON CONFLICT DO NOTHING: a concurrent call with the same request id
    passed the NOT EXISTS tests on the same snapshot, and may have written its row already. Its INSERT
    must fail, so that the whole statement (and with it that write) is undone; the caller then takes
    the claiming path. The kind, the statuses and the error it records are parameters
    (:meth:`GuardedUpdate.recorded_params`): the request lifecycle (:mod:`safeupdates.lifecycle`) owns
    them. It returns the recorded status and the row's new ``field_versions`` (NULL if nothing was
    written).
    """
    exists = f"EXISTS (SELECT 1 FROM {table} WHERE {pk_column} = %(pk)s)"
    return (
        f"WITH upd AS ({update_sql} AND NOT EXISTS "
        f"(SELECT 1 FROM {log} WHERE request_id = %(request_id)s) RETURNING {versions_column}), "
        f"ins AS (INSERT INTO {log} (kind, key, request_id, content_type_id, object_id, version, changes, "
        f"status, error, attempts, queue, created_at, processed_at) "
        f"SELECT %(kind)s, '', %(request_id)s, %(content_type_id)s, %(object_id)s, %(version)s, %(changes)s::jsonb, "
        f"CASE WHEN EXISTS (SELECT 1 FROM upd) THEN %(applied)s "
        f"WHEN {exists} THEN %(stale)s ELSE %(missing)s END, "
        f"CASE WHEN EXISTS (SELECT 1 FROM upd) OR {exists} "
        f"THEN '' ELSE %(missing_error)s END, 1, '', now(), now() "
        f"WHERE NOT EXISTS (SELECT 1 FROM {log} WHERE request_id = %(request_id)s) RETURNING status) "
        f"SELECT (SELECT status FROM ins), (SELECT {versions_column} FROM upd)"
    )


def _claimed(update_sql: str, table: str, pk_column: str, log: str, versions_column: str) -> str:
    """Wrap ``update_sql`` into the apply job's one statement (PostgreSQL): claim, write, record.

    ``claimed`` locks the record's pending requests that the job read and merged (``SKIP LOCKED``: a
    request that another job holds, or finished since the read, is not claimed). Unless every one of
    them was claimed, nothing is written and nothing recorded (``whole`` is false): the caller then takes
    the path that claims in a transaction of its own. Otherwise the guarded update runs, and each
    claimed request is recorded ``applied`` if it wrote a field (the field now carries the version of
    the request whose value it was given: versions are unique), ``stale`` if not, or ``missing`` (with
    ``missing_error``) if there is no row. One statement is one transaction in autocommit: claim, write
    and outcomes commit together or not at all.

    It returns whether all were claimed, the row's new ``field_versions`` (NULL: nothing written), the
    row's ``field_versions`` before the statement, per recorded request ``[primary key, status, seconds
    from created to processed]`` as JSON, and whether the row exists.
    """
    exists = f"EXISTS (SELECT 1 FROM {table} WHERE {pk_column} = %(pk)s)"
    return (
        f"WITH claimed AS (SELECT id FROM {log} WHERE id = ANY(%(requests)s::bigint[]) AND status = %(pending)s "
        f"FOR UPDATE SKIP LOCKED), "
        f"whole AS (SELECT count(*) = %(claimed)s AS ok FROM claimed), "
        f"upd AS ({update_sql} AND (SELECT ok FROM whole) RETURNING {versions_column}), "
        f"won AS (SELECT w.id FROM upd, unnest(%(winners)s::bigint[], %(names)s::text[], %(versions)s::bigint[]) "
        f"AS w(id, name, version) WHERE (upd.{versions_column} ->> w.name)::bigint = w.version), "
        f"fin AS (UPDATE {log} SET "
        f"status = CASE WHEN id IN (SELECT id FROM won) THEN %(applied)s "
        f"WHEN EXISTS (SELECT 1 FROM upd) OR {exists} THEN %(stale)s ELSE %(missing)s END, "
        f"error = CASE WHEN EXISTS (SELECT 1 FROM upd) OR {exists} THEN '' ELSE %(missing_error)s END, "
        f"attempts = attempts + 1, processed_at = now() "
        f"WHERE id IN (SELECT id FROM claimed) AND (SELECT ok FROM whole) "
        f"RETURNING id, status, EXTRACT(EPOCH FROM now() - created_at) AS seconds) "
        f"SELECT (SELECT ok FROM whole), (SELECT {versions_column} FROM upd), "
        f"(SELECT {versions_column} FROM {table} WHERE {pk_column} = %(pk)s), "
        f"(SELECT json_agg(json_build_array(id, status, seconds)) FROM fin), {exists}"
    )


# --- The bulk write (PostgreSQL) ------------------------------------------------------------------------


@dataclass(frozen=True)
class BulkUpdate:
    """The batch statement of ``fields`` on a model (PostgreSQL): :meth:`sql` for ``rows`` rows, and
    :meth:`row_params`, the parameters of one row of its VALUES list, in the order of :attr:`row`."""

    fields: tuple[str, ...]
    template: str
    row: str

    def sql(self, rows: int) -> str:
        return self.template.format(values=", ".join([self.row] * rows))

    @staticmethod
    def row_params(pk: Any, cells: Sequence[tuple[Any, int] | None]) -> list[Any]:
        """``pk``, then per field ``(db value, version)``, or ``(NULL, NULL)`` where the row has no update."""
        params = [pk]
        for cell in cells:
            params += (None, None) if cell is None else cell
        return params


def bulk_update(model: type[models.Model], fields: tuple[str, ...]) -> BulkUpdate:
    """The batch statement of ``fields`` on ``model``, with a ``{values}`` slot for the VALUES rows.

    The ``locked`` CTE locks the existing rows (in primary key order) and decides each field's guard
    once, on the newest committed row version: ``FOR NO KEY UPDATE`` (the lock an UPDATE takes) waits
    for a concurrent writer and then reads its row, as the UPDATE's own recheck would. The UPDATE
    writes what the guards allow; the outer SELECT returns every existing row with its guard results,
    so that rows that wrote nothing (stale) are told apart from rows that do not exist (missing).
    Guard results come from the locked row, not from comparing versions after the write, so a batch
    run twice reports its second run as stale.
    """
    return _bulk_update(_shape(model, fields, "postgresql", pk_cast=True))


@lru_cache(maxsize=512)
def _bulk_update(shape: _Shape) -> BulkUpdate:
    qn = vendor_connection("postgresql").ops.quote_name
    table = qn(shape.table.table)
    pk = qn(shape.table.pk)
    fv = qn(shape.table.field_versions)
    lock = qn(shape.table.lock_version)
    fields = tuple(name for name, _column, _cast in shape.fields)
    # Field names go into SQL only as JSON keys; the VALUES columns get neutral aliases.
    aliases = [(name, f"f{i}") for i, name in enumerate(fields)]

    # One row of the VALUES list, (pk, value, version, ...): explicit casts type the NULLs too.
    # In parentheses: bound on the client (Django's default), -32768 would be read -(32768::smallint).
    casts = [f"(%s)::{shape.pk_cast}"]
    for _name, _column, cast in shape.fields:
        casts += (f"(%s)::{cast}", "%s::bigint")
    row = f"({', '.join(casts)})"

    columns = ", ".join(["pk", *(f"{a}_value, {a}_version" for _name, a in aliases)])
    selected = [f"t.{pk} AS pk"]
    for name, a in aliases:
        stored = stored_version_sql("postgresql", f"t.{fv}", name)
        selected += [f"v.{a}_value", f"v.{a}_version", f"COALESCE({stored} < v.{a}_version, false) AS {a}_ok"]
    sets = []
    for (_name, field_column, _cast), (_alias_of, a) in zip(shape.fields, aliases, strict=True):
        quoted = qn(field_column)
        sets.append(f"{quoted} = CASE WHEN l.{a}_ok THEN l.{a}_value ELSE t.{quoted} END")
    pairs = ", ".join(f"'{name}', CASE WHEN l.{a}_ok THEN l.{a}_version END" for name, a in aliases)
    sets.append(f"{fv} = t.{fv} || jsonb_strip_nulls(jsonb_build_object({pairs}))")
    # A change token, as in update_if_newer: a fresh version for every row that is written.
    sets.append(f"{lock} = nextval('{SEQUENCE_NAME}')")
    any_ok = " OR ".join(f"l.{a}_ok" for _name, a in aliases)
    flags = ", ".join(f"l.{a}_ok" for _name, a in aliases)
    template = (
        f"WITH v ({columns}) AS (VALUES {{values}}), "
        f"locked AS (SELECT {', '.join(selected)} FROM {table} t JOIN v ON t.{pk} = v.pk "
        f"ORDER BY t.{pk} FOR NO KEY UPDATE OF t), "
        f"written AS (UPDATE {table} t SET {', '.join(sets)} FROM locked l "
        f"WHERE t.{pk} = l.pk AND ({any_ok})) "
        f"SELECT l.pk, {flags} FROM locked l"
    )
    return BulkUpdate(fields=fields, template=template, row=row)


# --- The pending INSERT of enqueue_update() (PostgreSQL) ---------------------------------------------------


@cache
def _insert_pending_sql(kind: str, status: str) -> str:
    # Literals, not parameters: a generic plan of the prepared statement must still see that
    # ``other.status = 'pending'`` is the condition of the safeupdates_pending index.
    for value in (kind, status):
        if not value.isidentifier():
            raise SafeUpdatesError(f"not a request kind or status: {value!r}")
    log = request_log()
    qn = vendor_connection("postgresql").ops.quote_name
    names = ("request_id", "content_type", "object_id", "changes", "queue", "kind", "status", "key", "error")
    columns = ", ".join(qn(column(log, name)) for name in (*names, "attempts", "version"))
    values = (
        "%(request_id)s, %(content_type_id)s, %(object_id)s, %(changes)s, %(queue)s, "
        f"'{kind}', '{status}', '', '', 0, nextval('{SEQUENCE_NAME}')"
    )
    table = qn(log._meta.db_table)
    pk, request_id, content_type, object_id, status_column, version, created_at = (
        qn(column(log, name))
        for name in ("pk", "request_id", "content_type", "object_id", "status", "version", "created_at")
    )
    # Read through the safeupdates_pending index: the record's pending requests, not its history.
    others_pending = (
        f"EXISTS (SELECT 1 FROM {table} other WHERE other.{status_column} = '{status}' "
        f"AND other.{content_type} = new.{content_type} AND other.{object_id} = new.{object_id} "
        f"AND other.{pk} <> new.{pk})"
    )
    return (
        f"INSERT INTO {table} AS new ({columns}) VALUES ({values}) ON CONFLICT ({request_id}) DO NOTHING "
        f"RETURNING new.{pk}, new.{version}, new.{created_at}, {others_pending}"
    )


#: The columns of a pending request that the apply job reads (:func:`pending_of_record`), in order.
PENDING_COLUMNS = ("id", "request_id", "kind", "content_type", "object_id", "version", "changes")


@cache
def pending_of_record(status: str) -> str:
    """The apply job's read (PostgreSQL): up to ``%(limit)s`` requests in ``status`` (pending) of the
    record that request ``%(request_id)s`` targets, oldest version first, without a lock; the columns of
    :data:`PENDING_COLUMNS`. The status is a literal, as in :func:`insert_pending`: a generic plan of the
    prepared statement still reads the safeupdates_pending index."""
    if not status.isidentifier():
        raise SafeUpdatesError(f"not a request status: {status!r}")
    log = request_log()
    qn = vendor_connection("postgresql").ops.quote_name
    table = qn(log._meta.db_table)
    request_id, content_type, object_id, status_column, version = (
        qn(column(log, name)) for name in ("request_id", "content_type", "object_id", "status", "version")
    )
    columns = ", ".join(f"r.{qn(column(log, name))}" for name in PENDING_COLUMNS)
    return (
        f"SELECT {columns} FROM {table} t JOIN {table} r ON r.{content_type} = t.{content_type} "
        f"AND r.{object_id} = t.{object_id} AND r.{status_column} = '{status}' "
        f"WHERE t.{request_id} = %(request_id)s ORDER BY r.{version} LIMIT %(limit)s"
    )


def insert_pending(
    *, request_id: Any, content_type_id: int | None, object_id: str, changes: Any, queue: str, kind: str, status: str
) -> tuple[str, dict[str, Any]]:
    """The INSERT of a new update request (``kind``) in ``status`` (pending) with a fresh version, and
    its parameters.

    The rest of the columns are what a new request always has: no key, no error, no attempts;
    ``created_at`` (the database's clock) and ``processed_at`` (NULL) keep their column defaults. A known
    request id is skipped (``ON CONFLICT DO NOTHING``): no row comes back. The row that comes back is
    ``(pk, version, created_at, others_pending)``: whether other requests of the record are in ``status``.
    """
    params = {
        "request_id": request_id,
        "content_type_id": content_type_id,
        "object_id": object_id,
        "changes": changes,
        "queue": queue,
    }
    return _insert_pending_sql(kind, status), params


# --- The request-log admin ----------------------------------------------------------------------------

#: PostgreSQL's estimate of a table's rows, from its statistics (``reltuples``: -1 before the table was
#: first vacuumed or analyzed). ``%s`` is the table's quoted name.
ESTIMATED_ROWS = "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)"


# --- Maintenance of the request log: the purge's batches and the verify pass --------------------------


@dataclass(frozen=True)
class PurgeBatch:
    """One batch of ``safeupdates_purge``: up to ``%(limit)s`` rows of the request log that match its
    condition (terminal, older than ``%(cutoff)s``), in keyset order, deleted.

    PostgreSQL: one statement, :attr:`first` or (after the keyset ``%(after0)s, ...`` of the last row
    of the batch before) :attr:`after`. It locks the batch's rows with ``SKIP LOCKED`` (a row that
    another transaction is changing is left for the next run: the purge never waits for a writer),
    deletes them where they still match, and returns one row ``(deleted, *keyset of the last row of the
    batch)``, or none once nothing matches. Its row locks last as long as the statement, which
    ``limit`` bounds, and the keyset makes each batch start where the last one ended instead of
    stepping again over the index entries of the rows deleted so far.

    SQLite (no DELETE in a WITH clause, no row locks: a write locks the whole database): :attr:`first`
    selects the ids of the batch, :attr:`delete` deletes those of the JSON list ``%(ids)s`` that still
    match; run both in one transaction. A deleted row leaves nothing behind in SQLite's b-tree, so every
    batch starts at the beginning; :attr:`after` is not used.
    """

    vendor: str
    first: str
    after: str
    delete: str

    @staticmethod
    def params(cutoff: Any, limit: int, after: Sequence[Any] = ()) -> dict[str, Any]:
        """The parameters of :attr:`first` (no ``after``) or :attr:`after` (the keyset to start after)."""
        params: dict[str, Any] = {"cutoff": cutoff, "limit": limit}
        params.update({f"after{index}": value for index, value in enumerate(after)})
        return params


#: The scopes of a purge: requests of every kind but tasks, old by ``created_at``, in ``(created_at, id)``
#: order (the index ``safeupdates_created``); ``@idempotent`` task rows, old by ``processed_at`` (the time
#: since which no run needed them), in ``key`` order (the partial unique index ``safeupdates_task_key``).
PURGE_REQUESTS, PURGE_TASKS = "requests", "tasks"


@lru_cache(maxsize=32)
def purge_batch(vendor: str, scope: str, statuses: tuple[str, ...] | None = None) -> PurgeBatch:
    """The :class:`PurgeBatch` of ``scope`` (:data:`PURGE_REQUESTS` or :data:`PURGE_TASKS`) on ``vendor``.

    Only terminal rows older than ``%(cutoff)s`` match: a pending request is never deleted. ``statuses``
    (requests only): the terminal statuses of the rows to delete, each outcome kept for its own time; None:
    every terminal one.
    """
    if vendor not in SUPPORTED_VENDORS:
        raise SafeUpdatesError(f"safeupdates supports PostgreSQL and SQLite, not {vendor}.")
    log = request_log()
    qn = vendor_connection(vendor).ops.quote_name
    table = qn(log._meta.db_table)
    pk, kind, status = (qn(column(log, name)) for name in ("pk", "kind", "status"))
    task, pending = log.Kind.TASK.value, log.Status.PENDING.value
    terminal = [value for value in log.Status.values if value != pending]
    if statuses is not None and (scope != PURGE_REQUESTS or not statuses or not set(statuses) <= set(terminal)):
        raise SafeUpdatesError(f"not terminal statuses of requests to purge: {statuses!r}")
    if scope == PURGE_REQUESTS:
        keyset: tuple[str, ...] = (qn(column(log, "created_at")), pk)
        # The statuses are literals of the log's choices (checked above), as the kinds are.
        listed = ", ".join(f"'{value}'" for value in statuses or ())
        chosen = f"{status} <> '{pending}'" if statuses is None else f"{status} IN ({listed})"
        condition = f"{kind} <> '{task}' AND {chosen} AND {keyset[0]} < %(cutoff)s"
    elif scope == PURGE_TASKS:
        keyset = (qn(column(log, "key")),)
        condition = f"{kind} = '{task}' AND {status} <> '{pending}' AND {qn(column(log, 'processed_at'))} < %(cutoff)s"
    else:
        raise SafeUpdatesError(f"not a purge scope: {scope!r}")
    names = ", ".join(keyset)
    if vendor == "sqlite":
        return PurgeBatch(
            vendor,
            first=f"SELECT {pk} FROM {table} WHERE {condition} ORDER BY {names} LIMIT %(limit)s",
            after="",
            delete=f"DELETE FROM {table} WHERE {pk} IN (SELECT value FROM json_each(%(ids)s)) AND {condition}",
        )
    later = f"({names}) > ({', '.join(f'%(after{index})s' for index in range(len(keyset)))})"
    # The batch's columns: the id and the keyset, each once (a WITH query names its columns).
    columns = names if pk in keyset else f"{pk}, {names}"
    newest_first = ", ".join(f"{name} DESC" for name in keyset)

    def batch(where: str) -> str:
        return (
            f"WITH batch AS (SELECT {columns} FROM {table} WHERE {where} ORDER BY {names} LIMIT %(limit)s "
            f"FOR UPDATE SKIP LOCKED), "
            f"gone AS (DELETE FROM {table} WHERE {pk} IN (SELECT {pk} FROM batch) AND {condition} RETURNING 1) "
            f"SELECT (SELECT count(*) FROM gone), last.* "
            f"FROM (SELECT {names} FROM batch ORDER BY {newest_first} LIMIT 1) last"
        )

    return PurgeBatch(vendor, first=batch(condition), after=batch(f"{condition} AND {later}"), delete="")


@dataclass(frozen=True)
class AppliedValues:
    """The verify pass's query: for pairs ``(object id, field, version)`` of records of one content type,
    the value of ``field`` in the applied update request of that record at that version, if there is
    one that changed the field. A version is handed out once, so a field's version names the one
    request (or save) that wrote it last; the lookup runs through the index on (content type, object
    id, version), without reading the records' other requests.

    PostgreSQL: one row, a JSON array of ``[object id, field, value]`` (one decode per batch, not per
    value); SQLite: rows ``(object id, field, changes)``. :meth:`rows` reads either.
    """

    vendor: str
    sql: str

    def params(self, content_type: int, wanted: Sequence[tuple[str, str, int]]) -> dict[str, Any]:
        """The parameters for the pairs ``wanted``: ``(object id, field, version)`` each."""
        if self.vendor == "postgresql":
            return {
                "content_type": content_type,
                "object_ids": [object_id for object_id, _name, _version in wanted],
                "names": [name for _object_id, name, _version in wanted],
                "versions": [version for _object_id, _name, version in wanted],
            }
        return {"content_type": content_type, "wanted": json.dumps(list(wanted))}

    def rows(self, fetched: Sequence[Sequence[Any]]) -> list[tuple[str, str, Any]]:
        """``(object id, field, value)`` of what :attr:`sql` fetched, values decoded from JSON."""
        if self.vendor == "postgresql":
            found = fetched[0][0] if fetched else None
            return [tuple(row) for row in json.loads(found)] if found else []  # type: ignore[misc]
        return [(object_id, name, json.loads(changes)[name]) for object_id, name, changes in fetched if changes]


@lru_cache(maxsize=8)
def applied_values(vendor: str) -> AppliedValues:
    """The :class:`AppliedValues` query of ``vendor``.

    Each pair is looked up on its own (a LATERAL subquery with LIMIT, on SQLite a correlated one): the
    planner cannot turn the lookups into a hash join over the whole log, which it chose at 100k
    requests (the filter on the JSON's type hid how many rows match) and which read the whole log per
    batch.
    """
    if vendor not in SUPPORTED_VENDORS:
        raise SafeUpdatesError(f"safeupdates supports PostgreSQL and SQLite, not {vendor}.")
    log = request_log()
    qn = vendor_connection(vendor).ops.quote_name
    table = qn(log._meta.db_table)
    object_id, version, changes, content_type, kind, status = (
        f"r.{qn(column(log, name))}" for name in ("object_id", "version", "changes", "content_type", "kind", "status")
    )
    at_version = (
        f"FROM {table} r WHERE {content_type} = %(content_type)s AND {object_id} = want.object_id "
        f"AND {version} = want.version AND {kind} = '{log.Kind.UPDATE.value}' "
        f"AND {status} = '{log.Status.APPLIED.value}'"
    )
    if vendor == "postgresql":
        return AppliedValues(
            vendor,
            f"SELECT jsonb_agg(jsonb_build_array(want.object_id, want.name, found.value)) "
            f"FROM unnest(%(object_ids)s::text[], %(names)s::text[], %(versions)s::bigint[]) "
            f"AS want(object_id, name, version) "
            f"CROSS JOIN LATERAL (SELECT {changes} -> want.name AS value {at_version} "
            f"AND jsonb_typeof({changes}) = 'object' AND {changes} ? want.name LIMIT 1) found",
        )
    return AppliedValues(
        vendor,
        f"SELECT want.object_id, want.name, (SELECT {changes} {at_version} AND json_type({changes}) = 'object' "
        f"AND json_type({changes}, '$.\"' || want.name || '\"') IS NOT NULL LIMIT 1) "
        f"FROM (SELECT json_extract(value, '$[0]') AS object_id, json_extract(value, '$[1]') AS name, "
        f"json_extract(value, '$[2]') AS version FROM json_each(%(wanted)s)) want",
    )


# --- system check E029: a pooler that hands one client's prepared statements to another -----------------


class _PoolerProbe:
    """PostgreSQL: the statement the probe prepares on one connection and runs from another
    (:func:`~safeupdates.database.internals.shares_prepared_statements`), and its DEALLOCATE."""

    prepared: str = "SELECT 1"

    @staticmethod
    def forget(name: str) -> str:
        # DEALLOCATE takes no parameters: the name is the probe's own (letters, digits, underscores).
        return f'DEALLOCATE "{name}"'


pooler_probe = _PoolerProbe()


# -- the Celery delivery's note of a record's waiting message --------------------------------------------


@cache
def waiting_message_statements() -> tuple[str, str]:
    """``(note, forget)`` on the table of :class:`safeupdates.models.WaitingMessage`, the same text on
    PostgreSQL and SQLite. ``note`` (parameters ``content_type_id, object_id, task_id``) inserts the
    record's row unless it has one, and returns a row only if it inserted: one statement, with no
    conflict to roll back. ``forget`` (``content_type_id, object_id``) deletes the record's row."""
    table = f'"{waiting_messages()._meta.db_table}"'
    record = '"content_type_id" = %s AND "object_id" = %s'
    return (
        f'INSERT INTO {table} ("content_type_id", "object_id", "task_id") VALUES (%s, %s, %s) '
        "ON CONFLICT DO NOTHING RETURNING 1",
        f"DELETE FROM {table} WHERE {record}",
    )
