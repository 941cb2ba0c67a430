"""Real ``rqworker`` processes for tests: started as subprocesses against the test database and Redis."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

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
    """A pool of real ``manage.py rqworker`` processes, stopped (or killed) by the test."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, count: int = 1, queues: tuple[str, ...] = ("default",), *, scheduler: bool = True) -> None:
        for _ in range(count):
            args = [sys.executable, str(ROOT / "manage.py"), "rqworker", *queues]
            if scheduler:
                args.append("--with-scheduler")
            self.procs.append(
                subprocess.Popen(
                    args, env=subprocess_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
            )

    def kill(self, index: int = 0) -> None:
        """SIGKILL the worker and its work horse (the whole process group is not ours: kill children)."""
        proc = self.procs[index]
        for child in _children(proc.pid):
            _kill(child)
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()
        self.procs.clear()

    def alive(self) -> int:
        return sum(proc.poll() is None for proc in self.procs)


def _children(pid: int) -> list[int]:
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:  # pragma: no cover - procps missing
        return []
    return [int(line) for line in out.split()]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
