"""The one place that touches private Django and psycopg internals, for every supported version.

Django 5.2, 6.0 and 6.1 differ where the app reaches below the public API:

- ``Model._do_update`` gained ``returning_fields`` in 6.0 and returns the returned rows instead of a
  bool. ``LockVersionMixin`` passes the argument through untouched (:data:`UPDATE_RETURNS_ROWS` says
  which result to give back) and runs its checked UPDATE with :func:`update_returning`, which works
  on every version.
- A ``save()`` runs its own cached UPDATE or INSERT (:class:`~safeupdates.database.statements.CheckedSave`,
  :class:`~safeupdates.database.statements.VersionedInsert`) with the values bound as the ORM's compiler would
  bind them (:func:`bound_values`), and converts what it returns as the ORM would (:func:`from_db`).
- A column whose value is the database's default (``db_default``, Django's ``DatabaseDefault``) is left
  out of the INSERT (:func:`insert_values`), as the compiler's ``DEFAULT`` would leave it to the database.
- A ``StaleObjectError`` raised inside Django's ``save_base()`` marks the caller's transaction for
  rollback on its way out (``mark_for_rollback_on_error``, ``atomic(savepoint=False)``), although the
  statement that found the conflict wrote nothing: :func:`forget_rollback` takes that mark back.
- A checked ``delete()`` that cascades runs Django's ``Collector`` (:func:`collect`), and where no
  receiver runs before the row's own DELETE, runs the collector's deletes in two parts around the checked
  DELETE of the row (:func:`delete_in_place`): that reads and rewrites the collector's ``data``,
  ``fast_deletes`` and ``field_updates``, which are not public API.
- The guarded statements run as server-side prepared statements through Django's
  ``ServerBindingCursor`` and psycopg's ``prepare_threshold`` (:func:`prepared_cursor_class`).
- System check E029 probes for a pooler that lets one client run another's prepared statement
  (:func:`shares_prepared_statements`) with psycopg's libpq-level calls on connections of its own.
- Private state read where no public API tells it: the thread that owns a connection
  (:func:`owned_by_this_thread`), a queryset's explicit database (:func:`explicit_database`), whether a
  ``FieldFile`` is in its storage yet (:func:`in_storage`), a psycopg ``Range``'s bounds (:func:`range_bounds`).

Nothing else in the package uses a private name of Django or psycopg, but the hooks the package
overrides (``Model._do_update`` and ``_do_insert`` in ``write/mixins.py``, ``BaseModelForm._post_clean``
in ``forms.py``): ``tests/test_layout.py`` checks it.
"""

from __future__ import annotations

import _thread
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any

import django
from django.db import models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import sql
from django.db.models.deletion import Collector as Collector  # re-exported: the write path's delete uses it
from django.db.models.expressions import DatabaseDefault
from django.db.models.signals import post_delete, pre_delete

#: Django 6.0+: ``Model._do_update`` returns the updated rows' returned values, not a bool.
UPDATE_RETURNS_ROWS = django.VERSION >= (6, 0)


def update_returning(
    queryset: models.QuerySet[Any],
    values: Sequence[tuple[Any, Any, Any]],
    fields: Sequence[models.Field[Any, Any]],
    *,
    with_clause: str = "",
) -> list[tuple[Any, ...]]:
    """``queryset._update(values)`` with ``RETURNING fields``: one round trip, the written values back.

    ``values`` are ``(field, model, value)`` triples as ``Model._do_update`` receives them; values may
    be expressions. ``with_clause`` (``WITH name AS (...)``) goes in front of the statement, for values
    that read it. Returns one tuple per updated row, converted as the ORM would (``from_db_value``).
    PostgreSQL and SQLite (3.35+) both return rows from an UPDATE.
    """
    query: Any = queryset.query.chain(sql.UpdateQuery)
    query.add_update_fields(values)
    query.annotations = {}
    compiler = query.get_compiler(queryset.db)
    statement, params = compiler.as_sql()
    connection = compiler.connection
    qn = connection.ops.quote_name
    statement = f"{with_clause} {statement} RETURNING {', '.join(qn(field.column) for field in fields)}".lstrip()
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        rows: list[Any] = cursor.fetchall()
    table = query.get_meta().db_table
    converters = compiler.get_converters([field.get_col(table) for field in fields])
    if converters:
        rows = list(compiler.apply_converters(rows, converters))
    return [tuple(row) for row in rows]


def bound_values(connection: BaseDatabaseWrapper, values: Sequence[tuple[Any, Any, Any]]) -> list[Any] | None:
    """The parameters the ORM's compiler would bind for ``values``, or None if one needs it.

    ``values`` are ``(field, model, value)`` triples as ``Model._do_update`` receives them (an INSERT's
    values are given the same way). A plain value is bound as ``field.get_db_prep_save()`` returns it,
    as ``SQLUpdateCompiler`` and ``SQLInsertCompiler`` do (5.2 and 6.x); an
    expression (an ``F()``, a function), a model instance, a field with a placeholder of its own (arrays,
    ranges, GIS) or a prepared value that compiles itself need the compiler, and the caller takes the
    ORM's path.
    """
    bound = []
    for field, _model, value in values:
        if type(value) not in _PLAIN_TYPES and (
            hasattr(value, "resolve_expression") or hasattr(value, "prepare_database_save")
        ):
            return None
        if not _binds_plainly(field):
            return None
        value = field.get_db_prep_save(value, connection=connection)
        if hasattr(value, "as_sql"):
            return None
        bound.append(value)
    return bound


def insert_values(
    connection: BaseDatabaseWrapper, values: Sequence[tuple[Any, Any, Any]]
) -> tuple[list[tuple[Any, Any, Any]], list[Any]] | None:
    """The values an INSERT writes itself and their parameters (:func:`bound_values`), or None if one
    needs the compiler.

    A value that is the database's default (a field's ``db_default``) is left out: the database fills
    in a column the INSERT does not name with the same default that the compiler's ``DEFAULT`` asks for.
    """
    written = [value for value in values if not isinstance(value[2], DatabaseDefault)]
    bound = bound_values(connection, written)
    return None if bound is None else (written, bound)


def forget_rollback(connection: BaseDatabaseWrapper, error: BaseException) -> None:
    """Take back the mark for rollback that ``error`` set on the way out of Django's ``save_base()``.

    Only for an error raised before anything was written in the save: the transaction is as usable as
    before it, as if the save had run in a savepoint that rolled back nothing.
    """
    if connection.in_atomic_block:
        transaction.set_rollback(False, using=connection.alias)
    else:  # autocommit off by hand: Django's atomic(savepoint=False) left the mark on the connection
        connection.needs_rollback = False
    if getattr(connection, "rollback_exc", None) is error:
        connection.rollback_exc = None  # type: ignore[attr-defined]  # the cause Django names for a refused query


#: Types of values that are never expressions nor model instances (exactly these; not subclasses).
_PLAIN_TYPES = frozenset(
    {type(None), bool, int, float, str, bytes, Decimal, date, datetime, time, timedelta, uuid.UUID}
)


def _binds_plainly(field: models.Field[Any, Any]) -> bool:
    """Whether the compiler writes a bare ``%s`` for a value of ``field``.

    Fields with a placeholder of their own (``get_placeholder`` on 5.2, ``get_placeholder_sql`` on 6.x:
    arrays, ranges, GIS) need the compiler. ``BinaryField``'s is the backend's binary placeholder, a bare
    ``%s`` on PostgreSQL and SQLite (only MySQL differs), unless a subclass overrides it.
    """
    kind: Any = type(field)
    return _class_binds_plainly(kind)


@lru_cache(maxsize=256)
def _class_binds_plainly(kind: Any) -> bool:
    """:func:`_binds_plainly` of a field class: decided once per class."""
    for name in ("get_placeholder", "get_placeholder_sql"):
        method = getattr(kind, name, None)
        if method is not None and method is not getattr(models.BinaryField, name, None):
            return False
    return True


def from_db(connection: BaseDatabaseWrapper, field: models.Field[Any, Any], value: Any) -> Any:
    """``value`` of ``field`` as read from the database, converted as the ORM converts query results."""
    col = field.get_col(field.model._meta.db_table)
    for converter in connection.ops.get_db_converters(col) + col.get_db_converters(connection):
        value = converter(value, col, connection)
    return value


#: psycopg's prepare threshold that is never reached: automatic preparing stays off.
_NEVER = 2**62


@lru_cache(maxsize=1)
def prepared_cursor_class() -> type[Any] | None:
    """A cursor class that binds on the server and prepares each statement it runs a second time (psycopg 3).

    Django turns psycopg's prepared statements off (``prepare_threshold = None``, for PgBouncer in
    transaction mode), which also ignores an explicit ``prepare=True``. A threshold never reached keeps
    automatic preparing off for every other query and lets this cursor prepare its own. Not on a
    statement's first run: psycopg prepares in a round trip of its own, which a connection that runs
    the statement once (an RQ work horse's) would pay for nothing. None with psycopg 2.
    """
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return None
    from django.db.backends.postgresql.base import ServerBindingCursor  # type: ignore[attr-defined]

    class PreparedCursor(ServerBindingCursor):  # type: ignore[misc,valid-type]
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            connection: Any = self.connection  # type: ignore[attr-defined]
            if connection.prepare_threshold is None:
                connection.prepare_threshold = _NEVER
            ran: set[Any] = self.__dict__.setdefault("_safeupdates_ran", set())
            again = query in ran
            if not again:
                ran.add(query)
            return super().execute(query, params, prepare=again, **kwargs)  # type: ignore[misc]

    return PreparedCursor


def shares_prepared_statements(connection: BaseDatabaseWrapper) -> bool:
    """True if a statement prepared on one new connection to ``connection``'s database can be run from
    another new connection: a pooler in transaction mode that keeps server-side prepared statements on
    the server connection and hands that connection to the next client (PgBouncer in transaction mode
    before 1.22, or without ``max_prepared_statements``). There, psycopg's prepared statements of one
    client run on behalf of another, or are missing where it expects them.

    Direct connections and PgBouncer in session mode keep a session's statements to it, and PgBouncer
    1.22+ with ``max_prepared_statements`` tracks them per client: False. False too where it cannot be
    told (psycopg 2, no connection): the probe sees a shared server connection only if no other client
    takes it in between (PgBouncer hands out its most recently used server connection first).
    """
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    from safeupdates.database.statements import pooler_probe

    if connection.vendor != "postgresql" or not is_psycopg3:
        return False
    import psycopg
    from psycopg import pq

    params = dict(connection.get_connection_params())
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    name = f"safeupdates_probe_{uuid.uuid4().hex}"
    try:
        with psycopg.connect(**params, autocommit=True) as first:
            if first.pgconn.prepare(name.encode(), pooler_probe.prepared.encode()).status != pq.ExecStatus.COMMAND_OK:
                return False
            with psycopg.connect(**params, autocommit=True) as second:
                shared = second.pgconn.exec_prepared(name.encode(), None).status == pq.ExecStatus.TUPLES_OK
                # On the server connection that holds it, most likely: leave nothing behind.
                first.pgconn.exec_(pooler_probe.forget(name).encode())
                second.pgconn.exec_(pooler_probe.forget(name).encode())
                return shared
    except psycopg.Error:
        return False


def collect(instance: models.Model, using: str, keep_parents: bool) -> Collector | None:
    """Django's ``Collector`` for the delete of ``instance``, having collected what the delete cascades to;
    None where Django would delete the row in one statement (nothing cascades, no receivers, no parents)."""
    collector = Collector(using=using, origin=instance)
    if collector.can_fast_delete(instance):
        return None
    collector.collect([instance], keep_parents=keep_parents)
    return collector


def deleted_before_any_receiver(collector: Collector, model: type[models.Model]) -> type[models.Model] | None:
    """The key of ``collector.data`` that holds the rows of ``model`` (the versions table), if no signal
    receiver runs before ``Collector.delete()`` deletes them: no ``pre_delete`` receiver of any deleted
    model, no ``post_delete`` receiver of the models it deletes first nor of ``model``; else None."""
    if model._meta.parents:
        return None  # its parents' tables are deleted after it
    collector.sort()
    keys = list(collector.data)
    mine = [index for index, key in enumerate(keys) if key._meta.concrete_model is model]
    if len(mine) != 1:
        return None  # not deleted (keep_parents), or deleted under two keys (a proxy)
    position = mine[0]
    if any(pre_delete.has_listeners(key) for key in keys):
        return None
    if any(post_delete.has_listeners(key) for key in keys[: position + 1]):
        return None
    return keys[position]


def delete_in_place(
    connection: BaseDatabaseWrapper,
    collector: Collector,
    key: type[models.Model],
    pk: Any,
    delete_row: Callable[[], int],
) -> tuple[int, dict[str, int]]:
    """``Collector.delete()`` with the DELETE of row ``pk`` of model ``key`` run by ``delete_row()``, where
    Django deletes it: after the fast deletes, the field updates and the models sorted before it, before
    the models sorted after it; all in one transaction. ``delete_row()`` returns how many rows it deleted
    (0 or 1) or raises, which rolls back what was deleted before it and gives every collected instance its
    key back (``Collector.delete()`` clears the keys of the instances it deleted). Returns what
    ``Collector.delete()`` returns."""
    data = collector.data
    keys = list(data)
    position = keys.index(key)
    mine = [obj for obj in data[key] if obj.pk == pk]
    others = [obj for obj in data[key] if obj.pk != pk]
    cleared = [
        (obj, model._meta.pk.attname, getattr(obj, model._meta.pk.attname))  # type: ignore[union-attr]
        for model, objs in data.items()
        for obj in objs
    ]
    before = {model: data[model] for model in keys[:position]}
    if others:
        before[key] = set(others)  # the other rows of its model (a cascade to itself) go first
    after = {model: data[model] for model in keys[position + 1 :]}
    count, counts = 0, Counter[str]()
    try:
        with transaction.atomic(using=connection.alias, savepoint=False):
            if before or collector.fast_deletes or collector.field_updates:
                collector.data = before
                done, done_counts = collector.delete()
                count, counts = count + done, counts + Counter(done_counts)
            deleted = delete_row()
            if after:
                collector.data, collector.fast_deletes, collector.field_updates = after, [], defaultdict(list)
                done, done_counts = collector.delete()
                count, counts = count + done, counts + Counter(done_counts)
    except BaseException:
        for obj, attname, value in cleared:
            setattr(obj, attname, value)
        raise
    for obj in mine:
        setattr(obj, key._meta.pk.attname, None)  # type: ignore[union-attr]
    if deleted:
        counts[key._meta.label] += deleted
    return count + deleted, dict(counts)


def owned_by_this_thread(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` was opened by the running thread (Django's ``_thread_ident``)."""
    return bool(connection._thread_ident == _thread.get_ident())  # type: ignore[attr-defined]


def explicit_database(queryset: models.QuerySet[Any]) -> str | None:
    """The database a queryset was given with ``using()``, None if none (``QuerySet.db`` would route)."""
    return getattr(queryset, "_db", None)


def in_storage(file: Any) -> bool:
    """Whether a ``FieldFile`` is saved to its storage (Django's ``_committed``; a new file is not)."""
    return bool(getattr(file, "_committed", True))


def range_bounds(value: Any) -> str:
    """The bounds of a psycopg ``Range`` as its constructor takes them (``"[)"``; psycopg's ``_bounds``)."""
    return str(value._bounds)
