"""The caller's transaction (an ``atomic()`` block, or autocommit turned off by hand), work after its
commit, and lock timeouts scoped to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from safeupdates.database import statements
from safeupdates.database.cursors import execute, fetch_one


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
    previous = fetch_one(connection, statements.lock_timeout.current)[0]
    execute(connection, statements.lock_timeout.set_local("lock_timeout", milliseconds))
    for name, value in extra.items():
        execute(connection, statements.lock_timeout.set_local(name, value))
    yield
    # On an exception the caller's atomic() rolls back, and SET LOCAL with it; else put the old value back.
    fetch_one(connection, *statements.lock_timeout.restore(previous))
