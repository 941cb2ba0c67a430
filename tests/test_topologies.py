"""The write path, the job path and the request log's maintenance under each way of reaching PostgreSQL.

The cases run under the topology the suite runs under (``SAFEUPDATES_TEST_TOPOLOGY``, tests/settings.py:
``direct`` in a plain run). :func:`test_each_topology` (marker ``topologies``; ``make test-topologies``)
runs them again under every other topology, each in a pytest of its own with the environment
``python -m tests.pooler TOPOLOGY`` gives it: through a PgBouncer of its own in transaction mode (with
the settings docs/deployment.md asks for there: prepared statements off on Debian's 1.18, on with 1.24's
``max_prepared_statements``) and in session mode, on Django's connection pool (max_size 2), and on
persistent connections with health checks.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import threading
import uuid
from typing import Any

import django_rq
import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings

from safeupdates import enqueue_update
from safeupdates.exceptions import LockUnavailable, StaleObjectError
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.factories import DocumentFactory, ProfileFactory
from tests.pooler import TOPOLOGIES
from tests.testapp.models import Document, Profile
from tests.workers import ROOT, RowLock, run_threads, wait_until

pytestmark = pytest.mark.usefixtures("postgres_only")


def topology() -> str:
    return str(getattr(settings, "SAFEUPDATES_TEST_TOPOLOGY", "direct"))


def direct() -> psycopg.Connection[Any]:
    """A connection of the test's own to the test database, straight to PostgreSQL (not through the
    pooler): to look at pg_stat_activity and pg_locks, and to terminate backends."""
    return psycopg.connect(
        host="127.0.0.1", port=5432, user="postgres", dbname=connection.settings_dict["NAME"], autocommit=True
    )


def others_in_transaction() -> list[tuple[Any, ...]]:
    """The backends of the test database, other than the looker's, inside a transaction or holding a lock
    other than on a virtual transaction id."""
    with direct() as conn:
        return conn.execute(
            "SELECT a.pid, a.state, l.locktype, l.mode FROM pg_stat_activity a "
            "LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype <> 'virtualxid' "
            "WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() "
            "AND a.backend_type = 'client backend' "
            "AND (a.state LIKE 'idle in transaction%%' OR l.pid IS NOT NULL)"
        ).fetchall()


def prepared_by_pgbouncer() -> int:
    """How many prepared statements the PgBouncer of this run holds on its server connections to the test
    database (its admin console's ``SHOW SERVERS``; PgBouncer 1.22+, where it prepares each client's
    statements on the server connection that runs them)."""
    console = ["psql", "-h", "127.0.0.1", "-p", os.environ["SAFEUPDATES_TEST_POOLER_PORT"], "-U", "postgres"]
    shown = subprocess.run(
        [*console, "-d", "pgbouncer", "--csv", "-c", "SHOW SERVERS"], capture_output=True, text=True, check=False
    )
    assert shown.returncode == 0, shown.stderr
    servers = csv.DictReader(shown.stdout.splitlines())
    return sum(int(s["prepared_statements"]) for s in servers if s["database"] == connection.settings_dict["NAME"])


def pending() -> int:
    return ProcessedRequest.objects.filter(status="pending").count()


def idle_queue() -> bool:
    queue = django_rq.get_queue("default")
    return queue.count == 0 and not queue.started_job_registry.count


@pytest.mark.django_db(transaction=True)
def test_the_write_path():
    """save(), update_if_newer() with and without a request id, with_lock() (and its lock timeout, which
    is the transaction's own), bulk_update_if_newer(): each keeps its guarantee under this topology."""
    if topology().startswith("pgbouncer-"):  # through the pooler, not straight to PostgreSQL
        assert str(connection.settings_dict["PORT"]) == os.environ["SAFEUPDATES_TEST_POOLER_PORT"] != "5432"
    profile = ProfileFactory()
    older, newer = next_version(), next_version()
    assert Profile.objects.update_if_newer(profile.pk, version=newer, active=True).outcome == "applied"
    assert Profile.objects.update_if_newer(profile.pk, version=older, active=False).outcome == "stale"
    rid = uuid.uuid4()
    for expected in ("applied", "duplicate", "duplicate"):
        result = Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, score=7)
        assert result.outcome == expected
    profile.refresh_from_db()
    assert (profile.active, profile.score) == (True, 7)

    with Profile.objects.with_lock(profile.pk, timeout=5) as locked:
        locked.name = "locked"
        locked.save()
    with RowLock(Profile, profile.pk), pytest.raises(LockUnavailable):  # noqa: SIM117
        with Profile.objects.with_lock(profile.pk, timeout=0.2):
            pass
    # SET LOCAL: the lock timeout ended with its transaction, on whatever server connection it ran.
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"

    others = [ProfileFactory() for _ in range(3)]
    version = next_version()
    result = Profile.objects.bulk_update_if_newer([(p.pk, version, {"newsletter": True}) for p in others])
    assert (result.applied, result.stale, result.missing) == (3, 0, 0)
    result = Profile.objects.bulk_update_if_newer([(p.pk, older, {"newsletter": False}) for p in others])
    assert (result.applied, result.stale) == (0, 3)

    # A checked save() (prepared where prepared statements are on) refuses a stale copy.
    document = DocumentFactory()
    stale_copy = Document.objects.get(pk=document.pk)
    document.title = "first"
    document.save()
    stale_copy.title = "second"
    with pytest.raises(StaleObjectError):
        stale_copy.save()
    document.refresh_from_db()
    assert document.title == "first"
    assert others_in_transaction() == []
    if topology() == "pgbouncer-prepared":  # the guarded statements ran prepared, through PgBouncer's own
        assert prepared_by_pgbouncer() > 0


@pytest.mark.workers
def test_enqueue_apply_verify_and_purge_with_a_worker(workers):
    """Requests enqueued, applied by a real rqworker (--with-scheduler) under this topology, one of them
    delivered again by the relay after its job was lost; then safeupdates_verify finds no drift and
    safeupdates_purge deletes the terminal requests."""
    profiles = [ProfileFactory() for _ in range(5)]
    requests = [enqueue_update(p, **{field: True}) for p in profiles for field in ("active", "newsletter")]
    # One record's job lost before any worker ran it: only the relay (a pass from this process, under
    # this topology) can bring it.
    orphan = ProfileFactory()
    orphaned = enqueue_update(orphan, dark_mode=True)
    queue = django_rq.get_queue("default")
    lost = [job_id for job_id in queue.job_ids if str(orphaned.request_id) in str(queue.fetch_job(job_id).args)]
    assert len(lost) == 1
    queue.remove(lost[0])
    workers.start(1)
    assert wait_until(lambda: pending() == 1, 60), workers.logs()
    call_command("safeupdates_relay", "--older-than", "0", verbosity=0)
    requests.append(orphaned)
    assert wait_until(lambda: pending() == 0, 60), workers.logs()
    orphan.refresh_from_db()
    assert orphan.dark_mode
    assert {r.status for r in ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests])} == {"applied"}
    assert all(p.active and p.newsletter for p in Profile.objects.filter(pk__in=[p.pk for p in profiles]))
    call_command("safeupdates_verify", verbosity=0)  # exits with status 1 on drift
    call_command("safeupdates_purge", "--older-than", "0", "--pause", "0", verbosity=0)
    assert not ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests]).exists()
    assert wait_until(idle_queue, 30)
    assert wait_until(lambda: others_in_transaction() == [], 10), others_in_transaction()


@pytest.mark.django_db(transaction=True)
def test_the_admins_conflict_safe_save(admin_client):
    """The admin's change form: a form opened before a queued update landed that edits the field it
    changed is refused and nothing is written over; the form opened again saves."""
    from django.urls import reverse

    from tests.htmlforms import form_data

    profile = ProfileFactory(name="ann")
    url = reverse("admin:testapp_profile_change", args=[profile.pk])
    stale = {**form_data(admin_client.get(url).content, "profile_form"), "_save": "Save"}
    assert Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), score=3).applied
    response = admin_client.post(url, {**stale, "name": "anna", "score": "4"})  # score: the request's field
    assert response.status_code == 200 and "was changed by someone else" in response.content.decode()
    profile.refresh_from_db()
    assert (profile.name, profile.score) == ("ann", 3)
    fresh = {**form_data(admin_client.get(url).content, "profile_form"), "_save": "Save"}
    assert admin_client.post(url, {**fresh, "name": "anna"}).status_code == 302
    profile.refresh_from_db()
    assert (profile.name, profile.score) == ("anna", 3)
    assert others_in_transaction() == []


@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
def test_enqueue_apply_on_django_tasks_with_db_workers(tmp_path):
    """SAFEUPDATES_DELIVERY = "tasks" on django-tasks-db's backend: requests enqueued and applied by real
    db_worker processes under this topology (they claim tasks with SELECT ... FOR UPDATE SKIP LOCKED)."""
    from demo_project.processes import TaskWorkers

    pool = TaskWorkers(tmp_path, backend="db", name="topology")
    try:
        with override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="db"):
            profiles = [ProfileFactory() for _ in range(4)]
            requests = [enqueue_update(p, **{field: True}) for p in profiles for field in ("active", "dark_mode")]
        pool.start(2)
        assert wait_until(lambda: pending() == 0, 60), pool.logs()
    finally:
        pool.stop()
    assert {r.status for r in ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests])} == {"applied"}
    assert all(p.active and p.dark_mode for p in Profile.objects.filter(pk__in=[p.pk for p in profiles]))
    assert wait_until(lambda: others_in_transaction() == [], 10), others_in_transaction()


@pytest.mark.django_db(transaction=True)
def test_threads_on_a_small_pool_leak_no_lock_timeout_or_transaction():
    """Django's pool (max_size 2) under six threads that apply updates, take row locks with a lock
    timeout and lose the race for one: every connection handed back is idle, outside a transaction,
    with the default lock timeout."""
    if topology() != "django-pool":
        pytest.skip("django-pool only")
    from safeupdates.jobs import apply_update

    profiles = [ProfileFactory() for _ in range(6)]
    requests = [enqueue_update(p, score=n) for n, p in enumerate(profiles)]
    todo = list(zip(profiles, requests, strict=True))
    lock = threading.Lock()
    contended = profiles[0]

    def work() -> None:
        with lock:
            profile, request = todo.pop()
        apply_update(str(request.request_id))
        Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), dark_mode=True)
        try:
            with Profile.objects.with_lock(contended.pk, timeout=0.05):
                Profile.objects.filter(pk=contended.pk).update(note="x")
        except LockUnavailable:
            pass

    run_threads(work, 6)
    assert pending() == 0
    connections.close_all()  # this thread's connection, back to the pool
    pool = connection.pool
    assert pool is not None and pool.max_size == 2
    held = [pool.getconn(timeout=10) for _ in range(pool.max_size)]
    try:
        for raw in held:
            assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert raw.execute("SHOW lock_timeout").fetchone()[0] == "0"
    finally:
        for raw in held:
            pool.putconn(raw)
    assert others_in_transaction() == []


def terminate(pids: list[int]) -> None:
    with direct() as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", [pid])


def worker_backends() -> list[int]:
    """The backends of the test database other than the test's own (the worker's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        own = cursor.fetchone()[0]
    with direct() as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        ).fetchall()
    return [pid for (pid,) in rows if pid != own]


@pytest.mark.workers
def test_a_backend_terminated_between_jobs_and_mid_job(workers):
    """Persistent connections (CONN_MAX_AGE, CONN_HEALTH_CHECKS): the worker's backend terminated
    between two jobs, then in the middle of one (waiting on a row lock): the next job reconnects, the
    interrupted one is retried, and each record ends applied once."""
    if topology() != "persistent":
        pytest.skip("persistent only")
    first, second = ProfileFactory(), ProfileFactory()
    workers.start(1)
    one = enqueue_update(first, active=True)
    assert wait_until(lambda: ProcessedRequest.objects.get(pk=one.pk).status == "applied", 60), workers.logs()
    terminate(worker_backends())
    two = enqueue_update(first, newsletter=True)
    assert wait_until(lambda: ProcessedRequest.objects.get(pk=two.pk).status == "applied", 60), workers.logs()

    with RowLock(Profile, second.pk):
        three = enqueue_update(second, active=True)

        def blocked() -> list[int]:
            with direct() as conn:
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchall()
            return [pid for (pid,) in rows]

        assert wait_until(lambda: bool(blocked()), 30), workers.logs()
        terminate(blocked())
    assert wait_until(lambda: ProcessedRequest.objects.get(pk=three.pk).status == "applied", 60), workers.logs()
    assert wait_until(idle_queue, 30)
    statuses = list(ProcessedRequest.objects.filter(pk__in=[one.pk, two.pk, three.pk]).values_list("status", flat=True))
    assert statuses == ["applied"] * 3
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.active, first.newsletter, second.active) == (True, True, True)


@pytest.mark.topologies
@pytest.mark.parametrize("name", [t for t in TOPOLOGIES if t != "direct"])
def test_each_topology(name):
    """This module's cases under topology ``name``, in a pytest of its own started by ``python -m
    tests.pooler`` (which starts and stops the PgBouncer of the pgbouncer-* ones), on a database of
    its own (``<NAME>_topo``)."""
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/safeupdates")
    if not url.startswith("postgres"):
        pytest.skip("PostgreSQL only")
    env = {**os.environ, "DATABASE_URL": f"{url.rstrip('/')}_topo"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--no-cov", "-m", "not topologies"]
    result = subprocess.run(
        [sys.executable, "-m", "tests.pooler", name, "--", *command, __file__],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
