"""``manage.py safeupdates_status`` and the request log admin's status page: what they show, and the
command's exit status on a healthy system and on a planted stuck request (issue 21.4), and a queue whose
scheduler is gone while its workers live (issue 20 item 11)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
from dataclasses import asdict
from datetime import UTC, datetime, timedelta

import django_rq
import pytest
from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from rq import Worker
from rq.scheduler import RQScheduler
from rq.worker import WorkerStatus

from safeupdates import enqueue_update, status
from safeupdates.contrib.batches.models import Batch
from safeupdates.delivery import QueueHealth
from safeupdates.jobs import apply_update
from safeupdates.management.commands.safeupdates_status import render
from safeupdates.models import ProcessedRequest
from tests.factories import ProfileFactory
from tests.testapp.models import Gadget, Profile
from tests.workers import wait_until


def run_status(*args: str) -> tuple[int, str]:
    """Run the command; return its exit status and what it printed."""
    out = io.StringIO()
    try:
        call_command("safeupdates_status", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def registered_worker(redis, queue_name: str) -> Worker:
    """A worker registered on ``queue_name`` as RQ registers one (no process behind it), gone at the end
    of the test with its Redis database."""
    queue = django_rq.get_queue(queue_name)
    worker = Worker([queue], connection=queue.connection, name=f"registered-{queue_name}")
    worker.register_birth()
    return worker


def plant_stuck_request(seconds: float) -> ProcessedRequest:
    """A pending request created ``seconds`` ago whose job was lost."""
    request = enqueue_update(ProfileFactory(), active=True)
    ProcessedRequest.objects.filter(pk=request.pk).update(created_at=timezone.now() - timedelta(seconds=seconds))
    return request


@pytest.mark.django_db(transaction=True)
class TestCommand:
    def test_healthy(self, redis):
        request = enqueue_update(ProfileFactory(), active=True)
        apply_update(str(request.request_id))
        code, out = run_status("--max-age", "60", "--max-failed", "0")
        assert code == 0
        assert out.splitlines()[0].endswith(": healthy")
        assert "Pending: 0 request(s)\n" in out
        assert "Last hour: 1 applied, 0 failed, 0 rejected, 0 stale (duplicates are not stored: see the metrics)" in out
        assert "Batches: 0 running, 0 reduce_failed" in out
        # The request's job is still queued: it was applied here, by calling the job's function.
        assert "Queue default: 1 queued, 0 scheduled, 0 failed; 0 worker(s) (0 busy), NO scheduler" in out

    def test_busy_workers_and_a_running_scheduler_are_counted(self, redis):
        """What RQ's registries say: three workers registered (RQ's own registration, no process behind
        them), two of them busy, and a scheduler holding the queue's lock."""
        queue = django_rq.get_queue("default")
        states = {"status-b1": WorkerStatus.BUSY, "status-b2": WorkerStatus.BUSY, "status-i": WorkerStatus.IDLE}
        workers = [Worker([queue], connection=queue.connection, name=name) for name in states]
        for worker in workers:
            worker.register_birth()
            worker.set_state(states[worker.name])
        redis.set(RQScheduler.get_locking_key("default"), "a-scheduler", ex=60)
        try:
            out = run_status()[1]
        finally:
            for worker in workers:
                worker.register_death()
        assert "Queue default: 0 queued, 0 scheduled, 0 failed; 3 worker(s) (2 busy), scheduler running" in out

    def test_a_stuck_request_makes_it_unhealthy(self, redis):
        stuck = plant_stuck_request(7200)
        enqueue_update(ProfileFactory(), active=False)  # a fresh one beside it
        registered_worker(redis, "default")  # a worker listens: only the age can make it unhealthy here
        assert run_status("--max-age", "9000")[0] == 0
        code, out = run_status("--max-age", "3600")
        assert code == 1
        # The age is read when the command runs: on a busy machine a second or more after the plant.
        assert out.splitlines()[0] == out.splitlines()[0].split(": ")[0] + ": UNHEALTHY"
        problem = re.fullmatch(
            r"  problem: a request has been pending for (\d+) s \(more than --max-age 3600 s\)\.", out.splitlines()[1]
        )
        assert problem and 7200 <= int(problem[1]) < 7260, out
        oldest = re.search(r"^Pending: 2 request\(s\), the oldest for (\d+) s", out, re.MULTILINE)
        assert oldest and 7200 <= int(oldest[1]) < 7260, out
        code, out = run_status("--json", "--max-age", "3600")
        assert code == 1
        data = json.loads(out)
        assert data["healthy"] is False and data["pending"] == 2
        assert 7200 <= data["oldest_pending_age"] < 7260
        assert data["backlog"] == [
            {"model": "testapp.Profile", "queue": "default", "pending": 2, "oldest_age": data["oldest_pending_age"]}
        ]
        assert stuck.status == "pending"

    def test_failures_beyond_max_failed_make_it_unhealthy(self, redis):
        request = enqueue_update(ProfileFactory(), active=True)
        ProcessedRequest.objects.filter(pk=request.pk).fail(request.request_id, "OperationalError: gone", final=True)
        assert run_status("--max-failed", "1")[0] == 0
        code, out = run_status("--max-failed", "0")
        assert code == 1
        assert "  problem: 1 failed request(s) (more than --max-failed 0)." in out
        assert f"  {request.request_id} update testapp.Profile {request.object_id} after 1 attempt(s): " in out
        data = json.loads(run_status("--json")[1])
        assert [entry["request_id"] for entry in data["failed_requests"]] == [str(request.request_id)]
        assert data["outcomes"]["failed"] == 1

    def test_redis_unreachable_makes_it_unhealthy(self, redis):
        with override_settings(RQ_QUEUES={"default": {"URL": "redis://127.0.0.1:1/0"}}):
            code, out = run_status()
        assert code == 1
        assert "  problem: RQ cannot be asked: Redis unreachable at redis://127.0.0.1:1/0 (Error 111 " in out

    def test_the_backends_error_is_named_for_any_backend(self, redis):
        """``backend_error`` (JSON and attribute) says why the delivery backend could not be asked, whichever it
        is."""
        with override_settings(RQ_QUEUES={"default": {"URL": "redis://127.0.0.1:1/0"}}):
            data = json.loads(run_status("--json")[1])
            snapshot = status.collect()
        assert data["backend_error"].startswith("Redis unreachable at redis://127.0.0.1:1/0 (Error 111 ")
        assert snapshot.backend_error.startswith("Redis unreachable at redis://127.0.0.1:1/0")
        assert status.collect().backend_error == ""

    @pytest.mark.parametrize(("option", "value"), [("--max-age", "nan"), ("--max-age", "-1"), ("--max-failed", "-1")])
    def test_bad_thresholds(self, option, value):
        with pytest.raises(CommandError, match=f"{option} must be"):
            call_command("safeupdates_status", option, value, stdout=io.StringIO())

    def test_without_the_batches_app_there_is_no_batch_section(self, redis):
        apps = [name for name in settings.INSTALLED_APPS if name != "safeupdates.contrib.batches"]
        with override_settings(INSTALLED_APPS=apps):
            snapshot = status.collect(ask_rq=False)
            assert snapshot.batches is None
            assert "Batches" not in run_status()[1]


@pytest.mark.workers
def test_workers_and_a_scheduler_that_is_gone(workers, redis):
    """A worker started --with-scheduler whose scheduler process died (its lock expired): the status
    names the queue; the same worker with a live scheduler is fine."""
    workers.start(1)
    assert wait_until(lambda: bool(redis.exists(RQScheduler.get_locking_key("default"))), 30), workers.logs()
    assert wait_until(lambda: [s.workers for s in status.collect().queues if s.name == "default"] == [1], 30)
    snapshot = status.collect()
    assert snapshot.warnings() == []
    assert "Queue default: 0 queued, 0 scheduled, 0 failed; 1 worker(s) (0 busy), scheduler running" in run_status()[1]

    # The scheduler is a child process of the worker: kill it, and let its lock go as its expiry would.
    [scheduler] = [pid for pid in _children(workers.procs[0].pid)]
    os.kill(scheduler, signal.SIGKILL)
    redis.delete(RQScheduler.get_locking_key("default"))
    snapshot = status.collect()
    [default] = [s for s in snapshot.queues if s.name == "default"]
    assert (default.workers, default.scheduler, default.scheduler_gone) == (1, False, True)
    warning = (
        "queue 'default': 1 worker(s) live but no RQ scheduler runs for it: RQ's retries (0 scheduled) wait for "
        "the relay. Restart the workers with --with-scheduler (see docs/operations.md)."
    )
    assert snapshot.warnings() == [warning]
    code, out = run_status("--max-age", "60")
    assert code == 0  # a warning, not unhealthy: the relay still delivers
    assert f"  warning: {warning}" in out
    assert json.loads(run_status("--json")[1])["queues"][0]["scheduler_gone"] is True


def _children(pid: int) -> list[int]:
    from demo_project.processes import children

    return children(pid)


@pytest.mark.django_db(transaction=True)
def test_admin_status_page(redis, admin_client):
    plant_stuck_request(120)
    changelist = admin_client.get(reverse("admin:safeupdates_processedrequest_changelist"))
    url = reverse("admin:safeupdates_processedrequest_status")
    assert f'href="{url}" id="safeupdates-status-link"' in changelist.content.decode()
    unwatched = admin_client.get(url).content.decode()  # no worker on its queue: the page says so
    assert "no worker is registered on it" in unwatched and "<strong>Healthy</strong>" not in unwatched
    registered_worker(redis, "default")
    page = admin_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "<strong>Healthy</strong>" in html
    # Planted 120 s old by the database's clock; a slow machine renders the page a second or two later.
    [age] = re.findall(r"<h2>Pending: 1, the oldest for (\d+) s</h2>", html)
    assert 120 <= int(age) <= 125, html
    assert f"<td>testapp.Profile</td><td>default</td><td>1</td><td>{age}</td>" in html


@pytest.mark.django_db(transaction=True)
@override_settings(SAFEUPDATES_RELAY_AFTER=60)
def test_records_waiting_for_the_relay_are_counted_in_the_command_and_the_admin(redis, admin_client):
    """A record is waiting for the relay when a request of it has been pending longer than
    SAFEUPDATES_RELAY_AFTER (its job may be lost): two old requests of one record and one of another count
    as two records; a fresh request does not count."""
    old = plant_stuck_request(120)
    again = enqueue_update(old.target, newsletter=True)
    ProcessedRequest.objects.filter(pk=again.pk).update(created_at=timezone.now() - timedelta(seconds=90))
    plant_stuck_request(300)
    enqueue_update(ProfileFactory(), active=True)  # fresh: its job has not had the time to run
    snapshot = status.collect()
    assert (snapshot.relay_due, snapshot.relay_after) == (2, 60)
    out = run_status()[1]
    line = (
        "Waiting for the relay: 2 record(s) with a request pending for more than 60 s (SAFEUPDATES_RELAY_AFTER): "
        "its next pass delivers them again"
    )
    assert line in out.splitlines(), out
    data = json.loads(run_status("--json")[1])
    assert (data["relay_due"], data["relay_after"]) == (2, 60)
    html = admin_client.get(reverse("admin:safeupdates_processedrequest_status")).content.decode()
    assert '<p id="safeupdates-relay-due">Waiting for the relay: <strong>2</strong> record(s)' in html, html


@pytest.mark.django_db(transaction=True)
def test_admin_status_page_needs_the_view_permission(client, django_user_model):
    user = django_user_model.objects.create_user("staff", password="x", is_staff=True)
    client.force_login(user)
    assert client.get(reverse("admin:safeupdates_processedrequest_status")).status_code == 403


# -- the health check tells the truth without a flag (issue 47): real workers, a Redis of its own ----------


@pytest.fixture
def own_redis():
    from tests.servers import OwnRedis

    server = OwnRedis().start()
    yield server
    server.destroy()


@pytest.mark.workers
def test_pending_requests_and_no_worker_on_their_queue_is_unhealthy(workers, redis):
    """A worker runs, but on another queue: the pending request waits for good. Unhealthy by default, with
    what to run; a worker on its queue applies it and the check is healthy again."""
    workers.start(1, queues=("slow",))
    assert wait_until(lambda: bool(Worker.all(queue=django_rq.get_queue("slow"))), 30), workers.logs()
    request = enqueue_update(ProfileFactory(), active=True)
    code, out = run_status()
    assert code == 1, out
    assert (
        "  problem: queue 'default': 1 request(s) pending, and no worker is registered on it (none runs, or its "
        "Redis restarted and lost the workers' registrations): start or restart one: "
        "python manage.py rqworker default --with-scheduler" in out
    )
    data = json.loads(run_status("--json")[1])
    assert data["healthy"] is False and len(data["problems"]) == 1
    workers.start(1)
    assert wait_until(lambda: ProcessedRequest.objects.get(pk=request.pk).status == "applied", 60), workers.logs()
    assert run_status()[0] == 0


@pytest.mark.workers
def test_a_redis_restarted_empty_under_live_workers_is_unhealthy(own_redis, transactional_db, tmp_path):
    """The workers still run, but their Redis restarted empty: their registrations, the scheduler's lock and
    the jobs are gone, and the requests committed meanwhile wait. Unhealthy, saying what to do."""
    from tests.workers import Workers

    queues = {"default": {"URL": own_redis.url}}
    pool = Workers(tmp_path)
    try:
        with override_settings(RQ_QUEUES=queues):
            pool.start(1, env={"REDIS_URL": own_redis.url})
            queue = django_rq.get_queue("default")
            assert wait_until(lambda: bool(Worker.all(queue=queue)), 30), pool.logs()
            request = enqueue_update(ProfileFactory(), active=True)
            assert wait_until(lambda: ProcessedRequest.objects.get(pk=request.pk).status == "applied", 60)
            assert run_status()[0] == 0
            own_redis.stop()
            lost = [enqueue_update(ProfileFactory(), active=True) for _ in range(2)]  # left for the relay
            own_redis.start()  # empty: it keeps nothing on disk
            code, out = run_status()
        assert code == 1, out
        assert "  problem: queue 'default': 2 request(s) pending, and no worker is registered on it" in out
        assert all(ProcessedRequest.objects.get(pk=r.pk).status == "pending" for r in lost)
    finally:
        pool.stop()


@pytest.mark.workers
def test_retries_scheduled_and_no_scheduler_is_unhealthy(workers, redis):
    """A worker started without --with-scheduler, and a retry waiting in the scheduled registry: nothing
    will ever move it to the queue but the relay. Unhealthy by default."""
    workers.start(1, scheduler=False)
    queue = django_rq.get_queue("default")
    assert wait_until(lambda: bool(Worker.all(queue=queue)), 30), workers.logs()
    request = enqueue_update(ProfileFactory(), active=True)
    assert wait_until(lambda: ProcessedRequest.objects.get(pk=request.pk).status == "applied", 60)
    # What RQ's Retry does with a failed job that has retries left: back into the scheduled registry.
    queue.enqueue_in(timedelta(minutes=5), "safeupdates.jobs.apply_update", str(request.request_id))
    code, out = run_status()
    assert code == 1, out
    assert (
        "  problem: queue 'default': 1 job(s) wait in its scheduled registry (retries), and no RQ scheduler runs "
        "for it: restart a worker with --with-scheduler (python manage.py rqworker default --with-scheduler)." in out
    )


@pytest.mark.workers
def test_tasks_delivery_with_every_worker_stopped_is_unhealthy(transactional_db, tmp_path):
    """django-tasks-db's workers leave no heartbeat: when the oldest pending request is older than a
    working system takes (twice SAFEUPDATES_RELAY_AFTER, the job timeout and the retries' back-off), the
    check is unhealthy, and says what to run. With a worker it is healthy."""
    from demo_project.processes import TaskWorkers

    settings_ = {
        "SAFEUPDATES_DELIVERY": "tasks",
        "SAFEUPDATES_TASK_BACKEND": "db",
        "SAFEUPDATES_RELAY_AFTER": 0,
        "SAFEUPDATES_JOB_TIMEOUT": 1,
        "SAFEUPDATES_RETRY": {"max": 0},
    }
    pool = TaskWorkers(tmp_path, backend="db", name="status")
    try:
        with override_settings(**settings_):
            pool.start(1)
            applied = enqueue_update(ProfileFactory(), active=True)
            assert wait_until(lambda: ProcessedRequest.objects.get(pk=applied.pk).status == "applied", 60), pool.logs()
            assert run_status()[0] == 0
            pool.stop()
            stuck = enqueue_update(ProfileFactory(), active=True)
            assert wait_until(lambda: run_status()[0] == 1, 30)
            code, out = run_status()
        assert code == 1, out
        assert re.search(
            r"  problem: a request has been pending for \d+ s, longer than a working system takes \(1 s: "
            r"SAFEUPDATES_STUCK_AFTER\): nothing seems to apply it, and the delivery backend cannot show its "
            r"workers: start one: python manage.py db_worker --queue-name default\.",
            out,
        ), out
        assert ProcessedRequest.objects.get(pk=stuck.pk).status == "pending"
    finally:
        pool.stop()


@pytest.mark.django_db(transaction=True)
def test_a_single_node_gets_a_replication_line_and_no_warning(postgres_only, redis, admin_client):
    """The suite's PostgreSQL has no standby: not highly available, or replicated below PostgreSQL (RDS
    Multi-AZ), which it cannot show; said in a line, not warned of (a primary with standbys:
    tests/faults/test_replication_status.py)."""
    found = status.replication()
    assert found is not None and (found.standbys, found.synchronous, found.synchronous_standby_names) == (0, 0, "")
    assert found.warning() == ""
    code, out = run_status()
    assert code == 0 and "warning" not in out, out
    line = (
        "Replication: no standby streams from this database: a single node, or replication below PostgreSQL "
        "(RDS Multi-AZ, Cloud SQL HA) that it cannot show"
    )
    assert line in out.splitlines(), out
    data = json.loads(run_status("--json")[1])
    assert data["warnings"] == []
    assert data["replication"]["standbys"] == 0 and data["replication"]["summary"] in line
    html = admin_client.get(reverse("admin:safeupdates_processedrequest_status")).content.decode()
    assert '<p id="safeupdates-replication">Replication: no standby streams from this database' in html, html


def test_no_replication_is_read_on_sqlite(db):
    if connection.vendor != "sqlite":
        pytest.skip("what other databases than PostgreSQL get")
    assert status.replication() is None
    assert status.collect(ask_rq=False).replication is None


# -- the verdicts themselves, at each boundary (issue 58): what the command prints of a snapshot -------------
# The scenarios above reach these through real workers (marked `workers`, which `make mutation` leaves out):
# here each branch of Status and Replication is held to the lines `safeupdates_status` prints of it.

CHECKED_AT = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def snapshot(**fields) -> status.Status:
    """A snapshot with nothing pending, failed or queued, but ``fields``."""
    values = {
        "checked_at": CHECKED_AT,
        "backlog": [],
        "outcomes": {},
        "failed": 0,
        "failed_requests": [],
        "batches": None,
        "no_worker": "none runs",
    }
    return status.Status(**(values | fields))


def printed(found: status.Status, **flags) -> list[str]:
    """The lines ``safeupdates_status`` prints of ``found`` (its first says healthy or UNHEALTHY)."""
    return render(found, found.problems(**flags))


def verdicts(found: status.Status, **flags) -> list[str]:
    """The problem and warning lines only."""
    return [line for line in printed(found, **flags) if line.startswith(("  problem: ", "  warning: "))]


def pending(queue: str, count: int, age: float, model: str = "testapp.Profile") -> status.Backlog:
    return status.Backlog(model=model, queue=queue, pending=count, oldest_age=age)


def replicating(standbys=1, synchronous=0, hidden=0, names="", commit="on") -> status.Replication:
    return status.Replication(
        standbys=standbys,
        synchronous=synchronous,
        hidden=hidden,
        synchronous_standby_names=names,
        synchronous_commit=commit,
    )


WHERE = "(docs/deployment.md, High availability)."


class TestReplicationVerdicts:
    def test_a_single_node_is_a_line_and_no_warning(self):
        found = snapshot(replication=replicating(standbys=0))
        lines = printed(found)
        assert lines[0].endswith(": healthy") and verdicts(found) == []
        assert (
            "Replication: no standby streams from this database: a single node, or replication below PostgreSQL "
            "(RDS Multi-AZ, Cloud SQL HA) that it cannot show"
        ) in lines
        assert found.as_json()["warnings"] == []

    def test_asynchronous_standbys_are_a_warning_not_a_problem(self):
        found = snapshot(replication=replicating(standbys=2, names="", commit="on"))
        assert printed(found)[0].endswith(": healthy")
        assert verdicts(found) == [
            "  warning: the primary replicates asynchronously to its 2 standby(s) (synchronous_standby_names is "
            "empty): requests acknowledged just before a failover can be lost with their data; Patroni's "
            f"synchronous_mode (with synchronous_mode_strict) prevents it {WHERE}"
        ]
        assert "Replication: 2 standby(s), 0 synchronous; synchronous_standby_names '', synchronous_commit 'on'" in (
            printed(found)
        )

    @pytest.mark.parametrize("commit", ["off", "local"])
    def test_a_commit_that_waits_for_no_standby_is_a_warning(self, commit):
        found = snapshot(replication=replicating(standbys=1, synchronous=1, names="*", commit=commit))
        assert verdicts(found) == [
            f"  warning: synchronous_commit is {commit!r}: a commit does not wait for any of the 1 standby(s), so "
            f"requests acknowledged just before a failover can be lost with their data {WHERE}"
        ]

    @pytest.mark.parametrize("commit", ["on", "remote_write", "remote_apply"])
    def test_a_synchronous_standby_connected_is_no_warning(self, commit):
        found = snapshot(replication=replicating(standbys=2, synchronous=1, names="ANY 1 (*)", commit=commit))
        assert verdicts(found) == []
        assert (
            "Replication: 2 standby(s), 1 synchronous; synchronous_standby_names 'ANY 1 (*)', "
            f"synchronous_commit {commit!r}"
        ) in printed(found)

    def test_synchronous_standbys_named_and_none_streaming_is_a_warning(self):
        """``synchronous_standby_names`` set and no standby at all: not a single node, but a primary whose
        commits wait (the first test's ``and``); with ``synchronous_commit`` off there is no standby for it
        to skip, so the warning is the missing standby's."""
        for commit in ("on", "off"):
            found = snapshot(replication=replicating(standbys=0, names="pg2", commit=commit))
            assert verdicts(found) == [
                "  warning: no synchronous standby is connected (synchronous_standby_names is 'pg2', 0 standby(s) "
                "streaming): commits wait until one is, or, where the cluster manager drops the setting, are "
                f"acknowledged without a copy {WHERE}"
            ], commit
            assert "Replication: 0 standby(s), 0 synchronous; synchronous_standby_names 'pg2'" in printed(found)[-1]

    def test_standbys_the_user_may_not_see_are_no_warning_and_are_said(self):
        found = snapshot(replication=replicating(standbys=2, synchronous=0, hidden=1, names="*"))
        assert verdicts(found) == []
        assert (
            "Replication: 2 standby(s), 0 synchronous, 1 whose state this user may not see (grant pg_monitor); "
            "synchronous_standby_names '*', synchronous_commit 'on'"
        ) in printed(found)
        data = found.as_json()
        assert data["replication"]["summary"] == found.replication.summary() and data["replication"]["hidden"] == 1


class TestQueueVerdicts:
    def test_pending_requests_on_a_queue_no_worker_consumes(self):
        """Requests of two models on one queue are counted together; a queue with workers, or whose workers
        the backend cannot count, or with nothing pending, is no problem."""
        found = snapshot(
            backlog=[pending("default", 2, 5), pending("default", 1, 3, "testapp.Gadget"), pending("slow", 4, 5)],
            queues=[
                QueueHealth("default", queued=0, workers=0),
                QueueHealth("slow", queued=0, workers=1),
                QueueHealth("idle", queued=0, workers=0),
            ],
            hints={"default": "run a worker on default", "slow": "run a worker on slow"},
        )
        assert verdicts(found) == [
            "  problem: queue 'default': 3 request(s) pending, and no worker is registered on it (none runs): "
            "start or restart one: run a worker on default."
        ]
        assert printed(found)[0].endswith(": UNHEALTHY")
        uncounted = snapshot(backlog=[pending("default", 2, 5)], queues=[QueueHealth("default", queued=0)])
        assert verdicts(uncounted) == [] and printed(uncounted)[0].endswith(": healthy")

    def test_retries_waiting_and_no_scheduler(self):
        """A scheduled retry with no RQ scheduler is a problem; workers without a scheduler and nothing
        scheduled, a warning; a backend that has no scheduler to tell of (None), neither."""
        stuck = snapshot(queues=[QueueHealth("default", queued=0, scheduled=2, workers=1, scheduler=False)])
        assert verdicts(stuck) == [
            "  problem: queue 'default': 2 job(s) wait in its scheduled registry (retries), and no RQ scheduler "
            "runs for it: restart a worker with --with-scheduler (python manage.py rqworker default "
            "--with-scheduler)."
        ]
        idle = snapshot(queues=[QueueHealth("default", queued=0, scheduled=0, workers=3, scheduler=False)])
        assert verdicts(idle) == [
            "  warning: queue 'default': 3 worker(s) live but no RQ scheduler runs for it: RQ's retries (0 "
            "scheduled) wait for the relay. Restart the workers with --with-scheduler (see docs/operations.md)."
        ]
        assert printed(idle)[0].endswith(": healthy")
        for queue in (
            QueueHealth("default", queued=0, scheduled=2, workers=1, scheduler=None),
            QueueHealth("default", queued=0, scheduled=0, workers=1, scheduler=True),
            QueueHealth("default", queued=0, scheduled=0, workers=0, scheduler=False),  # no worker lives
        ):
            assert verdicts(snapshot(queues=[queue])) == [], queue
        data = stuck.as_json()
        assert [entry["scheduler_gone"] for entry in data["queues"]] == [True]
        assert idle.as_json()["warnings"] == [idle.warnings()[0]]

    def test_a_backend_that_cannot_be_asked_is_named(self):
        found = snapshot(backend_error="Redis unreachable", backend_label="the Celery broker")
        assert verdicts(found) == ["  problem: the Celery broker cannot be asked: Redis unreachable"]
        assert "Queues: unknown (Redis unreachable)" in printed(found)


class TestAgeAndFailureVerdicts:
    def test_max_age_is_exceeded_only_past_it(self):
        found = snapshot(backlog=[pending("default", 1, 30.4), pending("slow", 1, 3)])
        assert found.pending == 2 and found.oldest_pending_age == 30.4
        assert verdicts(found, max_age=30.4) == []
        assert verdicts(found, max_age=30) == [
            "  problem: a request has been pending for 30 s (more than --max-age 30 s)."
        ]
        assert verdicts(snapshot(), max_age=0) == []  # nothing pending: no age to exceed
        assert snapshot().oldest_pending_age is None and snapshot().pending == 0

    def test_where_the_backend_shows_no_workers_a_request_older_than_stuck_after_is_a_problem(self):
        """The queue named is the oldest request's; --max-age, when given, replaces SAFEUPDATES_STUCK_AFTER."""
        found = snapshot(
            backlog=[pending("fast", 1, 5), pending("slow", 1, 121), pending("other", 1, 50)],
            stuck_after=120.0,
            hints={"fast": "work fast", "slow": "work slow", "other": "work other"},
        )
        assert verdicts(found) == [
            "  problem: a request has been pending for 121 s, longer than a working system takes (120 s: "
            "SAFEUPDATES_STUCK_AFTER): nothing seems to apply it, and the delivery backend cannot show its "
            "workers: start one: work slow."
        ]
        assert verdicts(found, max_age=200) == []
        assert verdicts(snapshot(backlog=[pending("slow", 1, 120)], stuck_after=120.0)) == []
        assert verdicts(snapshot(stuck_after=0.0)) == []  # nothing pending
        assert verdicts(snapshot(backlog=[pending("slow", 1, 10**6)])) == []  # workers are counted instead

    def test_max_failed_is_exceeded_only_past_it(self):
        found = snapshot(failed=3)
        assert verdicts(found, max_failed=3) == [] and verdicts(found) == []
        assert verdicts(found, max_failed=2) == ["  problem: 3 failed request(s) (more than --max-failed 2)."]

    def test_a_batch_whose_reduce_gave_up_is_a_warning(self):
        found = snapshot(batches={"running": 1, "reduce_failed": 2})
        assert verdicts(found) == ["  warning: 2 batch(es) whose reduce gave up (reduce_failed)."]
        assert verdicts(snapshot(batches={"running": 1, "reduce_failed": 0})) == []
        assert "Batches: 1 running, 0 reduce_failed" in printed(snapshot(batches={"running": 1, "reduce_failed": 0}))

    def test_the_json_of_a_failed_request_without_a_time(self):
        failed = status.FailedRequest(
            request_id="r", kind="task", model="-", object_id="", key="k", error="e", attempts=1, processed_at=None
        )
        timed = status.FailedRequest(**(asdict(failed) | {"processed_at": CHECKED_AT}))
        data = snapshot(failed=2, failed_requests=[failed, timed]).as_json()
        assert [entry["processed_at"] for entry in data["failed_requests"]] == [None, CHECKED_AT.isoformat()]
        assert data["checked_at"] == CHECKED_AT.isoformat() and data["replication"] is None
        assert (data["pending"], data["oldest_pending_age"]) == (0, None)


@pytest.mark.django_db(databases=["default", "tenant"])
@pytest.mark.parametrize("alias", ["default", "tenant"])
def test_a_user_who_may_not_read_the_replication_view_gets_no_replication_and_no_error(postgres_only, alias):
    """A hardened server (PUBLIC may not read ``pg_stat_replication``): no replication, no error, and the
    caller's transaction on that database goes on (the read is in a savepoint of the database it reads).
    Planted in the test's own transaction (a role of its own, the grant revoked): both are rolled back with
    it. A primary with standbys: tests/faults/test_replication_status.py."""
    role = f"su_hardened_{os.getpid()}"
    with connections[alias].cursor() as cursor:
        cursor.execute("REVOKE SELECT ON pg_catalog.pg_stat_replication FROM PUBLIC")
        cursor.execute(f"CREATE ROLE {role}")
        cursor.execute(f"SET LOCAL ROLE {role}")
    assert status.replication(alias) is None
    with connections[alias].cursor() as cursor:
        cursor.execute("RESET ROLE")
    assert ProcessedRequest.objects.using(alias).count() == 0  # the transaction goes on
    found = status.collect(using=alias, ask_rq=False)
    assert found.replication is not None and found.replication.standbys == 0  # who may read it is told


@pytest.mark.django_db(databases=["default", "tenant"])
@override_settings(SAFEUPDATES_RELAY_AFTER=60)
def test_the_status_of_the_request_log_on_another_database(redis):
    """``collect(using=...)`` reads every figure from that database's log: the backlog, the records waiting
    for the relay (two models' records of one key are two records; a request applied since, or a task of no
    record, waits for no relay), the failed requests with their time, the outcomes."""
    types = ContentType.objects.db_manager("tenant")
    old = timezone.now() - timedelta(hours=2)
    failed_at = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    log = ProcessedRequest.objects.using("tenant")
    for model in (Profile, Gadget):
        log.create(content_type=types.get_for_model(model), object_id="7", kind="update", status="pending")
    log.update(created_at=old)
    log.create(content_type=types.get_for_model(Gadget), object_id="8", kind="update", status="applied")
    log.create(kind="task", key="refund:1", status="pending", queue="default")
    log.create(content_type=types.get_for_model(Gadget), object_id="9", kind="update", status="failed", error="gone")
    log.exclude(status="pending", kind="update").update(created_at=old)
    log.filter(status__in=["applied", "failed"]).update(processed_at=failed_at)
    assert status.relay_due(60, using="tenant") == 2 and status.relay_due(60) == 0
    found = status.collect(using="tenant", ask_rq=False)
    assert (found.relay_due, found.pending, found.failed) == (2, 3, 1)
    assert sorted((entry.model, entry.queue, entry.pending) for entry in found.backlog) == [
        ("-", "default", 1),
        ("testapp.Gadget", "-", 1),
        ("testapp.Profile", "-", 1),
    ]
    [failed] = found.failed_requests
    assert (failed.model, failed.object_id, failed.processed_at) == ("testapp.Gadget", "9", failed_at)
    assert (found.outcomes["applied"], found.outcomes["failed"]) == (1, 1)
    here = status.collect(ask_rq=False)
    assert (here.relay_due, here.pending, here.failed, here.failed_requests) == (0, 0, 0, [])
    Batch.objects.using("tenant").create(item_func="shop.refund", queue="default", total=1, status="reduce_failed")
    assert status.collect(using="tenant", ask_rq=False).batches == {"running": 0, "reduce_failed": 1}
    assert here.batches == status.collect(ask_rq=False).batches == {"running": 0, "reduce_failed": 0}


@pytest.mark.django_db(transaction=True)
def test_a_request_of_no_queue_and_no_record_and_one_created_ahead_of_the_clock(redis):
    """A pending task of no queue and no record is listed as ``-`` on ``-`` (and no backend is asked of a
    queue ``-``); a request whose ``created_at`` is ahead of the database's clock (written by a server whose
    clock runs fast) is 0 s old, never negative."""
    ProcessedRequest.objects.create(kind="task", key="refund:1", status="pending", queue="")
    ahead = enqueue_update(ProfileFactory(), active=True)
    ProcessedRequest.objects.filter(pk=ahead.pk).update(created_at=timezone.now() + timedelta(hours=1))
    found = status.collect()
    by_queue = {entry.queue: entry for entry in found.backlog}  # NULL sorts last on PostgreSQL, first on SQLite
    assert by_queue["default"] == status.Backlog(model="testapp.Profile", queue="default", pending=1, oldest_age=0.0)
    assert (by_queue["-"].model, by_queue["-"].pending, len(found.backlog)) == ("-", 1, 2)
    assert "default" in [queue.name for queue in found.queues] and "-" not in [queue.name for queue in found.queues]
    out = run_status()[1]
    assert "  - on -: 1, oldest " in out and "  testapp.Profile on default: 1, oldest 0 s" in out


@pytest.mark.django_db
def test_stuck_after_is_read_only_where_the_backend_cannot_show_its_workers(redis):
    """RQ counts its workers: no age limit by default. Django's tasks (django-tasks-db) show none: a
    request older than SAFEUPDATES_STUCK_AFTER is the sign instead, and the command says so."""
    plant_stuck_request(50)
    assert status.collect(ask_rq=False).stuck_after is None
    tasks = {"SAFEUPDATES_DELIVERY": "tasks", "SAFEUPDATES_TASK_BACKEND": "db", "SAFEUPDATES_STUCK_AFTER": 42}
    with override_settings(**tasks):
        found = status.collect(ask_rq=False)
        code, out = run_status()
    assert (found.delivery, found.stuck_after) == ("tasks", 42.0)
    assert code == 1 and "longer than a working system takes (42 s: SAFEUPDATES_STUCK_AFTER)" in out, out


@pytest.mark.django_db
def test_the_batches_are_counted_per_status_and_the_failed_requests_listed_newest_first_twenty_at_most(redis):
    """The command's lines of batches (running and whose reduce gave up; a batch done is neither), and of
    failed requests: all counted, the twenty newest listed."""
    for batch_status in ("running", "reduce_failed", "reduce_failed", "done"):
        Batch.objects.create(item_func="shop.refund", queue="default", total=1, status=batch_status)
    now = timezone.now().replace(microsecond=0)
    rows = [
        ProcessedRequest(
            kind="task", key=f"refund:{n}", status="failed", error=f"e{n}", processed_at=now - timedelta(seconds=n)
        )
        for n in range(21)
    ]
    ProcessedRequest.objects.bulk_create(rows)
    found = status.collect(ask_rq=False)
    assert found.batches == {"running": 1, "reduce_failed": 2}
    assert found.failed == 21 and [entry.key for entry in found.failed_requests] == [f"refund:{n}" for n in range(20)]
    out = run_status()[1]
    assert "Batches: 1 running, 2 reduce_failed" in out and "  warning: 2 batch(es) whose reduce gave up" in out
    assert "refund:19 after" in out and "refund:20 after" not in out
    assert [entry.key for entry in status.collect(ask_rq=False, failed_limit=2).failed_requests] == [
        "refund:0",
        "refund:1",
    ]


@pytest.mark.django_db
def test_the_backlog_is_listed_by_model_then_by_queue(redis):
    """One line per model and queue, in the order of the models' content types, then of the queues."""
    first, second = sorted((Profile, Gadget), key=lambda model: ContentType.objects.get_for_model(model).pk)
    for model, queue in ((second, "a"), (first, "b"), (first, "a")):
        ProcessedRequest.objects.create(
            content_type=ContentType.objects.get_for_model(model), object_id="1", status="pending", queue=queue
        )
    listed = [(entry.model, entry.queue) for entry in status.collect(ask_rq=False).backlog]
    assert listed == [(first._meta.label, "a"), (first._meta.label, "b"), (second._meta.label, "a")]
