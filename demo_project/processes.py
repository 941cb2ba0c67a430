"""Real ``manage.py rqworker`` (and ``db_worker``, Celery workers, ``runserver``, relay ...) subprocesses, for
the demo commands and the tests.

A subprocess gets the settings module, the database and the Redis of the process that starts it, so a
worker started by ``race_demo`` under ``DATABASE_URL=postgres://...``, or by a test on the test database,
works on that same database.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal
from urllib.parse import quote

from django.conf import settings
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent
MANAGE_PY = ROOT / "manage.py"


def database_url(alias: str = "default") -> str:
    """The URL of database ``alias`` as this process uses it (absolute SQLite path; under pytest, the test
    database), for subprocesses."""
    db = connections[alias].settings_dict
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    user = quote(db.get("USER") or "postgres", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a child ``manage.py``: same settings module, database and Redis as ours;
    ``extra`` overrides any of it."""
    env = dict(os.environ)
    # Under override_settings, SETTINGS_MODULE is None: the environment still names the module.
    if settings.SETTINGS_MODULE:
        env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
    env["DATABASE_URL"] = database_url()
    if getattr(settings, "REDIS_URL", None):
        env["REDIS_URL"] = settings.REDIS_URL
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def spawn(
    argv: list[str],
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the project's folder and in its own session, so that it can be stopped as a group,
    with our settings, database and Redis (:func:`subprocess_env`); ``env`` overrides its environment."""
    return subprocess.Popen(
        argv, cwd=ROOT, env=subprocess_env(**(env or {})), stdout=stdout, stderr=stderr, start_new_session=True
    )


def manage_py(
    *args: str,
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``python manage.py *args`` in its own session, so that it can be stopped as a group;
    ``env`` overrides its environment."""
    return spawn([sys.executable, str(MANAGE_PY), *args], stdout=stdout, stderr=stderr, env=env)


#: The signals that stop a demo command as Ctrl-C does: SIGINT (Ctrl-C), SIGTERM (``docker stop``, systemd,
#: ``Popen.terminate()``) and SIGHUP (its terminal closed).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """One of :data:`STOP_SIGNALS`, raised where the main thread is, as Ctrl-C raises :class:`KeyboardInterrupt`
    (see :func:`stop_signals_interrupt`); :attr:`signal` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal = signal.Signals(signum)


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within the block, each of :data:`STOP_SIGNALS` raises :class:`Terminated` in the main thread, so that the
    ``finally`` blocks that stop the workers run.

    The workers, server and relay that the demo commands start run in sessions of their own (so that
    they can be stopped as a group): SIGTERM's and SIGHUP's default action, to die at once, would leave
    them all running. Once one has arrived, the next ones (a second Ctrl-C) are ignored, so that they
    cannot cut the clean-up short (it is bounded: a worker gets 10 s for its warm shutdown, then SIGKILL)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread can set handlers
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        for stop in STOP_SIGNALS:
            signal.signal(stop, signal.SIG_IGN)
        raise Terminated(signum)

    previous = {stop: signal.signal(stop, interrupt) for stop in STOP_SIGNALS}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def _parents() -> dict[int, list[int]]:
    """Every process's children, by parent id, from ``/proc``."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name (2nd field) is in parentheses and may contain spaces: split after it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return parents


def children(pid: int) -> list[int]:
    """The ids of the direct children of process ``pid`` (an RQ worker's work horse)."""
    return _parents().get(pid, [])


def _leads_its_group(pid: int) -> bool:
    """True if process ``pid`` is the leader of a process group of its own (an RQ work horse is)."""
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:  # it exited
        return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``. RQ's work horse leaves the worker's process group (setpgrp), so a
    group kill would miss it: walk the parent links instead."""
    parents = _parents()
    found, todo = [], [pid]
    while todo:
        below = parents.get(todo.pop(), [])
        found += below
        todo += below
    return found


def kill_tree(pid: int, sig: signal.Signals) -> None:
    """Freeze ``pid`` (so it forks no new horse, nor sees its horse die and carries on), then signal it
    and all its descendants."""
    with contextlib.suppress(ProcessLookupError):  # it exited already
        os.kill(pid, signal.SIGSTOP)
    for victim in [*descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, sig)
    if sig != signal.SIGKILL:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@dataclass(frozen=True)
class WorkerOptions:
    """How :meth:`Workers.start` runs its workers: with RQ's scheduler, in burst mode (exit once the queues
    are empty), for at most ``max_jobs`` jobs, at ``verbosity``. A pool ignores what its workers lack."""

    scheduler: bool = True
    burst: bool = False
    max_jobs: int | None = None
    verbosity: int | None = None


class Workers:
    """A pool of real ``manage.py rqworker`` processes, started and stopped (or killed) by the caller.

    Killing a worker also kills its work horse and scheduler process. By default each worker's output
    goes to a log file in ``log_dir`` (a pipe that nobody reads would block the worker once full);
    ``output`` sends it elsewhere instead (``None``: ours; ``subprocess.DEVNULL``). A pool with a
    ``name`` names its workers in RQ (:meth:`worker_name`), so that they can be looked up there.
    """

    def __init__(
        self,
        log_dir: Path | None = None,
        *,
        name: str | None = None,
        output: IO[Any] | int | Literal["log"] | None = "log",
    ) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.name = name
        self.output = output
        self._log_dir = log_dir
        #: The RQ names of the named workers killed so far (their registrations linger in Redis).
        self.killed: list[str] = []
        #: The log file of each worker started, by process id.
        self.log_paths: dict[int, Path] = {}
        #: The environment each worker started was given (beyond ours), by process id.
        self.envs: dict[int, dict[str, str]] = {}

    @property
    def log_dir(self) -> Path:
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="safeupdates-workers-"))
        return self._log_dir

    def worker_name(self, index: int) -> str:
        """The RQ name of worker ``index`` of a named pool: unique per pool and process."""
        return f"{self.name}-{os.getpid()}-{index}"

    def start(
        self,
        count: int = 1,
        queues: tuple[str, ...] = ("default",),
        *,
        scheduler: bool = True,
        burst: bool = False,
        max_jobs: int | None = None,
        verbosity: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """Start ``count`` workers on ``queues``; ``burst`` workers exit once the queues are empty;
        ``env`` overrides their environment (``DATABASE_URL`` ...)."""
        options = WorkerOptions(scheduler=scheduler, burst=burst, max_jobs=max_jobs, verbosity=verbosity)
        for _ in range(count):
            index = len(self.procs)
            argv = self.command(index, queues, options)
            environment = {**self.worker_env(), **(env or {})}
            if self.output != "log":
                proc = spawn(argv, stdout=self.output, stderr=self.output, env=environment)
            else:
                path = self.log_dir / self.log_name(index)
                with open(path, "wb") as log:  # the process keeps its own
                    proc = spawn(argv, stdout=log, stderr=subprocess.STDOUT, env=environment)
                self.log_paths[proc.pid] = path
                self.envs[proc.pid] = dict(env or {})
            self.procs.append(proc)

    def command(self, index: int, queues: tuple[str, ...], options: WorkerOptions) -> list[str]:
        """The command line of worker ``index``: ``manage.py rqworker QUEUES ...``."""
        args = ["rqworker", *queues]
        if self.name is not None:
            args += ["--name", self.worker_name(index)]
        if options.verbosity is not None:
            args += ["-v", str(options.verbosity)]
        if options.burst:
            args.append("--burst")
        if options.max_jobs is not None:
            args += ["--max-jobs", str(options.max_jobs)]
        if options.scheduler:
            args.append("--with-scheduler")
        return [sys.executable, str(MANAGE_PY), *args]

    def worker_env(self) -> dict[str, str]:
        """What every worker's environment adds to ours (before the ``env`` of :meth:`start`)."""
        return {}

    def log_name(self, index: int) -> str:
        """The name of the log file of worker ``index`` in :attr:`log_dir`."""
        return f"worker-{index}.log"

    def busy(self, index: int) -> bool:
        """True while worker ``index`` runs a job: RQ forks one work horse process per job, which leaves
        the worker's process group (``setpgrp``). The scheduler process that ``--with-scheduler`` forks
        beside it stays in the group, and is no job."""
        return self.procs[index].poll() is None and any(
            _leads_its_group(pid) for pid in children(self.procs[index].pid)
        )

    def kill(self, index: int = 0) -> bool:
        """SIGKILL worker ``index`` with its work horse and scheduler, as a crash or an OOM kill would.

        Returns whether it was running a job (had a work horse).
        """
        proc = self.procs[index]
        had_horse = self.busy(index)
        kill_tree(proc.pid, signal.SIGKILL)
        proc.wait()
        if self.name is not None:
            self.killed.append(self.worker_name(index))
        return had_horse

    def wait(self, timeout: float) -> bool:
        """Wait until every worker has exited (burst workers do so by themselves); False on timeout."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop(self) -> None:
        """Stop every worker: SIGTERM (RQ's warm shutdown finishes the job in hand), then SIGKILL what
        is left 10 s later (and any horse or scheduler left behind)."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for index, proc in enumerate(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if self.name is not None:
                    self.killed.append(self.worker_name(index))
            kill_tree(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs.clear()

    def alive(self) -> int:
        """How many workers are still running."""
        return len(self.running())

    def running(self) -> list[int]:
        """Indexes of the workers still running."""
        return [index for index, proc in enumerate(self.procs) if proc.poll() is None]

    def rq_states(self) -> list[str]:
        """The states that the live workers report to RQ (``idle``, ``busy``, ``suspended`` ...), sorted.
        Workers killed earlier stay registered until their key expires: they are left out."""
        import django_rq
        from rq import Worker

        live = {proc.pid for proc in self.procs if proc.poll() is None}
        registered = Worker.all(connection=django_rq.get_connection("default"))
        return sorted(worker.get_state() for worker in registered if worker.pid in live)

    def logs(self) -> str:
        """Everything the workers wrote to their log files, for a failing test's message."""
        if self._log_dir is None:
            return ""
        return "\n".join(path.read_text(errors="replace") for path in sorted(self._log_dir.glob("*.log")))


class TaskWorkers(Workers):
    """A pool of real ``manage.py db_worker`` processes (django-tasks-db's worker of Django tasks, for
    ``SAFEUPDATES_DELIVERY = "tasks"``) on the ``TASKS`` backend ``backend``. A db_worker runs its task
    in its own process (no work horse): :meth:`kill` is a SIGKILL of that process."""

    def __init__(self, log_dir: Path | None = None, *, backend: str = "default", **kwargs: Any) -> None:
        super().__init__(log_dir, **kwargs)
        self.backend = backend

    def worker_id(self, index: int) -> str:
        """The ``--worker-id`` of worker ``index``: what django-tasks-db records on the tasks it claims."""
        return f"{self.name or 'tasks'}-{os.getpid()}-{index}"

    def command(self, index: int, queues: tuple[str, ...], options: WorkerOptions) -> list[str]:
        """``manage.py db_worker`` polling ``queues`` every 50 ms (``scheduler`` is RQ's: ignored; ``burst``
        workers exit once no task is ready)."""
        args = ["db_worker", "--backend", self.backend, "--queue-name", ",".join(queues), "--interval", "0.05"]
        # --skip-checks: on Django 6.1 the system checks connect to every database of DATABASES
        # (docs/deployment.md), and a task worker needs only the one its backend names.
        args += ["--no-startup-delay", "--no-reload", "--skip-checks", "--worker-id", self.worker_id(index)]
        args += ["-v", str(1 if options.verbosity is None else options.verbosity)]
        if options.burst:
            args.append("--batch")
        if options.max_jobs is not None:
            args += ["--max-tasks", str(options.max_jobs)]
        return [sys.executable, str(MANAGE_PY), *args]

    def worker_env(self) -> dict[str, str]:
        return {"SAFEUPDATES_DELIVERY": "tasks", "SAFEUPDATES_TASK_BACKEND": self.backend}

    def busy(self, index: int) -> bool:
        """True while worker ``index`` runs a task (it has claimed one that is still RUNNING)."""
        from django_tasks_db.models import DBTaskResult

        if self.procs[index].poll() is not None:
            return False
        claimed = DBTaskResult.objects.filter(status="RUNNING").values_list("worker_ids", flat=True)
        return any(ids and ids[-1] == self.worker_id(index) for ids in claimed)  # JSON containment: not on SQLite

    def rq_states(self) -> list[str]:
        raise NotImplementedError("db_workers are not RQ workers")


class CeleryWorkers(Workers):
    """Real Celery prefork workers of the Celery app :attr:`app` (``celery -A APP worker --pool prefork -c 2
    -Q QUEUES``; ``SAFEUPDATES_DELIVERY = "celery"``), each in a session of its own, its output in a log
    file (where :meth:`ready` reads that it consumes) unless ``output`` sends it elsewhere. ``scheduler``,
    ``burst``, ``max_jobs`` are RQ's: ignored. :meth:`kill` SIGKILLs a worker with its pool processes;
    :meth:`kill_pool` only its pool processes (the worker sees its tasks' processes lost). Celery is not
    imported here: the workers are ``python -m celery`` subprocesses."""

    #: The ``-A`` of the workers: the demo project's app (``demo_project.celery.app``, which Celery finds
    #: in the package's ``celery`` module).
    app: str = "demo_project"
    #: What the workers' environment adds to ours: the demo's settings read ``DELIVERY``.
    delivery_env: dict[str, str] = {"DELIVERY": "celery"}

    def __init__(self, log_dir: Path | None = None, *, concurrency: int = 2, **kwargs: Any) -> None:
        super().__init__(log_dir, **kwargs)
        self.concurrency = concurrency

    def command(self, index: int, queues: tuple[str, ...], options: WorkerOptions) -> list[str]:
        name = f"{self.name or 'celery'}-{os.getpid()}-{index}-{time.monotonic_ns()}"
        args = [sys.executable, "-m", "celery", "-A", self.app, "worker", "--pool", "prefork"]
        args += ["-c", str(self.concurrency), "-Q", ",".join(queues), "-n", f"{name}@%h", "-l", "INFO"]
        return [*args, "--without-gossip", "--without-mingle", "--without-heartbeat"]

    def worker_env(self) -> dict[str, str]:
        return dict(self.delivery_env)

    def log_name(self, index: int) -> str:
        # Unique: a worker started again under the same index keeps its own log (:meth:`ready` reads it).
        return f"celery-{index}-{time.monotonic_ns()}.log"

    def log_of(self, index: int) -> str:
        path = self.log_paths.get(self.procs[index].pid)
        return path.read_text(errors="replace") if path is not None and path.exists() else ""

    def logs(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in self.log_paths.values() if path.exists())

    def ready(self) -> int:
        """How many live workers have said they are ready (connected, consuming)."""
        return sum(1 for index in self.running() if re.search(r"@\S+ ready\.", self.log_of(index)))

    def wait_ready(self, timeout: float = 90) -> bool:
        return wait_until(lambda: self.ready() == len(self.procs), timeout, interval=0.2)

    def kill_pool(self, index: int) -> int:
        """SIGKILL the pool processes of worker ``index`` (a task's process dies mid-task: an OOM kill);
        the worker itself lives on and starts new ones. Returns how many were killed."""
        victims = children(self.procs[index].pid)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(victims)

    def stop(self) -> None:
        """SIGTERM (Celery's warm shutdown), then SIGKILL what is left after 10 s, pool processes too."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            kill_tree(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs.clear()

    def rq_states(self) -> list[str]:
        raise NotImplementedError("Celery workers are not RQ workers")


def take_messages(app: Any, queue: str) -> list[Any]:
    """Take every message waiting in Celery ``app``'s ``queue`` off the broker (acknowledged), in queue
    order: what a worker would get."""
    messages: list[Any] = []
    with app.connection_for_read() as connection:
        simple = connection.SimpleQueue(queue, no_ack=False)
        try:
            while True:
                try:
                    message = simple.get(block=True, timeout=0.5)
                except simple.Empty:
                    return messages
                message.ack()
                messages.append(message)
        finally:
            simple.close()


def wait_until(
    predicate: Callable[[], bool],
    timeout: float = 60.0,
    interval: float = 0.05,
    *,
    progress: Callable[[], object] | None = None,
) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value.

    With ``progress`` (what the work has done so far: counts of jobs, rows ...), the timeout counts from
    its last change instead. For waits on hundreds of jobs, whose time no bound fits: under coverage
    (which follows every forked work horse) a job takes ten times as long, and a loaded machine slows it
    as much again; a stuck run still fails as soon as a small one would."""
    seen = progress() if progress is not None else None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
        if progress is not None and (now := progress()) != seen:
            seen, deadline = now, time.monotonic() + timeout
    return bool(predicate())
