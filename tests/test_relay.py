"""The relay (``safeupdates_relay``, :func:`safeupdates.jobs.relay`): it delivers what is pending, says
what it really enqueued, and keeps running through outages of Redis and PostgreSQL."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import django_rq
import pytest
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from rq import Worker
from rq.job import JobStatus
from rq.scheduler import RQScheduler
from rq.utils import now

from safeupdates import delivery, enqueue_update, exceptions
from safeupdates.contrib.batches.jobs import fan_out
from safeupdates.contrib.batches.models import Batch
from safeupdates.delivery import rq as queues
from safeupdates.jobs import apply_update, relay, relay_pending
from safeupdates.models import ProcessedRequest
from safeupdates.pipeline.relay import RelayReport
from tests.factories import ProfileFactory
from tests.redis_commands import RedisCommands
from tests.servers import OwnPostgres, OwnRedis, TcpProxy, missing_servers
from tests.testapp.batch_jobs import add_score
from tests.testapp.models import Profile
from tests.workers import ROOT, subprocess_env, wait_until, worker_db_url


def queue():
    return django_rq.get_queue("default")


def pending() -> int:
    return ProcessedRequest.objects.filter(status="pending").count()


def relay_output(*args: str) -> str:
    out = io.StringIO()
    call_command("safeupdates_relay", *args, stdout=out, stderr=out)
    return out.getvalue()


def job_fields(job: Any) -> tuple[Any, ...]:
    """What an apply job is enqueued with, besides its id and arguments."""
    return (job.timeout, job.result_ttl, job.failure_ttl, job.description, job.retries_left, job.retry_intervals)


@pytest.mark.django_db(transaction=True)
class TestWhatTheRelayEnqueues:
    def test_it_counts_what_it_enqueued_and_what_was_already_queued(self, redis):
        enqueue_update(ProfileFactory(), active=True)
        redis.flushdb()  # the job is lost
        assert "1 due (pending > 0s): enqueued 1 job(s), 0 already queued" in relay_output("--older-than", "0")
        assert queue().count == 1
        # The job is still waiting in the queue: nothing is enqueued, and the relay says so.
        assert "1 due (pending > 0s): enqueued 0 job(s), 1 already queued" in relay_output("--older-than", "0")
        assert queue().count == 1
        assert relay_pending(0) == 0

    def test_lost_jobs_come_back_with_their_options_and_are_then_counted_waiting(self, redis):
        """The relay's own enqueue (RQ's enqueue_many) gives each record's job the options of an
        ``enqueue_update()`` job: its timeout, retries, no result kept, its description."""
        profiles = ProfileFactory.create_batch(2)
        for profile in profiles:
            enqueue_update(profile, active=True)
        options = {job.id: job_fields(job) for job in queue().jobs}
        redis.flushdb()  # both jobs are lost
        assert "2 due (pending > 0s): enqueued 2 job(s), 0 already queued" in relay_output("--older-than", "0")
        assert {job.id: job_fields(job) for job in queue().jobs} == options
        assert "2 due (pending > 0s): enqueued 0 job(s), 2 already queued" in relay_output("--older-than", "0")

    def test_jobs_plainly_waiting_are_settled_by_the_first_pipeline_alone(self, redis):
        """A job queued and in the queue needs nothing: one pipeline asks its status and its place, and
        it is never asked again one by one (a relay pass after an outage settles hundreds)."""
        for profile in ProfileFactory.create_batch(3):
            enqueue_update(profile, active=True)
        with RedisCommands(redis) as sent:
            output = relay_output("--older-than", "0")
            lpos, hget = sent["LPOS"], sent["HGET"]
        assert "3 due (pending > 0s): enqueued 0 job(s), 3 already queued" in output
        assert (lpos, hget) == (3, 6)  # per record: its place, its job's and its follow-up's status
        assert queue().count == 3

    def test_a_record_whose_job_is_gone_but_whose_follow_up_waits_gets_no_new_job(self, redis):
        """The record's job ran (its result is not kept) while its follow-up job waits in the queue: that
        one will read every pending request of the record, and the relay enqueues nothing more."""
        profile = ProfileFactory()
        enqueue_update(profile, active=True)
        [record_job] = queue().job_ids
        queue().fetch_job(record_job).set_status(JobStatus.STARTED)  # a worker runs it ...
        enqueue_update(profile, newsletter=True)  # ... so the next request gets the follow-up job
        redis.lrem(queue().key, 0, record_job)
        queue().fetch_job(record_job).delete()  # ... and it finished: gone, with result_ttl 0
        assert queue().job_ids == [f"{record_job}-next"]
        assert "1 due (pending > 0s): enqueued 0 job(s), 1 already queued" in relay_output("--older-than", "0")
        assert queue().job_ids == [f"{record_job}-next"]
        enqueue_update(profile, dark_mode=True)  # and a request committed now (a burst) waits for it too
        assert queue().job_ids == [f"{record_job}-next"]

    def test_a_queued_status_without_the_job_in_the_queue_gets_a_new_job(self, redis):
        """A worker took the job off the queue and died before it started it: RQ still says "queued"."""
        request = enqueue_update(ProfileFactory(), active=True)
        [job_id] = queue().job_ids
        redis.lrem(queue().key, 0, job_id)
        assert queue().fetch_job(job_id).get_status() == "queued"
        assert relay_pending(0) == 1
        [job] = queue().jobs
        assert job.args == (str(request.request_id),)
        assert apply_update(job.args[0]) == "1 applied"

    def test_only_a_forced_delivery_looks_for_a_queued_job_in_the_queue(self, redis):
        """A delivery at commit takes RQ's "queued" at its word; only the relay's forced delivery also
        looks for the job in the queue, and enqueues one when it is not there (``deliver`` 1 and 15,
        ``deliver_with_outcome`` 1: forced by default, or ``force`` not passed on)."""
        request = enqueue_update(ProfileFactory(), active=True)
        [job_id] = queue().job_ids
        redis.lrem(queue().key, 0, job_id)  # taken off the queue by a worker killed before it started it
        record = (request.request_id, request.content_type_id, request.object_id, "default")
        assert queues.deliver(*record) is None
        assert queues.deliver_with_outcome(*record) == (None, queues.WAITING)
        assert queue().count == 0
        job = queues.deliver(*record, force=True)
        assert job is not None
        assert queue().job_ids == [job.id]
        assert apply_update(job.args[0]) == "1 applied"

    def test_a_delivery_outside_a_burst_asks_no_jobs_status_first(self, redis):
        """Outside a burst (no other request of the record pending) a delivery is one unique enqueue:
        the status of the record's job is asked first only where the job is likely queued (``deliver``
        2, ``deliver_with_outcome`` 2 and ``deliver_or_leave_for_relay`` 1 asked it by default)."""
        content_type_id = ContentType.objects.get_for_model(Profile).pk
        record = (uuid.uuid4(), content_type_id, "1", "default")
        with RedisCommands(redis) as sent:
            assert queues.deliver(*record) is not None
            assert queues.deliver_with_outcome(uuid.uuid4(), content_type_id, "2", "default")[1] == queues.ENQUEUED
            delivery.deliver_or_leave_for_relay(uuid.uuid4(), content_type_id, "3", "default", what="3")
            assert sent["HGET"] == 0
            assert queues.get_queue("default").fetch_job(queues.job_id(content_type_id, "3")) is not None
            sent.reset()
            assert queues.deliver(*record, likely_queued=True) is None
            assert sent["HGET"] == 1

    def test_a_record_on_a_queue_no_longer_configured_does_not_stop_the_others(self, redis, caplog):
        """Its queue was removed from RQ_QUEUES: the record is delivered on SAFEUPDATES_QUEUE, with a
        warning, and every other record is delivered too."""
        requests = [enqueue_update(ProfileFactory(), active=True) for _ in range(3)]
        ProcessedRequest.objects.filter(pk=requests[1].pk).update(queue="gone")
        batch = fan_out(add_score, [{"pk": 1, "points": 1}])
        Batch.objects.filter(pk=batch.pk).update(queue="gone")
        redis.flushdb()
        with caplog.at_level(logging.WARNING, logger="safeupdates"):
            report = relay(0)
        assert (report.due, report.enqueued) == (4, 4)
        assert sorted(job.args[0] for job in queue().jobs) == sorted(
            [str(r.request_id) for r in requests] + [str(ProcessedRequest.objects.get(kind="batch_item").request_id)]
        )
        messages = [r.getMessage() for r in caplog.records]
        assert any(
            f"{requests[1].content_type_id}:{requests[1].object_id}" in m
            and "queue 'gone', which is not in RQ_QUEUES: delivered on 'default'" in m
            for m in messages
        ), messages
        assert any(f"batch {batch.batch_id}" in m and "'gone'" in m for m in messages), messages

    def test_a_deferred_job_of_the_record_does_not_block_delivery(self, redis):
        """RQ keeps a job that waits for another one in its deferred registry; if the record's job is
        there (it never is by safeupdates' doing), it would wait forever: the relay moves it."""
        profile = ProfileFactory()
        request = enqueue_update(profile, active=True)
        job_id = queues.job_id(ContentType.objects.get_for_model(Profile).pk, str(profile.pk))
        blocker = queue().create_job(print, args=("never runs",))
        blocker.save()
        redis.delete(queue().key)
        queue().fetch_job(job_id).delete()
        deferred = queue().enqueue_call(
            apply_update, args=(str(request.request_id),), job_id=job_id, depends_on=blocker
        )
        assert deferred.get_status() == "deferred" and queue().count == 0
        report = relay(0)
        assert (report.enqueued, report.moved) == (1, 1)
        assert queue().job_ids == [job_id]
        assert queue().deferred_job_registry.count == 0
        # A deferred job moved is no sign of a missing scheduler (only an overdue scheduled one is).
        assert not report.warnings

    def test_a_job_scheduled_for_later_is_waited_for_and_a_missing_scheduler_reported(self, redis, caplog):
        profile = ProfileFactory()
        request = enqueue_update(profile, active=True)
        [job] = queue().jobs
        redis.delete(queue().key)
        queue().schedule_job(job, now() + timedelta(hours=1))  # a retry, scheduled with back-off
        with caplog.at_level(logging.WARNING, logger="safeupdates"):
            out = relay_output("--older-than", "0")
        assert "1 due (pending > 0s): enqueued 0 job(s), 1 already queued" in out
        warning = (
            "no RQ scheduler is running for queue 'default': 1 job(s) wait in its scheduled registry. Start "
            "the workers with --with-scheduler, or RQ's retries wait for the relay."
        )
        assert warning in out and warning in caplog.text
        assert queue().count == 0
        # A scheduler runs (another worker holds RQ's scheduler lock for the queue): no warning.
        redis.set(RQScheduler.get_locking_key("default"), "some-scheduler", ex=60)
        assert "no RQ scheduler" not in relay_output("--older-than", "0")
        # Once the job is due, the relay moves it: it must not wait for a scheduler that may never come.
        redis.delete(RQScheduler.get_locking_key("default"))
        queue().scheduled_job_registry.schedule(job, now() - timedelta(seconds=1))
        out = relay_output("--older-than", "0")
        assert "enqueued 1 job(s) (1 moved from RQ's scheduled or deferred registry), 0 already queued" in out
        assert (
            "no RQ scheduler is running for queue 'default': 0 job(s) wait in its scheduled registry, 1 overdue "
            "ones were moved to the queue by this pass. Start the workers" in out
        )
        assert queue().job_ids == [job.id] and queue().scheduled_job_registry.count == 0
        assert apply_update(str(request.request_id)) == "1 applied"

    def test_one_pass_with_redis_down_is_a_command_error_not_a_traceback(self, redis):
        enqueue_update(ProfileFactory(), active=True)
        with override_settings(RQ_QUEUES={"default": {"URL": "redis://127.0.0.1:1/0"}}):
            with pytest.raises(
                CommandError, match=r"^safeupdates relay: Redis unreachable at redis://127\.0\.0\.1:1/0 \("
            ):
                call_command("safeupdates_relay", "--older-than", "0", stdout=io.StringIO())
            with pytest.raises(exceptions.BackendUnavailable) as raised:
                relay_pending(0)
        assert (raised.value.backend, raised.value.where) == ("Redis", "redis://127.0.0.1:1/0")


def test_the_scheduler_state_of_an_unreachable_queue_names_that_queues_redis(settings, redis):
    """A queue of its own Redis, down while the default queue's is up: the error names the server of
    the queue asked about, and a reachable queue still answers."""
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, "elsewhere": {"URL": "redis://127.0.0.1:1/3"}}
    with pytest.raises(exceptions.BackendUnavailable) as raised:
        queues.scheduler_state("elsewhere")
    assert (raised.value.backend, raised.value.where) == ("Redis", "redis://127.0.0.1:1/3")
    redis.set(RQScheduler.get_locking_key("default"), "some-scheduler", ex=60)
    assert queues.scheduler_state("default") == (0, True)


@pytest.mark.workers
def test_overdue_retries_without_a_scheduler_are_delivered(workers, redis, postgres_only):
    """Issue 11: PostgreSQL restarts under workers started without --with-scheduler. Every record's job
    fails, RQ schedules its retry in the ScheduledJobRegistry, and nothing ever moves it to the queue.
    The relay printed "delivered 5 job(s)" while the queue stayed empty. It must move them, say so, and
    report the missing scheduler."""
    host, port = connection.settings_dict["HOST"] or "127.0.0.1", int(connection.settings_dict["PORT"] or 5432)
    proxy = TcpProxy(host, port)  # the workers' way to PostgreSQL: stopped, it looks like a restart
    url = worker_db_url().replace(f"@{host}:{port}/", f"@127.0.0.1:{proxy.port}/")
    profiles = [ProfileFactory() for _ in range(5)]
    registry = queue().scheduled_job_registry
    try:
        # The worker starts while PostgreSQL is up (Django 6.1's management commands run the database
        # checks at start), then PostgreSQL goes "down" before the requests' jobs run.
        proxy.start()
        workers.start(1, scheduler=False, env={"DATABASE_URL": url})
        assert wait_until(lambda: len(Worker.all(queue=queue())) == 1, 60), workers.logs()
        proxy.stop()
        requests = [enqueue_update(p, active=True) for p in profiles]
        # SAFEUPDATES_RETRY of the test settings: the first retry at once, the second after 1 s (scheduled).
        assert wait_until(lambda: registry.count == 5 and queue().count == 0, 60), workers.logs()
        proxy.start()  # PostgreSQL is back
        assert wait_until(lambda: len(registry.get_jobs_to_schedule()) == 5, 10)  # overdue, and nobody moves them
        assert pending() == 5
        out = relay_output("--older-than", "0")
        assert "5 due (pending > 0s): enqueued 5 job(s) (5 moved from RQ's scheduled or deferred registry)" in out
        assert "no RQ scheduler is running for queue 'default'" in out
        assert wait_until(lambda: pending() == 0, 60), workers.logs()
    finally:
        proxy.stop()
    assert {ProcessedRequest.objects.get(pk=r.pk).status for r in requests} == {"applied"}
    assert set(Profile.objects.values_list("active", flat=True)) == {True}


@pytest.fixture
def own_servers() -> Iterator[tuple[OwnRedis, OwnPostgres]]:
    missing = missing_servers()
    if missing:
        pytest.skip(missing)
    redis_server, postgres = OwnRedis().start(), OwnPostgres()
    try:
        postgres.init()
        yield redis_server, postgres
    finally:
        redis_server.stop()
        postgres.destroy()


@pytest.mark.workers
def test_the_relay_loop_survives_outages_of_redis_and_postgresql(own_servers, tmp_path):
    """``safeupdates_relay --interval`` keeps running while Redis or PostgreSQL is down, and says so in
    one line per failed pass, without a traceback."""
    redis_server, postgres = own_servers
    env = subprocess_env(
        DATABASE_URL=postgres.url,
        REDIS_URL=redis_server.url,
        PYTHONUNBUFFERED="1",
        # The settings for servers of a test's own: their cluster holds no database for the tenant alias,
        # which Django 6.1's start-up checks of every command would connect to.
        DJANGO_SETTINGS_MODULE="tests.faults.settings",
    )

    def manage(*args: str) -> None:
        subprocess.run([sys.executable, "manage.py", *args], env=env, cwd=ROOT, check=True, timeout=120)

    manage("migrate", "--no-input", "-v", "0")
    code = (
        "from safeupdates import enqueue_update; from tests.testapp.models import Profile; "
        "enqueue_update(Profile.objects.create(), active=True)"
    )
    manage("shell", "-c", code)
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    command = [sys.executable, "manage.py", "safeupdates_relay", "--interval", "0.2", "--older-than", "0"]
    with out_path.open("wb") as out, err_path.open("wb") as err:
        relay_proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=err)

    def lines(path: Path, pattern: str) -> int:
        return sum(bool(re.search(pattern, line)) for line in path.read_text().splitlines())

    redis_down = (
        rf"^safeupdates relay: Redis unreachable at redis://127\.0\.0\.1:{redis_server.port}/0 "
        r".*; will retry in 0\.2 s$"
    )
    postgres_down = (
        rf"^safeupdates relay: PostgreSQL unreachable at 127\.0\.0\.1:{postgres.port}/postgres "
        r".*; will retry in 0\.2 s$"
    )
    try:
        assert wait_until(lambda: lines(out_path, "1 due .*: enqueued 0 job.*, 1 already queued"), 30), (
            err_path.read_text()
        )
        redis_server.stop()
        assert wait_until(lambda: lines(err_path, redis_down) >= 2, 30), err_path.read_text()
        redis_server.start()  # empty: the job was lost with Redis
        enqueued = lines(out_path, "enqueued 1 job")
        assert wait_until(lambda: lines(out_path, "enqueued 1 job") > enqueued, 30), err_path.read_text()
        postgres.stop()
        assert wait_until(lambda: lines(err_path, postgres_down) >= 2, 30), err_path.read_text()
        postgres.start()
        passes = lines(out_path, "due")
        assert wait_until(lambda: lines(out_path, "due") > passes, 30), err_path.read_text()
        assert relay_proc.poll() is None
    finally:
        relay_proc.terminate()
        relay_proc.wait(10)
    errors = err_path.read_text().splitlines()
    assert errors and all(re.search(redis_down, e) or re.search(postgres_down, e) for e in errors), errors


@pytest.mark.django_db(transaction=True)
def test_retry_failed_delivers_requests_whose_retries_ran_out(redis):
    """A request ``failed`` after a database outage outlasted RQ's retries was never written (its
    transaction rolled back): ``--retry-failed`` makes it pending again, and its job applies it."""
    profile = ProfileFactory()
    request = enqueue_update(profile, active=True)
    ProcessedRequest.objects.filter(pk=request.pk).update(
        status="failed", error="OperationalError: the database restarted", attempts=4
    )
    other = enqueue_update(ProfileFactory(), active=True)
    ProcessedRequest.objects.filter(pk=other.pk).update(status="rejected", error="bad data")
    queue().empty()

    assert "1 failed request(s) made pending again" in relay_output("--retry-failed", "--older-than", "3600")
    [job] = queue().jobs  # delivered in the same pass, however recent the request
    assert job.args == (str(request.request_id),)
    apply_update(str(request.request_id))
    request.refresh_from_db()
    assert (request.status, request.attempts) == ("applied", 5)
    assert Profile.objects.get(pk=profile.pk).active is True
    assert ProcessedRequest.objects.get(pk=other.pk).status == "rejected"  # only failed ones
    assert "0 failed request(s)" in relay_output("--retry-failed", "--dry-run")


@pytest.mark.django_db(transaction=True)
def test_relay_pending_relays_work_of_the_age_given_and_counts_it(redis):
    """The scheduled job's entry point: work older than ``older_than`` (not ``SAFEUPDATES_RELAY_AFTER``,
    when given); it returns the jobs enqueued, or with ``dry_run`` the work due, enqueuing nothing."""
    enqueue_update(ProfileFactory(), active=True)
    queue().empty()  # the job is lost
    with override_settings(SAFEUPDATES_RELAY_AFTER=0):
        assert relay_pending(3600) == 0  # too recent
        assert queue().count == 0
        assert relay_pending(0, dry_run=True) == 1
        assert queue().count == 0
        assert relay_pending(0) == 1
        assert queue().count == 1


def test_the_relay_summary_says_what_was_done_or_would_be():
    assert RelayReport(older_than=0, due=1, enqueued=1).summary() == (
        "1 due (pending > 0s): enqueued 1 job(s), 0 already queued"
    )
    dry = RelayReport(older_than=2.5, dry_run=True, due=3)
    assert dry.summary() == "would deliver 3 job(s) for work pending > 2.5s"
    assert RelayReport(older_than=60, due=3, enqueued=2, moved=1, waiting=1, revived=1).summary() == (
        "1 failed request(s) made pending again; 3 due (pending > 60s): enqueued 2 job(s) (1 moved from RQ's "
        "scheduled or deferred registry), 1 already queued"
    )
    assert RelayReport(older_than=60, dry_run=True, revived=2).summary() == (
        "2 failed request(s) would be made pending again; would deliver 0 job(s) for work pending > 60s"
    )


@pytest.mark.django_db
def test_without_rq_queues_the_relay_warns_and_delivers_nothing(settings, caplog):
    enqueue_update(ProfileFactory(), active=True)  # in the test's transaction: no job was enqueued
    del settings.RQ_QUEUES
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        report = relay(0)
    assert (report.due, report.enqueued) == (1, 0)
    assert "which is not in RQ_QUEUES, and neither is SAFEUPDATES_QUEUE 'default': not delivered" in caplog.text


@pytest.mark.django_db
def test_revive_makes_only_failed_update_requests_pending_as_new():
    """``revive()`` (``--retry-failed``): a failed update request is pending again with no processed_at,
    as one never processed; a failed task or batch item is not an update request and stays failed
    (mutation survivors: dropping either went unnoticed)."""
    from django.db.models.functions import Now

    from safeupdates.models import RequestKind

    update = enqueue_update(ProfileFactory(), active=True)  # not committed: never sent to a queue
    task = enqueue_update(ProfileFactory(), active=True)
    ProcessedRequest.objects.filter(pk__in=[update.pk, task.pk]).update(status="failed", processed_at=Now())
    ProcessedRequest.objects.filter(pk=task.pk).update(kind=RequestKind.TASK)
    assert ProcessedRequest.objects.all().revive() == [update.pk]
    update.refresh_from_db()
    task.refresh_from_db()
    assert (update.status, update.processed_at) == ("pending", None)
    assert task.status == "failed" and task.processed_at is not None


def test_a_relay_warning_is_logged_under_the_relays_name(caplog):
    """The report keeps the warning; the log line says which tool wrote it (a mutation survivor: a line
    without its prefix went unnoticed)."""
    from safeupdates.pipeline.relay import RelayReport, relay_queue

    report = RelayReport(older_than=0)
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        assert relay_queue("gone", "request 1:2", report) == "default"
    [warning] = report.warnings
    assert "queue 'gone', which is not in RQ_QUEUES: delivered on 'default'" in warning
    assert [record.getMessage() for record in caplog.records] == [f"safeupdates relay: {warning}"]


@pytest.mark.django_db(transaction=True)
def test_a_failed_request_waits_for_retry_failed(redis):
    """A plain relay pass leaves a failed request failed: only ``retry_failed`` (``--retry-failed``)
    delivers it again."""
    request = enqueue_update(ProfileFactory(), active=True)
    redis.flushdb()
    ProcessedRequest.objects.filter(pk=request.pk).update(status="failed")
    report = relay(0)
    request.refresh_from_db()
    assert (report.revived, report.enqueued, request.status) == (None, 0, "failed")
    assert relay(0, retry_failed=True).enqueued == 1


class _ProfilesOnTheTenant:
    """Profiles and the request log on the tenant's database; every other model on ``default``."""

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "tenant" if model in (Profile, ProcessedRequest) else None

    db_for_read = db_for_write


@pytest.mark.django_db(transaction=True, databases=["default", "tenant"])
def test_the_relay_scans_the_request_log_where_the_router_writes_it(redis):
    """Without ``using``, the relay asks the router where the request log is written (the primary)."""
    with override_settings(DATABASE_ROUTERS=[_ProfilesOnTheTenant()]):
        profile = Profile.objects.create(name="on the tenant")
        request = enqueue_update(Profile, profile.pk, active=True)
        assert ProcessedRequest.objects.using("tenant").filter(pk=request.pk).exists()
        redis.flushdb()
        assert relay(0).enqueued == 1


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("unix://{dir}/no.sock?db=5", "unix://{dir}/no.sock?db=5"),
        ("unix://{dir}/no.sock", "unix://{dir}/no.sock?db=0"),
        ("redis://127.0.0.1:1", "redis://127.0.0.1:1/0"),
    ],
)
def test_an_unreachable_queue_is_named_by_its_server_and_database(settings, tmp_path, url, where):
    """Its Redis on a unix socket, or a URL that names no database (django-rq then passes ``db=None``)."""
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, "elsewhere": {"URL": url.format(dir=tmp_path)}}
    with pytest.raises(exceptions.BackendUnavailable) as raised:
        queues.scheduler_state("elsewhere")
    assert (raised.value.backend, raised.value.where) == ("Redis", where.format(dir=tmp_path))


@pytest.mark.parametrize(
    ("url", "where"),
    [("redis://:1/2", "redis://localhost:1/2"), ("redis://127.0.0.2/3", "redis://127.0.0.2:6379/3")],
)
def test_a_queue_whose_url_names_no_host_or_no_port_is_named_by_redis_pys_defaults(settings, url, where):
    """redis-py connects to localhost and to port 6379 where the URL names neither (``_where`` 15 to 28
    named other defaults); its address says where it really connects."""
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, "elsewhere": {"URL": url}}
    assert queues._where("elsewhere") == where


@pytest.mark.django_db(transaction=True)
def test_a_queue_of_the_same_name_on_another_redis_is_listed_there_too(settings, redis):
    """RQ lists a queue (its set of queues: ``rq info``, django-rq's pages, ``Queue.all()``) once a job was
    enqueued on it. safeupdates adds the name once per Redis client, not once per process
    (``_enqueue_unique`` 2 did): a queue moved to another server is listed there too."""
    from redis import Redis
    from rq import Queue

    missing = missing_servers()
    if missing:
        pytest.skip(missing)
    server = OwnRedis().start()
    try:
        enqueue_update(ProfileFactory(), active=True)  # listed on the tests' Redis
        settings.RQ_QUEUES = {**settings.RQ_QUEUES, "default": {"URL": server.url}}
        enqueue_update(ProfileFactory(), active=True)
        assert [q.name for q in Queue.all(connection=Redis.from_url(server.url))] == ["default"]
    finally:
        server.destroy()


@pytest.mark.django_db(transaction=True)
def test_each_pass_of_the_relay_loop_is_in_its_log_as_it_ends(tmp_path):
    """``safeupdates_relay --interval`` under a supervisor that sends its output to a file (systemd, a
    container, the chaos tests): each pass's line is there when the pass ends, not when the process
    exits, which a SIGTERM never lets it do."""
    env = subprocess_env()
    env.pop("PYTHONUNBUFFERED", None)  # as a process manager starts it: stdout to a file, block-buffered
    out_path = tmp_path / "relay.log"
    command = [sys.executable, "manage.py", "safeupdates_relay", "--interval", "0.5", "--older-than", "0"]
    with out_path.open("wb") as out:
        proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        passes = lambda: out_path.read_text().count("safeupdates relay: ")  # noqa: E731
        assert wait_until(lambda: passes() >= 2, 20), out_path.read_text()
    finally:
        proc.terminate()
        proc.wait(10)
