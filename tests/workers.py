"""Helpers of the tests: real ``rqworker`` processes (from :mod:`demo_project.processes`, which the demo
commands use too), started against the test database and Redis, and threads that re-raise what they raised."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from demo_project.processes import (
    ROOT,
    Workers,
    database_url,
    kill_tree,
    subprocess_env,
    wait_until,
)

__all__ = [
    "ROOT",
    "RowLock",
    "Workers",
    "assert_a_stale_copy_is_refused",
    "kill_tree",
    "locked_elsewhere",
    "meanwhile",
    "run_threads",
    "start_threads",
    "subprocess_env",
    "wait_until",
    "worker_db_url",
]


def worker_db_url() -> str:
    """The URL of the database the tests run on (the test database), for subprocesses."""
    return database_url()


class _Thread(threading.Thread):
    """A thread that keeps what its target raised, and raises it again from :meth:`join`."""

    error: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as exc:  # re-raised by join(), in the test's thread
            self.error = exc

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None and not self.is_alive():
            error, self.error = self.error, None
            raise error


def start_threads(target: Callable[[], object], count: int) -> list[threading.Thread]:
    """Start ``count`` threads running ``target``; each closes its own database connections at the end.

    Joining a thread raises again whatever ``target`` raised in it.
    """

    def run() -> None:
        from django.db import connections

        try:
            target()
        finally:
            connections.close_all()

    threads: list[threading.Thread] = [_Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def run_threads(target: Callable[[], object], count: int) -> None:
    """Run ``target`` in ``count`` threads at once, wait for all of them, then raise the first error
    any of them raised."""
    threads = start_threads(target, count)
    errors: list[BaseException] = []
    for thread in threads:
        try:
            thread.join()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


class RowLock:
    """Hold a row lock (``with_lock``, or ``SELECT ... FOR UPDATE`` for a model without it, such as the
    request log) in a thread of its own until released: a job that needs the row then blocks in its
    UPDATE, where a test can kill its worker or terminate its connection."""

    def __init__(self, model: Any, pk: Any, using: str = "default") -> None:
        self.model, self.pk, self.using = model, pk, using
        self._locked, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        from django.db import connections, transaction

        manager = self.model.objects.using(self.using)
        try:
            if hasattr(manager, "with_lock"):
                with manager.with_lock(self.pk):
                    self._locked.set()
                    self._release.wait(60)
            else:
                with transaction.atomic(using=self.using):
                    manager.select_for_update().get(pk=self.pk)
                    self._locked.set()
                    self._release.wait(60)
        finally:
            connections.close_all()

    def start(self) -> RowLock:
        self._thread.start()
        assert self._locked.wait(10), "could not lock the row"
        return self

    def __enter__(self) -> RowLock:
        return self.start()

    def release(self) -> None:
        self._release.set()
        self._thread.join()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def still_usable(using: str = "default") -> None:
    """Assert that the connection's transaction still runs statements: a refusal raised in it left it usable
    (not "current transaction is aborted")."""
    from django.db import connections

    with connections[using].cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def lock_waiters(using: str = "default") -> list[int]:
    """The process ids of the other backends of the test database that wait for a lock (a job's UPDATE of
    a row that a :class:`RowLock` holds, say); PostgreSQL."""
    from django.db import connections

    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return [pid for (pid,) in cursor.fetchall()]


def locked_elsewhere(model: Any, pk: Any, using: str = "default") -> bool:
    """Whether another connection finds row ``pk`` locked: ``SELECT ... FOR UPDATE NOWAIT`` in a thread of
    its own, which fails for a lock held and only then (PostgreSQL)."""
    from django.db import OperationalError, connections, transaction

    from safeupdates.database.errors import is_lock_unavailable

    found: list[bool] = []

    def attempt() -> None:
        try:
            with transaction.atomic(using=using):
                list(model._default_manager.using(using).select_for_update(nowait=True).filter(pk=pk))
            found.append(False)
        except OperationalError as exc:
            found.append(is_lock_unavailable(exc))
        finally:
            connections[using].close()

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return found[0]


@contextmanager
def meanwhile(model: Any, action: Callable[[Any], object]) -> Iterator[list[Any]]:
    """Inside the block, when the first save of a ``model`` instance begins (``pre_save``), run
    ``action(instance)`` in another thread, on a connection of its own that commits, and wait for it: a
    write that lands between a check and the save it guards. Yields the instances it ran for (one, or
    none if no save began); what ``action`` raised is raised from the save."""
    from django.db.models.signals import pre_save

    ran: list[Any] = []

    def receiver(sender: Any, instance: Any, **kwargs: Any) -> None:
        if sender is model and not ran:
            ran.append(instance)
            other = _Thread(target=action, args=(instance,))
            other.start()
            other.join()

    pre_save.connect(receiver, weak=False)
    try:
        yield ran
    finally:
        pre_save.disconnect(receiver)


def assert_a_stale_copy_is_refused(instance: Any) -> None:
    """A copy of ``instance``'s row loaded now, then ``instance`` saved again (``name`` "c"): the copy's
    save (``name`` "d") raises ``StaleObjectError`` and the row keeps ``instance``'s write."""
    import pytest

    from safeupdates.exceptions import StaleObjectError

    rows = type(instance)._base_manager
    stale = rows.get(pk=instance.pk)
    instance.name = "c"
    instance.save()
    stale.name = "d"
    with pytest.raises(StaleObjectError):
        stale.save()
    assert rows.get(pk=instance.pk).name == "c"
