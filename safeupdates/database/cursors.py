"""Where every statement of safeupdates runs: :func:`fetch_one`, :func:`fetch_all` and :func:`execute`.

The rest of the package hands these a statement of :mod:`safeupdates.database.statements` and its
parameters, and never opens a cursor itself (``tests/test_layout.py`` checks it): one place to see how a
statement runs, prepared or not, and to time, log or trace it. The ORM's own queries go through Django.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.utils import NotSupportedError

from safeupdates import conf
from safeupdates.database.errors import is_replanned
from safeupdates.database.internals import owned_by_this_thread, prepared_cursor_class

Params = Sequence[Any] | Mapping[str, Any] | None
T = TypeVar("T")


def fetch_one(connection: BaseDatabaseWrapper, sql: str, params: Params = None, *, prepared: bool = False) -> Any:
    """Run ``sql`` on ``connection``; its first row, or None. ``prepared``: as a server-side prepared
    statement where it can (:func:`statement_cursor`), for the statements of the write path."""
    if prepared:
        return _run_prepared(connection, sql, params, _first_row)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        with cursor.db.wrap_database_errors:
            # Not cursor.fetchone(): Django's cursor builds a wrapper function around it on every call.
            return cursor.cursor.fetchone()


def fetch_all(connection: BaseDatabaseWrapper, sql: str, params: Params = None, *, prepared: bool = False) -> list[Any]:
    """Run ``sql`` on ``connection``; every row it returns. ``prepared``: as :func:`fetch_one`'s."""
    if prepared:
        return _run_prepared(connection, sql, params, _all_rows)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[Any] = cursor.fetchall()
        return rows


def execute(connection: BaseDatabaseWrapper, sql: str, params: Params = None, *, prepared: bool = False) -> int:
    """Run ``sql`` on ``connection``; the number of rows it changed."""
    if prepared:
        return _run_prepared(connection, sql, params, _row_count)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def _first_row(cursor: Any) -> Any:
    return cursor.fetchone()


def _all_rows(cursor: Any) -> list[Any]:
    return list(cursor.fetchall())


def _row_count(cursor: Any) -> int:
    return int(cursor.rowcount)


def _run_prepared(connection: BaseDatabaseWrapper, sql: str, params: Params, take: Callable[[Any], T]) -> T:
    """Run ``sql`` prepared (:func:`statement_cursor`); what ``take`` reads off the psycopg cursor. Once
    more, prepared anew, if PostgreSQL refused the prepared statement because its result type changed
    (:func:`_forgot_stale_plans`)."""
    try:
        return _run_prepared_once(connection, sql, params, take)
    except NotSupportedError as exc:
        if not _forgot_stale_plans(connection, exc):
            raise
    return _run_prepared_once(connection, sql, params, take)


def _run_prepared_once(connection: BaseDatabaseWrapper, sql: str, params: Params, take: Callable[[Any], T]) -> T:
    cursor = _direct_cursor(connection)
    if cursor is not None:
        connection.validate_no_broken_transaction()
        with connection.wrap_database_errors:
            cursor.execute(sql, params)
            return take(cursor)
    with statement_cursor(connection) as wrapped:
        wrapped.execute(sql, params)
        with connection.wrap_database_errors:
            # The psycopg cursor: Django's builds a wrapper function around fetchone() on every call.
            return take(wrapped.cursor)


def _forgot_stale_plans(connection: BaseDatabaseWrapper, exc: NotSupportedError) -> bool:
    """After ``exc``: if it is PostgreSQL refusing a prepared statement whose result type a migration
    changed, outside a transaction, forget this connection's prepared statements and say True (the
    statement did not run: run it again, prepared anew). Without this, every later execution on the
    connection would be refused the same way: psycopg clears its prepared statements on a rollback, and
    in autocommit none comes. In a transaction the error is raised: the transaction is aborted, and its
    rollback clears them (the error is transient: a job is retried)."""
    if not is_replanned(exc) or not connection.get_autocommit() or connection.in_atomic_block:
        return False
    with connection.wrap_database_errors:
        connection.connection.execute("DEALLOCATE ALL")  # psycopg forgets its own, on seeing it
    return True


def statement_cursor(connection: BaseDatabaseWrapper) -> AbstractContextManager[CursorWrapper]:
    """A cursor for the guarded statements (``with statement_cursor(connection) as cursor:``); on
    PostgreSQL with psycopg 3 they run prepared.

    Django binds parameters on the client, so PostgreSQL parses and plans every execution anew, and
    the recorded statement (an UPDATE and an INSERT in CTEs) spends longer in the planner than in the
    executor. This cursor binds on the server and prepares each statement once per connection, on its
    second run there (psycopg's prepared statement cache); Django still wraps it, so ``connection.execute_wrapper()``
    sees every statement. ``SAFEUPDATES_PREPARED_STATEMENTS = False`` turns this off, for poolers
    without prepared statement support (in transaction mode, PgBouncer before 1.22 or without
    ``max_prepared_statements``; system check W004).

    :func:`fetch_one` and :func:`execute` skip Django's wrapper around this cursor while nothing would
    see it (:func:`_direct_cursor`).
    """
    cursor_class = prepared_cursor_class() if connection.vendor == "postgresql" else None
    # While queries are logged (DEBUG, assertNumQueries), Django's own cursor: the log then shows
    # every statement with its values, which a prepared statement's log entry would not.
    if cursor_class is None or connection.queries_logged or not conf.prepared_statements():
        return connection.cursor()  # closed when the block ends
    # What connection.cursor() does, with our cursor class: health check, connect, thread check, wrap.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    return _Kept(connection.make_cursor(_prepared_cursor(connection.alias, connection.connection, cursor_class)))


def _direct_cursor(connection: BaseDatabaseWrapper) -> Any:
    """This thread's kept psycopg cursor on ``connection``, to run a prepared statement on without Django's
    cursor wrapper (what that does per statement the caller does: the broken-transaction check and the
    translation of errors); None where the statement goes through the wrapper: not PostgreSQL with
    psycopg 3, prepared statements off, or something that Django's wrapper would tell about the
    statement (an ``execute_wrapper()`` installed, or queries logged: DEBUG, ``assertNumQueries``,
    ``CaptureQueriesContext``).

    The checks of ``connection.cursor()`` still run first: health check, (re)connect, async and thread
    checks. A cursor is kept per raw connection: after a close or a reconnect, a new one."""
    cursor_class = prepared_cursor_class() if connection.vendor == "postgresql" else None
    if (
        cursor_class is None
        or connection.execute_wrappers
        or connection.queries_logged
        or not conf.prepared_statements()
    ):
        return None
    connection.close_if_health_check_failed()
    connection.ensure_connection()  # also refuses to run in an event loop, as connection.cursor() does
    if not owned_by_this_thread(connection):
        connection.validate_thread_sharing()  # a shared connection is allowed; else it raises
    return _prepared_cursor(connection.alias, connection.connection, cursor_class)


class _Kept:
    """A ``with`` block around this thread's kept cursor, which stays open when the block ends."""

    __slots__ = ("cursor",)

    def __init__(self, cursor: CursorWrapper) -> None:
        self.cursor = cursor

    def __enter__(self) -> CursorWrapper:
        return self.cursor

    def __exit__(self, *exc_info: object) -> None:
        return None


#: This thread's prepared cursor per database alias: kept open across statements (the hand-written
#: loop it is measured against keeps its cursor too); a new one when the connection was replaced.
_cursors = threading.local()


def _prepared_cursor(alias: str, raw: Any, cursor_class: type[Any]) -> Any:
    """This thread's open cursor of class ``cursor_class`` on psycopg connection ``raw``, made once."""
    kept: dict[str, Any] = _cursors.__dict__.setdefault("by_alias", {})
    cursor = kept.get(alias)
    if cursor is None or cursor.closed or cursor.connection is not raw:
        cursor = kept[alias] = cursor_class(raw)
    return cursor
