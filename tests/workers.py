"""Real ``rqworker`` processes for tests: started as subprocesses against the test database and Redis."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def worker_db_url() -> str:
    """The URL of the database the tests run on (the test database), for subprocesses."""
    db = connection.settings_dict
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=worker_db_url(),
        REDIS_URL=settings.REDIS_URL,
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


class Workers:
    """A pool of real ``manage.py rqworker`` processes, stopped (or killed) by the test.

    Killing a worker also kills its work horse and scheduler process. Output goes to a log file (a pipe
    that nobody reads would block the worker once full).
    """

    def __init__(self, log_dir: Path | None = None) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="safeupdates-workers-"))

    def start(
        self,
        count: int = 1,
        queues: tuple[str, ...] = ("default",),
        *,
        scheduler: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        """Start ``count`` workers; ``env`` overrides their environment (``DATABASE_URL`` ...)."""
        for _ in range(count):
            args = [sys.executable, str(ROOT / "manage.py"), "rqworker", *queues]
            if scheduler:
                args.append("--with-scheduler")
            log = open(self.log_dir / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115 - closed by the process
            self.procs.append(
                subprocess.Popen(
                    args,
                    env=subprocess_env(**(env or {})),
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            log.close()

    def kill(self, index: int = 0) -> None:
        """SIGKILL worker ``index`` with its work horse and scheduler, as a crash or an OOM kill would."""
        proc = self.procs[index]
        _kill_tree(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)  # RQ's warm shutdown: finishes the current job
        deadline = time.monotonic() + 10
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            _kill_tree(proc.pid, signal.SIGKILL)  # whatever is left: horses, schedulers
            proc.wait()
        self.procs.clear()

    def alive(self) -> int:
        return sum(proc.poll() is None for proc in self.procs)

    def rq_states(self) -> list[str]:
        """The states that the live workers report to RQ (``idle``, ``busy``, ``suspended`` ...), sorted.
        Workers killed earlier stay registered until their key expires: they are left out."""
        import django_rq
        from rq import Worker

        live = {proc.pid for proc in self.procs if proc.poll() is None}
        registered = Worker.all(connection=django_rq.get_connection("default"))
        return sorted(worker.get_state() for worker in registered if worker.pid in live)

    def logs(self) -> str:
        """Everything the workers printed, for a failing test's message."""
        return "\n".join(path.read_text(errors="replace") for path in sorted(self.log_dir.glob("*.log")))


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``. RQ's work horse leaves the worker's process group (setpgrp), so a
    group kill would miss it: walk the parent links in /proc instead."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _kill_tree(pid: int, sig: signal.Signals) -> None:
    """Freeze ``pid`` (so it forks no new horse), then signal it and all its descendants."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    for victim in [*_descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, sig)
    if sig != signal.SIGKILL:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


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
    """Hold a row lock (``with_lock``) in a thread of its own until released: a job that needs the row
    then blocks in its UPDATE, where a test can kill its worker or terminate its connection."""

    def __init__(self, model: Any, pk: Any) -> None:
        self.model, self.pk = model, pk
        self._locked, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        from django.db import connections

        try:
            with self.model.objects.with_lock(self.pk):
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


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
