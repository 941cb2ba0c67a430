"""The fault harness: a scenario's own PostgreSQL and Redis, the test process pointed at them as the
web process, real workers and the relay as subprocesses, a burst of toggles that survives the fault, and
the checks of the guarantees (``verify``)."""

from __future__ import annotations

import contextlib
import json
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import environ
import psycopg
from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, connections, transaction
from django.test import override_settings

from demo_project.processes import TaskWorkers
from safeupdates import enqueue_update
from safeupdates.jobs import is_transient
from safeupdates.models import ProcessedRequest, RequestKind
from tests.faults.settings import SAFEUPDATES_RETRY, sentinel_queues
from tests.servers import OwnPostgres, OwnRedis, OwnRedisFailover
from tests.settings import RQ_QUEUES as TEST_QUEUES
from tests.testapp.models import Profile
from tests.workers import ROOT, Workers, subprocess_env, wait_until

if TYPE_CHECKING:
    from tests.celery_harness import RabbitVhost

FIELDS = ("active", "newsletter", "dark_mode")
#: SAFEUPDATES_RELAY_AFTER of the scenarios, and the relay's --interval: together, the relay window.
RELAY_AFTER, RELAY_INTERVAL = 2, 1
RELAY_WINDOW = RELAY_AFTER + RELAY_INTERVAL

# Every write to a profile row, as the database saw it: the at-most-once evidence (see verify()).
AUDIT_SQL = """
CREATE TABLE fault_writes (
    id bigserial PRIMARY KEY,
    profile_id bigint NOT NULL,
    old_versions jsonb NOT NULL,
    new_versions jsonb NOT NULL,
    active boolean NOT NULL,
    newsletter boolean NOT NULL,
    dark_mode boolean NOT NULL,
    client text NOT NULL DEFAULT current_setting('application_name')
);
CREATE FUNCTION fault_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_writes (profile_id, old_versions, new_versions, active, newsletter, dark_mode)
    VALUES (NEW.id, OLD.field_versions, NEW.field_versions, NEW.active, NEW.newsletter, NEW.dark_mode);
    RETURN NEW;
END $$;
CREATE TRIGGER fault_audit AFTER UPDATE ON testapp_profile FOR EACH ROW EXECUTE FUNCTION fault_audit();
"""


class SupervisedWorkers(Workers):
    """:class:`~tests.workers.Workers` under a supervisor, as production runs them (systemd
    ``Restart=always`` with ``RestartSec=1``, Kubernetes, supervisord): a worker that exits is started
    again a second later with the same arguments. RQ 3.0's worker exits ("found an unhandled exception,
    quitting...", exit code 1) when Redis goes away while it waits for a work horse, so without a
    supervisor a Redis restart or failover during a burst leaves no worker at all."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir)
        self.restarts = 0
        self._specs: list[tuple[tuple[str, ...], bool, dict[str, str] | None]] = []
        self._exited_at: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self._thread.start()

    def start(
        self,
        count: int = 1,
        queues: tuple[str, ...] = ("default",),
        *,
        scheduler: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        with self._lock:
            for _ in range(count):
                self._start_one(queues, scheduler, env)
                self._specs.append((queues, scheduler, env))

    def _start_one(self, queues: tuple[str, ...], scheduler: bool, env: dict[str, str] | None) -> None:
        # Workers names its log after the number of processes: keep the log of an earlier holder of the name.
        log = self.log_dir / f"worker-{len(self.procs)}.log"
        if log.exists():
            log.rename(log.with_suffix(f".{time.monotonic_ns()}.log"))
        super().start(1, queues, scheduler=scheduler, env=env)

    def _supervise(self) -> None:
        while not self._stopping.wait(0.2):
            with self._lock:
                for index, proc in enumerate(self.procs):
                    if proc.poll() is None:
                        continue
                    exited_at = self._exited_at.setdefault(index, time.monotonic())
                    if time.monotonic() - exited_at < 1:
                        continue  # RestartSec=1
                    self._start_one(*self._specs[index])
                    self.procs[index] = self.procs.pop()
                    del self._exited_at[index]
                    self.restarts += 1

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        super().stop()

    def kill(self, index: int = 0) -> bool:
        with self._lock:  # not while the supervisor moves a restarted worker into place
            return super().kill(index)

    def registered(self) -> int:
        """How many live workers have registered with RQ: they listen to their queues."""
        return len(self.rq_states())


class SupervisedTaskWorkers(SupervisedWorkers, TaskWorkers):
    """Real ``db_worker`` processes (django-tasks-db) under the same supervisor. A db_worker exits on the
    first database error it does not expect (``OperationalError`` when PostgreSQL restarts, also while it
    marks a task's result): like an rqworker after a Redis restart, only its supervisor brings it back."""

    def __init__(self, log_dir: Path, *, backend: str) -> None:
        self._serial = 0
        super().__init__(log_dir)
        self.backend = backend

    def _start_one(self, queues: tuple[str, ...], scheduler: bool, env: dict[str, str] | None) -> None:
        self._serial += 1  # a restarted worker gets a --worker-id of its own
        super()._start_one(queues, scheduler, env)

    def worker_id(self, index: int) -> str:
        return f"chaos-{self._serial}"

    def registered(self) -> int:
        """db_workers register nowhere: the live ones."""
        return self.alive()


class Postgres(Protocol):
    """What a site runs on: an :class:`~tests.servers.OwnPostgres`, or a
    :class:`~tests.patroni.PatroniCluster` (whose ``url`` names every node)."""

    @property
    def url(self) -> str: ...

    def init(self) -> object: ...

    def destroy(self) -> None: ...


def database_url(postgres: Postgres, port: int | None = None, application_name: str = "") -> str:
    """The URL of ``postgres`` (through ``port``, a proxy, if given), naming the client in
    ``pg_stat_activity`` so that a scenario can find its connections."""
    url = postgres.url if port is None else f"postgres://postgres@127.0.0.1:{port}/postgres"
    if not application_name:
        return url
    return f"{url}{'&' if '?' in url else '?'}application_name={application_name}"


#: The deliveries a site can run on, by name: the settings of the web process, workers and relay.
DELIVERIES: dict[str, dict[str, str]] = {
    "rq": {"SAFEUPDATES_DELIVERY": "rq"},
    # Django tasks on django-tasks-db's database backend, with db_worker processes.
    "tasks-db": {"SAFEUPDATES_DELIVERY": "tasks", "SAFEUPDATES_TASK_BACKEND": "db"},
    # Django tasks on django-tasks-rq's backend, with rqworkers (tests.settings sets its job class).
    "tasks-rq": {"SAFEUPDATES_DELIVERY": "tasks", "SAFEUPDATES_TASK_BACKEND": "rq"},
    # Celery on a RabbitMQ vhost of the site's own, with prefork workers (tests.celery_harness).
    "celery": {"SAFEUPDATES_DELIVERY": "celery"},
}


class Site:
    """One scenario's world: its own PostgreSQL cluster (migrated, with an audit trigger), its own Redis
    (one server, or a primary, a replica and Sentinels), the test process pointed at them as the web
    process, workers and a relay as subprocesses. :meth:`close` tears everything down. ``delivery`` (a
    key of :data:`DELIVERIES`) is how apply jobs travel: RQ, Django tasks on either task backend, or Celery
    on a RabbitMQ vhost of its own. ``postgres``: what it runs on instead of a new :class:`OwnPostgres`
    (a :class:`~tests.patroni.PatroniCluster`); the site initialises and destroys it."""

    def __init__(
        self, tmp_path: Path, *, sentinel: bool = False, delivery: str = "rq", postgres: Postgres | None = None
    ) -> None:
        self.tmp_path = tmp_path
        self.delivery = delivery
        self.delivery_env = DELIVERIES[delivery]
        self.cleanup = contextlib.ExitStack()
        self.postgres: Postgres = postgres or OwnPostgres()
        self.cleanup.callback(self.postgres.destroy)
        self.vhost: RabbitVhost | None = None
        self.redis: OwnRedis | None = None
        self.failover: OwnRedisFailover | None = None
        if sentinel:
            self.failover = OwnRedisFailover()
            self.cleanup.callback(self.failover.destroy)
            self.redis_env = {
                "REDIS_SENTINELS": ",".join(f"{host}:{port}" for host, port in self.failover.addresses),
                "REDIS_MASTER_NAME": self.failover.master_name,
            }
        else:
            self.redis = OwnRedis()
            self.cleanup.callback(self.redis.destroy)
            self.redis_env = {"REDIS_URL": self.redis.url}
        (tmp_path / "workers").mkdir(parents=True)
        if delivery == "tasks-db":
            self.workers: SupervisedWorkers = SupervisedTaskWorkers(tmp_path / "workers", backend="db")
        elif delivery == "celery":
            from tests.celery_harness import RabbitVhost, SupervisedCeleryWorkers  # it imports this module

            self.vhost = RabbitVhost()
            self.cleanup.callback(self.vhost.delete)
            self.delivery_env = {**self.delivery_env, "CELERY_BROKER_URL": self.vhost.url()}
            self.workers = SupervisedCeleryWorkers(tmp_path / "workers")
        else:
            self.workers = SupervisedWorkers(tmp_path / "workers")
        self.cleanup.callback(self.workers.stop)
        self.relay_proc: subprocess.Popen[bytes] | None = None

    # -- servers and processes ------------------------------------------------------------------------

    def start(self, django_db_blocker: Any) -> Site:
        self.postgres.init()
        if self.vhost is not None:
            self.vhost.create()
        if self.failover is not None:
            self.failover.start()
        else:
            assert self.redis is not None
            self.redis.start()
        self.manage("migrate", "--no-input", "-v", "0")
        with psycopg.connect(database_url(self.postgres), autocommit=True) as conn:
            conn.execute(AUDIT_SQL)  # type: ignore[arg-type]
        self.cleanup.enter_context(self._as_web_process(django_db_blocker))
        return self

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a subprocess on this site's servers (``extra`` overrides)."""
        base = {
            "DJANGO_SETTINGS_MODULE": "tests.faults.settings",
            "DATABASE_URL": database_url(self.postgres),
            "SAFEUPDATES_RELAY_AFTER": str(RELAY_AFTER),
            "PYTHONUNBUFFERED": "1",
            # Without Sentinels a URL; with them, REDIS_SENTINELS (the URL then reaches no server).
            "REDIS_URL": "redis://127.0.0.1:1/0",
        }
        return subprocess_env(**{**base, **self.redis_env, **self.delivery_env, **extra})

    def manage(self, *args: str) -> None:
        subprocess.run([sys.executable, "manage.py", *args], env=self.env(), cwd=ROOT, check=True, timeout=120)

    def rq_queues(self) -> dict[str, dict[str, Any]]:
        if self.failover is not None:
            return sentinel_queues(self.failover.addresses, self.failover.master_name)
        assert self.redis is not None
        return {name: {**queue, "URL": self.redis.url} for name, queue in TEST_QUEUES.items()}

    @contextlib.contextmanager
    def _as_web_process(self, django_db_blocker: Any) -> Iterator[None]:
        """Point this process's ``default`` database and RQ queues at the site: the test is the web process."""
        connection = connections["default"]
        saved = connection.settings_dict
        connection.close()
        connection.settings_dict = {
            **saved,
            **environ.Env.db_url_config(database_url(self.postgres, application_name="web")),
            "CONN_MAX_AGE": 0,
        }
        ContentType.objects.clear_cache()  # its ids are those of another database
        try:
            with (
                django_db_blocker.unblock(),
                override_settings(
                    RQ_QUEUES=self.rq_queues(),
                    SAFEUPDATES_RELAY_AFTER=RELAY_AFTER,
                    SAFEUPDATES_RETRY=SAFEUPDATES_RETRY,
                    **self.delivery_env,
                ),
                self._celery_app(),
            ):
                yield
        finally:
            connection.close()
            connection.settings_dict = saved
            ContentType.objects.clear_cache()

    def _celery_app(self) -> contextlib.AbstractContextManager[object]:
        """With the ``celery`` delivery, this process publishes through an app on the site's vhost."""
        if self.vhost is None:
            return contextlib.nullcontext()
        from tests.celery_harness import celery_delivery

        return celery_delivery(self.vhost.url())

    def start_workers(self, count: int, *, name: str = "worker", numbered: bool = False, **env: str) -> None:
        """``count`` times ``rqworker default --with-scheduler``, as the README starts them (with the
        ``tasks-db`` delivery, ``db_worker --queue-name default``; with ``celery``, a prefork worker).
        ``numbered``: worker ``i`` of the site is ``{name}-{i}`` in ``pg_stat_activity`` (see
        :meth:`worker_waiting_for_a_lock`), else ``name``."""
        for _ in range(count if numbered else 1):
            application_name = f"{name}-{len(self.workers.procs)}" if numbered else name
            url = env.get("DATABASE_URL") or database_url(self.postgres, application_name=application_name)
            self.workers.start(1 if numbered else count, env=self.env(**{**env, "DATABASE_URL": url}))

    def worker_waiting_for_a_lock(self, name: str = "worker") -> int | None:
        """The index of a numbered worker (:meth:`start_workers`) whose job waits for a lock inside its
        transaction, or None."""
        with psycopg.connect(database_url(self.postgres), autocommit=True) as admin:
            rows = admin.execute(
                "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s "
                "AND wait_event_type = 'Lock' AND xact_start IS NOT NULL",
                [f"{name}-%"],
            ).fetchall()
        return int(rows[0][0].rsplit("-", 1)[1]) if rows else None

    def start_relay(self, **env: str) -> None:
        """``safeupdates_relay --interval 1``, as the docs tell operators to run it; ``env`` overrides its
        environment (``DATABASE_URL`` ...)."""
        command = [sys.executable, "manage.py", "safeupdates_relay", "--interval", str(RELAY_INTERVAL)]
        out = (self.tmp_path / "relay.log").open("wb")
        self.relay_proc = subprocess.Popen(
            command,
            env=self.env(**{"DATABASE_URL": database_url(self.postgres, application_name="relay"), **env}),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()

        def stop() -> None:
            assert self.relay_proc is not None
            self.relay_proc.terminate()
            try:
                self.relay_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.relay_proc.kill()
                self.relay_proc.wait()

        self.cleanup.callback(stop)

    def relay_log(self) -> str:
        path = self.tmp_path / "relay.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def relay_enqueued(self) -> int:
        """How many jobs the relay's passes enqueued, from its output lines."""
        return sum(int(n) for n in re.findall(r"enqueued (\d+) job", self.relay_log()))

    def relay_failed_passes(self) -> int:
        return len(re.findall(r"unreachable at", self.relay_log()))

    def worker_errors(self) -> dict[str, int]:
        """The exceptions the workers' jobs raised (a job retried after a fault), by class, from their logs."""
        return dict(Counter(re.findall(r"^(?:\w+\.)*(\w+(?:Error|Exception|Timeout)): ", self.workers.logs(), re.M)))

    def logs(self) -> str:
        """The tails of what the workers and the relay printed, for a failing assertion's message."""
        return f"--- workers:\n{self.workers.logs()[-6000:]}\n--- relay:\n{self.relay_log()[-3000:]}"

    def close(self) -> None:
        self.cleanup.close()

    # -- data -----------------------------------------------------------------------------------------

    def profiles(self, count: int) -> list[int]:
        return [Profile.objects.create(name=f"p{n}").pk for n in range(count)]

    def non_terminal(self) -> int:
        return ProcessedRequest.objects.filter(kind=RequestKind.UPDATE, status="pending").count()


@dataclass
class Burst:
    """Toggles of boolean fields of ``pks`` from this process, 1 to 3 per transaction, as a web
    process would send them. A transaction that fails with a transient error is retried with the same
    request ids until it commits (a commit whose outcome was lost is not recorded twice: the request id
    is known then). ``committed`` holds every request id whose transaction is known to have committed."""

    pks: list[int]
    seed: int
    #: The records that get toggles now; a fault hook may narrow it (records whose jobs only the relay can bring).
    targets: list[int] = field(default_factory=list)
    committed: dict[uuid.UUID, tuple[int, str, bool]] = field(default_factory=dict)
    retries: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    longest_wait: float = 0.0
    seconds: float = 0.0

    def run(
        self,
        total: int,
        hooks: dict[int, Callable[[], None]] | None = None,
        *,
        pace: float = 0.0,
        deadline: float = 180,
    ) -> float:
        """Send ``total`` toggles; call ``hooks[n]`` once ``n`` toggles are committed; take at least
        ``pace`` seconds per transaction. Returns the seconds taken."""
        rng = random.Random(self.seed)
        belief = {(pk, name): False for pk in self.pks for name in FIELDS}
        hooks = dict(hooks or {})
        started = time.monotonic()
        sent = 0
        self.seconds = 0.0
        while sent < total:
            for at in [n for n in hooks if n <= sent]:
                hooks.pop(at)()
            toggles = []
            for _ in range(min(rng.randint(1, 3), total - sent)):
                pk, name = rng.choice(self.targets or self.pks), rng.choice(FIELDS)
                belief[pk, name] = not belief[pk, name]
                toggles.append((uuid.uuid4(), pk, name, belief[pk, name]))
            began = time.monotonic()
            self._commit(toggles, started + deadline)
            time.sleep(max(0.0, pace - (time.monotonic() - began)))
            for rid, pk, name, value in toggles:
                self.committed[rid] = (pk, name, value)
            sent += len(toggles)
        self.seconds = time.monotonic() - started
        return self.seconds

    def _commit(self, toggles: list[tuple[uuid.UUID, int, str, bool]], deadline: float) -> None:
        failing_since = None
        while True:
            try:
                with transaction.atomic():
                    for rid, pk, name, value in toggles:
                        enqueue_update(Profile, pk, request_id=rid, **{name: value})
            except DatabaseError as exc:
                if not is_transient(exc) or time.monotonic() > deadline:
                    raise
                self.retries += 1
                self.errors[type(exc).__name__] += 1
                failing_since = failing_since or time.monotonic()
                connections["default"].close()
                time.sleep(0.05)
                continue
            if failing_since is not None:
                self.longest_wait = max(self.longest_wait, time.monotonic() - failing_since)
            return


@dataclass
class Outcome:
    """What :func:`verify` found: each count must be 0 (``attempts`` and ``statuses`` are for the report)."""

    requests: int
    statuses: dict[str, int]
    attempts: dict[int, int]
    lost: int
    unknown: int
    non_terminal: int
    wrong_fields: int
    double_applied: int
    applied_out_of_order: int
    applied_without_write: int
    written_without_applied: int
    newest_not_applied: int
    writes: int
    writes_by_client: dict[str, int]

    def violations(self) -> dict[str, int]:
        names = (
            "lost",
            "unknown",
            "non_terminal",
            "wrong_fields",
            "double_applied",
            "applied_out_of_order",
            "applied_without_write",
            "written_without_applied",
            "newest_not_applied",
        )
        return {name: getattr(self, name) for name in names if getattr(self, name)}


def verify(burst: Burst) -> Outcome:
    """Check the guarantees on the site's database after the burst.

    - nothing lost: every committed request id is in the log (and the log holds no other);
    - last requested wins: each field equals the value of the newest request (by version) that touched it;
    - at most once, from the audit trigger's record of every row write: a request's version is written
      to its field at most once, a field's version never goes down (no request applied after a newer one
      on the same field), ``applied`` requests are exactly those written, and the newest request of every
      field was applied (never dropped as stale).
    """
    log = {
        r.request_id: r
        for r in ProcessedRequest.objects.filter(kind=RequestKind.UPDATE).only(
            "request_id", "object_id", "version", "changes", "status", "attempts"
        )
    }
    lost = len(set(burst.committed) - set(log))
    unknown = len(set(log) - set(burst.committed))
    expected = {pk: dict.fromkeys(FIELDS, False) for pk in burst.pks}
    newest: dict[tuple[int, str], ProcessedRequest] = {}
    for request in sorted(log.values(), key=lambda r: r.version or 0):
        for name, value in request.changes.items():
            expected[int(request.object_id)][name] = value
            newest[int(request.object_id), name] = request
    stored = {row["pk"]: row for row in Profile.objects.filter(pk__in=burst.pks).values("pk", *FIELDS)}
    wrong = sum(stored[pk][name] != expected[pk][name] for pk in burst.pks for name in FIELDS)

    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT profile_id, old_versions, new_versions FROM fault_writes ORDER BY id")
        rows = cursor.fetchall()
        cursor.execute("SELECT client, count(*) FROM fault_writes GROUP BY client ORDER BY client")
        by_client = dict(cursor.fetchall())
    written: Counter[tuple[int, str, int]] = Counter()
    out_of_order = 0
    for profile_id, old_json, new_json in rows:
        old, new = json.loads(old_json), json.loads(new_json)  # Django's cursor leaves jsonb as text
        for name in FIELDS:
            before = old.get(name, old.get("*", 0))
            after = new.get(name, new.get("*", 0))
            if after != before:
                written[profile_id, name, after] += 1
                out_of_order += after < before
    by_version = {(int(r.object_id), name, r.version): r for r in log.values() for name in r.changes}
    applied = {key for key, r in by_version.items() if r.status == "applied"}
    return Outcome(
        requests=len(log),
        statuses=dict(Counter(r.status for r in log.values())),
        attempts=dict(sorted(Counter(r.attempts for r in log.values()).items())),
        lost=lost,
        unknown=unknown,
        non_terminal=sum(r.status == "pending" for r in log.values()),
        wrong_fields=wrong,
        double_applied=sum(count > 1 for count in written.values()),
        applied_out_of_order=out_of_order,
        applied_without_write=len(applied - set(written)),
        written_without_applied=len(set(written) - applied),
        newest_not_applied=sum(r.status != "applied" for r in newest.values()),
        writes=len(rows),
        writes_by_client=by_client,
    )


class Converged:
    """Times a scenario: from the fault, its end (healed) and the burst's last commit to the moment no
    request is pending any more."""

    def __init__(self) -> None:
        self.fault_at: float | None = None
        self.healed_at: float | None = None
        self.burst_end: float | None = None
        self.done_at: float | None = None

    def fault(self) -> None:
        self.fault_at = time.monotonic()

    def healed(self) -> None:
        self.healed_at = time.monotonic()

    def after_recovery(self) -> float:
        """Seconds from the later of the fault's end and the burst's end to convergence (<= 0: before)."""
        assert self.done_at is not None and self.burst_end is not None and self.fault_at is not None
        return self.done_at - max(self.burst_end, self.healed_at or self.fault_at)

    def summary(self) -> str:
        assert self.fault_at is not None and self.done_at is not None and self.burst_end is not None
        healed = self.healed_at or self.fault_at
        return (
            f"fault lasted {healed - self.fault_at:.1f}s; all terminal {self.done_at - self.fault_at:.1f}s after "
            f"the fault began, {self.done_at - healed:+.1f}s after it ended, {self.done_at - self.burst_end:+.1f}s "
            "after the burst's last commit"
        )


def run_in_thread(target: Callable[[], None]) -> threading.Thread:
    """Run a fault in a thread of its own, so that the burst goes on meanwhile."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)
            raise

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def join(thread: threading.Thread, timeout: float = 60) -> None:
    thread.join(timeout)
    assert not thread.is_alive(), "the fault thread did not finish"
    errors = thread.errors  # type: ignore[attr-defined]
    if errors:
        raise errors[0]


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """:func:`wait_until`, through the database errors of a restart: the question is just asked again."""

    def ask() -> bool:
        try:
            return predicate()
        except DatabaseError:
            connections["default"].close()
            return False

    return wait_until(ask, timeout, interval=0.2)
