"""Database helpers shared by the modules: the database's clock, scoped lock timeouts, lock errors, and
the caller's transaction (an ``atomic()`` block, or autocommit turned off by hand).

Time comes from the database, never from a worker's or a web process's clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import ExpressionWrapper
from django.db.models.functions import Now

from safeupdates import statements

__all__ = [
    "LOCK_NOT_AVAILABLE",
    "after_commit",
    "database_now",
    "in_transaction",
    "is_lock_unavailable",
    "local_lock_timeout",
    "older_than",
]

#: PostgreSQL's SQLSTATE for "could not obtain lock" (NOWAIT and lock_timeout alike).
LOCK_NOT_AVAILABLE = "55P03"


def in_transaction(connection: BaseDatabaseWrapper) -> bool:
    """True if a statement on ``connection`` runs in a transaction its caller commits or rolls back: an
    ``atomic()`` block, or autocommit turned off by hand (``transaction.set_autocommit(False)``, where
    ``in_atomic_block`` is False). False in autocommit, where each statement commits by itself."""
    return connection.in_atomic_block or not connection.get_autocommit()


def after_commit(func: Callable[[], object], using: str, *, robust: bool = False) -> None:
    """Run ``func`` when the caller's transaction on ``using`` commits (at once in autocommit), not at all
    if it rolls back, as ``transaction.on_commit()`` does.

    ``on_commit()`` refuses outside an ``atomic()`` block when autocommit was turned off by hand, after
    the caller's statements ran. Registered inside one, Django keeps ``func`` until ``commit()`` and runs
    it when autocommit is turned on again, or drops it on ``rollback()`` (any: also one after a
    ``commit()``). ``savepoint=False``: that block runs no statement. As ``on_commit()`` itself, it keeps
    ``func`` through the rollback of a savepoint made by hand (``transaction.savepoint()``).
    """
    connection = connections[using]
    if connection.in_atomic_block or connection.get_autocommit():
        transaction.on_commit(func, using=using, robust=robust)
        return
    with transaction.atomic(using=using, savepoint=False):
        transaction.on_commit(func, using=using, robust=robust)


def is_lock_unavailable(exc: BaseException) -> bool:
    """True if ``exc`` (a Django ``OperationalError``) says a row lock could not be had."""
    return getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE


def database_now(using: str = "default") -> datetime:
    """The database server's current time, aware (UTC)."""
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(statements.CURRENT_TIMESTAMP if connection.vendor == "postgresql" else statements.SQLITE_NOW)
        value = cursor.fetchone()[0]
    now: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value  # SQLite: a string, UTC
    return now if now.tzinfo else now.replace(tzinfo=UTC)


def older_than(seconds: float) -> ExpressionWrapper[Any]:
    """An expression for "``seconds`` before now" on the database's clock, to compare timestamps with."""
    return ExpressionWrapper(Now() - timedelta(seconds=seconds), output_field=models.DateTimeField())


@contextmanager
def local_lock_timeout(using: str, seconds: float | None, **extra: Any) -> Iterator[None]:
    """Within the current transaction, make lock waits give up after ``seconds`` (PostgreSQL only).

    The caller's own ``lock_timeout`` is put back afterwards, so only the locks taken inside the block
    wait that long. Keyword arguments set further ``SET LOCAL`` parameters in milliseconds for the rest of
    the transaction (for example ``idle_in_transaction_session_timeout``). Elsewhere it does nothing.
    """
    connection = connections[using]
    if seconds is None or connection.vendor != "postgresql":
        yield
        return
    milliseconds = max(1, int(seconds * 1000))
    with connection.cursor() as cursor:
        cursor.execute(statements.lock_timeout.current)
        previous = cursor.fetchone()[0]
        cursor.execute(statements.lock_timeout.set_local("lock_timeout", milliseconds))
        for name, value in extra.items():
            cursor.execute(statements.lock_timeout.set_local(name, value))
    yield
    # On an exception the caller's atomic() rolls back, and SET LOCAL with it; else put the old value back.
    with connection.cursor() as cursor:
        cursor.execute(*statements.lock_timeout.restore(previous))
