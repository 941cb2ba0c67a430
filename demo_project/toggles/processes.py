"""Real ``manage.py rqworker`` (and ``runserver``) subprocesses for the demo commands.

The subprocesses get the settings module and the database of the process that starts them, so a worker
started by ``race_demo`` under ``DATABASE_URL=postgres://...`` works on that same database.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from django.conf import settings
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent.parent
MANAGE_PY = ROOT / "manage.py"


def database_url(alias: str = "default") -> str:
    """The URL of database ``alias`` as this process uses it (absolute SQLite path), for subprocesses."""
    db = connections[alias].settings_dict
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    user = quote(db.get("USER") or "postgres", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a child ``manage.py``: same settings module, database and Redis as ours."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
    env["DATABASE_URL"] = database_url()
    if getattr(settings, "REDIS_URL", None):
        env["REDIS_URL"] = settings.REDIS_URL
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def manage_py(
    *args: str, stdout: IO[Any] | int | None = None, stderr: IO[Any] | int | None = None
) -> subprocess.Popen[bytes]:
    """Start ``python manage.py *args`` in its own session, so that it can be stopped as a group."""
    return subprocess.Popen(
        [sys.executable, str(MANAGE_PY), *args],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
    )


def children(pid: int) -> list[int]:
    """The ids of the direct children of process ``pid`` (an RQ worker's work horse), from ``/proc``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (2nd field) is in parentheses and may contain spaces: split after it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            found.append(int(stat.parent.name))
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited already
        os.kill(pid, sig)


class WorkerPool:
    """A pool of real ``manage.py rqworker`` processes on ``queues``, started and stopped by the caller."""

    def __init__(self, *queues: str, name: str = "demo", output: IO[Any] | int | None = subprocess.DEVNULL) -> None:
        self.queues = queues
        self.name = name
        # Where the workers' log goes (RQ logs to stdout, its errors to stderr); None: ours.
        self.output = output
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: list[str] = []

    def worker_name(self, index: int) -> str:
        """The RQ name of worker ``index``: unique per pool and process, so it can be looked up."""
        return f"{self.name}-{os.getpid()}-{index}"

    def start(
        self,
        count: int = 1,
        *,
        burst: bool = False,
        max_jobs: int | None = None,
        scheduler: bool = False,
        verbosity: int = 0,
    ) -> list[subprocess.Popen[bytes]]:
        """Start ``count`` workers; ``burst`` workers exit once the queues are empty."""
        started = []
        for _ in range(count):
            args = ["rqworker", *self.queues, "--name", self.worker_name(len(self.procs)), "-v", str(verbosity)]
            if burst:
                args.append("--burst")
            if max_jobs is not None:
                args += ["--max-jobs", str(max_jobs)]
            if scheduler:
                args.append("--with-scheduler")
            proc = manage_py(*args, stdout=self.output, stderr=self.output)
            self.procs.append(proc)
            started.append(proc)
        return started

    def busy(self, index: int) -> bool:
        """True while worker ``index`` runs a job: RQ forks one work horse process per job."""
        return self.procs[index].poll() is None and bool(children(self.procs[index].pid))

    def kill(self, index: int) -> bool:
        """SIGKILL worker ``index`` and its work horse (which RQ puts in a process group of its own).

        Returns whether it was running a job (had a work horse).
        """
        proc = self.procs[index]
        # Find the horse before the worker dies (its children are then re-parented), but kill the worker
        # first: a worker that sees its horse die marks the job failed and carries on.
        horses = children(proc.pid)
        proc.kill()
        for child in horses:
            _signal(child, signal.SIGKILL)
        proc.wait()
        self.killed.append(self.worker_name(index))
        return bool(horses)

    def wait(self, timeout: float) -> bool:
        """Wait until every worker has exited (burst workers do so by themselves); False on timeout."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def alive(self) -> list[int]:
        """Indexes of the workers still running."""
        return [index for index, proc in enumerate(self.procs) if proc.poll() is None]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every worker: SIGTERM (RQ finishes the job in hand), then SIGKILL after ``timeout``."""
        for index in self.alive():
            _signal(self.procs[index].pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for index, proc in enumerate(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for child in children(proc.pid):
                    _signal(child, signal.SIGKILL)
                proc.kill()
                proc.wait()
                self.killed.append(self.worker_name(index))
        self.procs.clear()
