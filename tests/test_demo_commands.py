"""The demo's commands, run the way `make demo` runs them: ``manage.py`` subprocesses on the demo settings,
with real RQ workers (db_workers with ``DELIVERY=tasks``, Celery prefork workers with ``DELIVERY=celery``), a
real Redis (or RabbitMQ) and a database of their own (SQLite, and PostgreSQL when the tests use it)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from redis import Redis

# once: the demo's commands run on databases of their own (a SQLite file, one made on the test server).
pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"^naive: (\d+)/(\d+) fields wrong; safeupdates: (\d+)/(\d+) fields wrong$")


def demo_env(database_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="demo_project.settings",
        DATABASE_URL=database_url,
        REDIS_URL=settings.REDIS_URL,
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


def manage(
    database_url: str, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=demo_env(database_url, **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _postgres_url(name: str) -> str:
    db = settings.DATABASES["default"]
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = f"{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}"
    return f"postgres://{db.get('USER') or 'postgres'}{password}@{host}/{name}"


def row(lines: list[str], label: str) -> list[str]:
    """The cells of the row ``label`` of the stress round's table."""
    (line,) = [line for line in lines if line.strip().startswith(label)]
    return line.strip()[len(label) :].split()


@pytest.fixture(params=["sqlite", "postgresql"])
def demo_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database for the demo: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'demo.sqlite3'}"
        return
    if connection.vendor != "postgresql":
        pytest.skip("the tests run on SQLite: no PostgreSQL server to create the demo database on")
    import psycopg

    # Named after the test database (test_<the database of DATABASE_URL>), like every database the tests make.
    name = f"{connection.settings_dict['NAME']}_demo_{uuid.uuid4().hex[:8]}"
    admin_url = _postgres_url("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _postgres_url(name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.workers
def test_race_demo_shows_the_race_and_safeupdates_fixing_it(demo_database: str, redis: Redis) -> None:
    migrate = manage(demo_database, "migrate", "--no-input", "-v", "0")
    assert migrate.returncode == 0, migrate.stderr
    run = manage(
        demo_database,
        "race_demo",
        "--toggles", "40", "--records", "3", "--workers", "2", "--seed", "3",
        timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.rstrip().splitlines()
    # (a) the story: the naive path ends on the first click, safeupdates on the last one.
    assert "    result: active=True  WRONG: the last click said False" in lines
    assert "    result: active=False  right" in lines
    # (b) the stress round's table: every duplicate absorbed by safeupdates, none by the naive path.
    naive_absorbed, safe_absorbed = row(lines, "duplicates absorbed")
    duplicates = naive_absorbed.split("/")[1]
    assert (naive_absorbed, safe_absorbed) == (f"0/{duplicates}", f"{duplicates}/{duplicates}")
    assert row(lines, "stale writes dropped")[0] == "0"
    # What the SIGKILL did, in words under the table: on the safeupdates path nothing is lost.
    _naive_cut, safe_cut = map(int, row(lines, "jobs cut off by SIGKILL"))
    words = " ".join(line.strip() for line in lines)
    cut = f"{safe_cut} job" if safe_cut else "no job"
    assert "The SIGKILL cut off" in words and f"On the safeupdates path it cut off {cut}" in words, words
    assert ("Nothing was lost." in words) is (safe_cut > 0), words
    match = SUMMARY.match(lines[-1])
    assert match, lines[-1]
    _naive_wrong, naive_total, safe_wrong, safe_total = map(int, match.groups())
    assert (naive_total, safe_total) == (9, 9)
    assert safe_wrong == 0
    # The demo cleaned up after itself: its queue is empty and no worker of it is left registered.
    assert redis.llen("rq:queue:race_demo") == 0
    assert not [key for key in redis.smembers("rq:workers") if b"race-demo" in key]


@pytest.mark.workers
def test_race_demo_on_django_tasks_runs_without_redis(tmp_path: Path) -> None:
    """``DELIVERY=tasks make demo``: django-tasks-db and db_worker processes; Redis unreachable."""
    url = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    no_redis = {"DELIVERY": "tasks", "REDIS_URL": "redis://127.0.0.1:1/0"}
    migrate = manage(url, "migrate", "--no-input", "-v", "0", env=no_redis)
    assert migrate.returncode == 0, migrate.stderr
    plan = ("--toggles", "40", "--records", "3", "--workers", "2", "--seed", "3")
    run = manage(url, "race_demo", *plan, timeout=240, env=no_redis)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.rstrip().splitlines()
    assert lines[0].endswith("TASKS backend 'default', task queue 'race_demo', no Redis"), lines[0]
    assert "    result: active=True  WRONG: the last click said False" in lines
    assert "    result: active=False  right" in lines
    match = SUMMARY.match(lines[-1])
    assert match, lines[-1]
    assert match.group(3, 4) == ("0", "9")


@pytest.mark.workers
@pytest.mark.parametrize(
    ("demo_database", "broker"), [("sqlite", "redis"), ("postgresql", "rabbitmq")], indirect=["demo_database"]
)
def test_race_demo_on_celery_with_prefork_workers(demo_database: str, broker: str, redis: Redis) -> None:
    """``DELIVERY=celery make demo``: the demo's Celery app (demo_project/celery.py), ``celery -A demo_project
    worker --pool prefork -c 2`` processes, on the tests' Redis or on a RabbitMQ vhost of the test's own."""
    env = {"DELIVERY": "celery", "CELERY_BROKER_URL": settings.REDIS_URL}
    vhost = None
    if broker == "rabbitmq":
        from tests.celery_harness import RabbitVhost, rabbitmq_missing

        if missing := rabbitmq_missing():
            pytest.skip(missing)
        vhost = RabbitVhost().create()
        env["CELERY_BROKER_URL"] = vhost.url()
    try:
        migrate = manage(demo_database, "migrate", "--no-input", "-v", "0", env=env)
        assert migrate.returncode == 0, migrate.stderr
        plan = ("--toggles", "40", "--records", "3", "--workers", "2", "--seed", "3")
        run = manage(demo_database, "race_demo", *plan, timeout=300, env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        lines = run.stdout.rstrip().splitlines()
        assert lines[0].startswith("safeupdates race demo on Celery: "), lines[0]
        assert f"broker {'redis' if broker == 'redis' else 'amqp'}://" in lines[0], lines[0]
        # (a) the story: the naive path ends on the first click, safeupdates on the last one.
        assert "    result: active=True  WRONG: the last click said False" in lines
        assert "    result: active=False  right" in lines
        # (b) 0 applied twice: every duplicate delivery absorbed by safeupdates, none by the naive path.
        naive_absorbed, safe_absorbed = row(lines, "duplicates absorbed")
        duplicates = naive_absorbed.split("/")[1]
        assert (naive_absorbed, safe_absorbed) == (f"0/{duplicates}", f"{duplicates}/{duplicates}"), lines
        # 0 lost: every field ends on its newest click, though a worker was SIGKILLed mid-round.
        match = SUMMARY.match(lines[-1])
        assert match, lines[-1]
        assert match.group(3, 4) == ("0", "9"), run.stdout
        _naive_cut, safe_cut = map(int, row(lines, "jobs cut off by SIGKILL"))
        words = " ".join(line.strip() for line in lines)
        assert ("Nothing was lost." in words) is (safe_cut > 0), words
        # The demo cleaned up after itself: its queue is empty, and a Redis broker keeps no message of it
        # that a killed worker held (kombu would bring it back an hour later).
        status = manage(demo_database, "safeupdates_status", "--json", env=env)
        assert '"pending": 0' in status.stdout, status.stdout + status.stderr
        if broker == "redis":
            assert redis.llen("race_demo") == 0
            assert not [raw for raw in redis.hvals("unacked") if b'"race_demo"' in raw]
    finally:
        if vhost is not None:
            vhost.delete()


#: Runs ``manage.py`` with Celery (and kombu) impossible to import, as in a project without the [celery] extra.
WITHOUT_CELERY = """
import runpy, sys
from importlib.abc import MetaPathFinder

class NoCelery(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("celery", "kombu"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None

sys.meta_path.insert(0, NoCelery())
sys.argv = ["manage.py", *sys.argv[1:]]
runpy.run_path("manage.py", run_name="__main__")
"""


def test_the_rq_demo_and_its_serve_command_never_import_celery(tmp_path: Path) -> None:
    """Celery is an optional extra: the demo project (settings, commands, worker management) loads without it."""
    env = demo_env(f"sqlite:///{tmp_path / 'demo.sqlite3'}")
    env.pop("DELIVERY", None)
    for args in (
        ("check",),
        ("migrate", "--no-input", "-v", "0"),
        ("demo_serve", "--help"),
        ("race_demo", "--workers", "1"),
    ):
        run = subprocess.run(
            [sys.executable, "-c", WITHOUT_CELERY, *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert "blocked by the test" not in run.stdout + run.stderr, (args, run.stderr)
        if args[0] == "race_demo":
            assert "--workers must be at least 2" in run.stderr, run.stderr
        else:
            assert run.returncode == 0, (args, run.stderr)


@pytest.mark.parametrize(
    ("delivery", "pool", "workers"),
    [("rq", "Workers", "RQ worker"), ("tasks", "TaskWorkers", "db_worker"), ("celery", "CeleryWorkers", "Celery")],
)
def test_demo_serve_starts_the_workers_of_the_delivery(delivery: str, pool: str, workers: str, settings: Any) -> None:
    """``DELIVERY=... make serve``: the apply queue's workers are those of the delivery (it started
    rqworkers whatever DELIVERY said, and nothing ran Django tasks or Celery tasks)."""
    from demo_project.toggles.management.commands.demo_serve import Command

    settings.SAFEUPDATES_DELIVERY = delivery
    apply_pool, _slow_pool, what = Command._pools()
    assert (type(apply_pool).__name__, what.startswith(workers)) == (pool, True)


def test_race_demo_needs_two_workers(tmp_path: Path) -> None:
    run = manage(f"sqlite:///{tmp_path / 'demo.sqlite3'}", "race_demo", "--workers", "1")
    assert run.returncode != 0
    assert "--workers must be at least 2: the stress round kills one of them." in run.stderr


def test_race_demo_says_to_migrate_first(tmp_path: Path) -> None:
    run = manage(f"sqlite:///{tmp_path / 'empty.sqlite3'}", "race_demo")
    assert run.returncode != 0
    assert "the demo database is not migrated: run `python manage.py migrate` first." in run.stderr


def test_demo_app_has_no_missing_migrations(tmp_path: Path) -> None:
    run = manage(f"sqlite:///{tmp_path / 'demo.sqlite3'}", "makemigrations", "toggles", "--check", "--dry-run")
    assert run.returncode == 0, run.stdout + run.stderr


def check_redis(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "demo_project.check_redis"],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_check_redis_passes_when_redis_answers() -> None:
    run = check_redis(settings.REDIS_URL)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


def test_check_redis_says_how_to_start_redis() -> None:
    run = check_redis("redis://127.0.0.1:1/0")
    assert run.returncode == 1
    message = run.stderr.strip()
    assert message.startswith("Redis is not reachable at redis://127.0.0.1:1/0 (")
    assert "start it with `redis-server --daemonize yes`" in message
    assert len(message.splitlines()) == 1


def _cmdline(pid: int) -> str:
    """The command line of process ``pid`` ("" once it is gone)."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pids: list[int]) -> list[str]:
    """The command lines of those of ``pids`` that still run (a zombie has ended: it only waits to be reaped)."""
    alive = []
    for pid in pids:
        try:
            state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(f"{pid} {_cmdline(pid)}")
    return alive


#: What the command line of a worker of each delivery contains.
WORKER_COMMAND = {"rq": "rqworker", "tasks": "db_worker", "celery": "-m celery"}


def _delivery_env(delivery: str) -> dict[str, str]:
    env = {"DELIVERY": delivery}
    if delivery == "celery":
        env["CELERY_BROKER_URL"] = settings.REDIS_URL
    return env


def _sigterm_and_collect(
    proc: subprocess.Popen[bytes], started: Any, what: str, timeout: float = 120, sig: int = signal.SIGTERM
) -> tuple[int, list[int]]:
    """Wait until ``started(children)`` says ``proc`` has started what the test needs (its direct children's
    command lines), send it ``sig`` (SIGTERM by default, as ``docker stop``, systemd and ``Popen.terminate()``
    do), and return its exit status with every process that was below it then."""
    from demo_project.processes import children, descendants, wait_until

    def ready() -> bool:
        return proc.poll() is not None or started([_cmdline(pid) for pid in children(proc.pid)])

    assert wait_until(ready, timeout, interval=0.2), f"{what} did not start within {timeout:.0f} s"
    assert proc.poll() is None, f"{what} exited early with status {proc.returncode}"
    below = descendants(proc.pid)
    proc.send_signal(sig)
    try:
        return proc.wait(90), below
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def _kill_leftovers(pids: list[int]) -> None:
    """SIGKILL what a failing test left running, so that it does not outlive the test."""
    for pid in pids:
        if _alive([pid]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.workers
@pytest.mark.parametrize(
    ("delivery", "sig"),
    [("rq", signal.SIGTERM), ("tasks", signal.SIGTERM), ("celery", signal.SIGTERM), ("rq", signal.SIGHUP)],
    ids=lambda value: value.name if isinstance(value, signal.Signals) else value,
)
def test_demo_serve_stops_its_workers_and_relay_on_a_stop_signal(
    delivery: str, sig: int, tmp_path: Path, redis: Redis
) -> None:
    """``make serve`` stopped by SIGTERM (``docker stop``, systemd, a test's ``terminate()``) or SIGHUP (its
    terminal closed) stops what it started, as Ctrl-C does, and exits 0: its server, workers and relay run
    in sessions of their own, so nothing else stops them."""
    from demo_project.processes import wait_until

    url = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    env = _delivery_env(delivery)
    migrate = manage(url, "migrate", "--no-input", "-v", "0", env=env)
    assert migrate.returncode == 0, migrate.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "demo_serve", f"127.0.0.1:{port}", "--relay-interval", "1"],
            cwd=ROOT, env=demo_env(url, **env), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    below: list[int] = []

    def started(commands: list[str]) -> bool:
        wanted = (WORKER_COMMAND[delivery], "safeupdates_relay", "runserver")
        return all(any(part in command for command in commands) for part in wanted)

    try:
        status, below = _sigterm_and_collect(proc, started, "demo_serve", sig=sig)
        output = log.read_text(errors="replace")
        assert status == 0, output
        assert "stopping…" in output, output
        wait_until(lambda: not _alive(below), 10)
        assert not _alive(below), output
    finally:
        _kill_leftovers(below)


@pytest.mark.workers
@pytest.mark.parametrize(
    ("delivery", "sig"),
    [
        ("rq", signal.SIGTERM),
        ("tasks", signal.SIGTERM),
        ("celery", signal.SIGTERM),
        ("rq", signal.SIGINT),  # Ctrl-C
        ("rq", signal.SIGHUP),  # its terminal closed
    ],
    ids=lambda value: value.name if isinstance(value, signal.Signals) else value,
)
def test_race_demo_stops_its_workers_on_a_stop_signal(delivery: str, sig: int, tmp_path: Path, redis: Redis) -> None:
    """A race demo stopped by SIGTERM, Ctrl-C or SIGHUP in the middle of its stress round stops the workers
    it started (and lets another demo run on this Redis), then exits 128 + the signal's number saying so,
    without a traceback."""
    from demo_project.processes import wait_until

    url = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    env = _delivery_env(delivery)
    migrate = manage(url, "migrate", "--no-input", "-v", "0", env=env)
    assert migrate.returncode == 0, migrate.stderr
    plan = ("--toggles", "400", "--records", "3", "--workers", "2", "--seed", "3")
    log = tmp_path / "race.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "race_demo", *plan],
            cwd=ROOT, env=demo_env(url, **env), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    below: list[int] = []

    def stress_round(commands: list[str]) -> bool:
        # The story runs one worker at a time; the stress round its two.
        return sum(WORKER_COMMAND[delivery] in command for command in commands) >= 2

    try:
        status, below = _sigterm_and_collect(proc, stress_round, "the stress round of race_demo", 240, sig)
        output = log.read_text(errors="replace")
        assert status == 128 + sig, output
        name = signal.Signals(sig).name
        assert f"race_demo was stopped by {name}; the workers it started are stopped." in output, output
        assert "Traceback" not in output, output
        wait_until(lambda: not _alive(below), 10)
        assert not _alive(below), output
        assert redis.get("race_demo:running") is None
    finally:
        _kill_leftovers(below)
