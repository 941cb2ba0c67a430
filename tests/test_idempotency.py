"""``@idempotent``: at most one successful run per key, under a row lock, with real threads and workers."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from io import StringIO
from typing import Any

import django_rq
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from rq import SimpleWorker, Worker
from rq.job import JobStatus

from safeupdates import enqueue_update, signals
from safeupdates.contrib.controls.jobs import enqueue
from safeupdates.contrib.idempotent.decorators import SKIPPED, TASK_NAMESPACE, idempotent, task_log_key
from safeupdates.exceptions import InvalidControl, InvalidUpdate, LockUnavailable
from safeupdates.jobs import apply_update
from safeupdates.managers import Outcome
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus
from safeupdates.versions import next_version
from tests.test_controls import child_pids, crash_worker
from tests.testapp import jobs
from tests.testapp.jobs import redis_now
from tests.testapp.models import Profile
from tests.workers import wait_until


def charges(redis: Any, order: str) -> int:
    return int(redis.get(f"charges:{order}") or 0)


def score(order: str) -> int:
    return Profile.objects.get(name=order).score


def in_threads(count: int, target: Callable[[], Any]) -> list[Any]:
    """Run ``target`` in ``count`` threads released together; return results (or exceptions)."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = target()
        except Exception as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


# ---------------------------------------------------------------------------------------------------------
# Keys and arguments


def test_key_from_a_template_or_a_callable():
    assert jobs.charge.key_for("A-1") == "charge:A-1"
    assert jobs.charge.key_for(order="A-1", hold=2) == "charge:A-1"
    assert jobs.flaky_charge.key_for("B", fail=True) == "flaky-charge:B"

    @idempotent(key="mail:{0}:{kind}")
    def send(user_id: int, kind: str = "welcome") -> None:
        pass

    assert send.key_for(7) == "mail:7:welcome"
    assert task_log_key("charge:A-1") == "charge:A-1"


def test_keys_from_arguments_passed_by_keyword():
    # Decorated here, not at import: what a mutation run traces per test.
    @idempotent(key="mail:{user_id}:{kind}")
    def send(user_id: int, kind: str = "welcome") -> None:
        pass

    @idempotent(key=lambda user_id, kind="welcome": f"notify:{user_id}:{kind}")
    def notify(user_id: int, kind: str = "welcome") -> None:
        pass

    assert send.key_for(user_id=7, kind="reset") == "mail:7:reset"
    assert send.key_for(7, kind="reset") == "mail:7:reset"
    assert notify.key_for(user_id=7, kind="reset") == "notify:7:reset"
    with pytest.raises(InvalidControl) as excinfo:
        send.key_for(7, colour="red")
    assert str(excinfo.value) == (
        "test_keys_from_arguments_passed_by_keyword.<locals>.send(user_id: 'int', kind: 'str' = 'welcome') -> 'None': "
        "got an unexpected keyword argument 'colour'"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": 5}, "key must be a callable or a format string such as 'refund:{order_id}', not 5."),
        ({"key": ""}, "key must not be empty; use a template such as 'refund:{order_id}'."),
        ({"key": "  "}, "key must not be empty; use a template such as 'refund:{order_id}'."),
        ({"key": "k", "timeout": 0}, "timeout must be a positive number of seconds (int), not 0."),
        ({"key": "k", "timeout": True}, "timeout must be a positive number of seconds (int), not True."),
        ({"key": "k", "timeout": 1.5}, "timeout must be a positive number of seconds (int), not 1.5."),
    ],
    ids=["key not str", "key empty", "key blank", "timeout zero", "timeout bool", "timeout float"],
)
def test_bad_decorator_arguments(kwargs, message):
    with pytest.raises(InvalidControl) as excinfo:
        idempotent(**kwargs)
    assert str(excinfo.value) == message


@pytest.mark.django_db
def test_bad_keys_raise_before_anything_runs():
    ran = []

    @idempotent(key="refund:{order_id}")
    def refund(order: str) -> None:
        ran.append(order)

    @idempotent(key=lambda order: 42)
    def numbered(order: str) -> None:
        ran.append(order)

    with pytest.raises(InvalidControl, match="does not fit"):
        refund("A")
    with pytest.raises(InvalidControl, match="non-empty string"):
        numbered("A")
    with pytest.raises(InvalidControl):
        refund("A", "extra")
    assert ran == []
    assert not ProcessedRequest.objects.exists()


# ---------------------------------------------------------------------------------------------------------
# One run per key, recorded in the request log


@pytest.mark.django_db(transaction=True)
def test_runs_once_then_skips_and_records_the_task(redis):
    Profile.objects.create(name="A")
    assert jobs.charge("A") == "charged A"
    assert jobs.charge("A") is SKIPPED
    assert jobs.charge(order="A", hold=0) is SKIPPED
    assert SKIPPED is Outcome.DUPLICATE
    assert (charges(redis, "A"), score("A")) == (1, 1)

    record = ProcessedRequest.objects.get()
    assert record.request_id.version == 4  # random: no client can compute it in advance
    assert (record.kind, record.key, record.content_type_id, record.version) == (
        RequestKind.TASK,
        "charge:A",
        None,
        None,
    )
    assert (record.status, record.attempts, record.error) == (RequestStatus.APPLIED, 1, "")
    assert record.changes == {"function": "tests.testapp.jobs.charge"}
    assert record.processed_at is not None


@dataclasses.dataclass
class Refunder:
    """A callable object, and a dataclass, with a ``func`` but no ``enqueue()``: shaped a little like a task
    of Django's Tasks framework, and not one."""

    func: Callable[[str], str]

    def __call__(self, order: str) -> str:
        return self.func(order)


@dataclasses.dataclass
class Notifier:
    """A callable dataclass with an ``enqueue()`` of its own but no ``func``: not a task either."""

    gateway: str

    def enqueue(self, order: str) -> None:
        raise AssertionError("never called")

    def __call__(self, order: str) -> str:
        return refund(order, gateway=self.gateway)


def refund(order: str, *, gateway: str) -> str:
    return f"refunded {order} through {gateway}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("callable_", "name"),
    [
        (functools.partial(refund, gateway="stripe"), "tests.test_idempotency.refund"),
        (Refunder(functools.partial(refund, gateway="adyen")), "tests.test_idempotency.Refunder"),
        (Notifier("mollie"), "tests.test_idempotency.Notifier"),
    ],
)
def test_any_callable_is_guarded_as_a_function_is(callable_, name):
    """A ``functools.partial`` or a callable object is guarded like a function (and named after its
    function or class in the log): neither is a task, whatever attributes it has."""
    guarded = idempotent(key="refund-any:{0}")(callable_)
    first = guarded("R-9")
    assert first.startswith("refunded R-9 through ")
    assert guarded("R-9") is SKIPPED
    record = ProcessedRequest.objects.get(kind=RequestKind.TASK)
    assert (record.key, record.status, record.changes) == ("refund-any:R-9", RequestStatus.APPLIED, {"function": name})
    with pytest.raises(InvalidControl, match=r"does not fit"):
        idempotent(key="refund-any:{missing}")(callable_)("R-10")


@pytest.mark.django_db(transaction=True)
def test_a_failed_body_is_rolled_back_recorded_and_may_run_again():
    Profile.objects.create(name="B")
    with pytest.raises(ValueError, match="card declined for B"):
        jobs.flaky_charge("B", fail=True)
    record = ProcessedRequest.objects.get(key="flaky-charge:B")
    assert (record.status, record.attempts, record.error) == (
        RequestStatus.FAILED,
        1,
        "ValueError: card declined for B",
    )
    assert score("B") == 0, "the failed body's database write was not rolled back"

    assert jobs.flaky_charge("B", fail=False) == "charged B"
    record.refresh_from_db()
    assert (record.status, record.attempts, record.error) == (RequestStatus.APPLIED, 2, "")
    assert score("B") == 1
    assert jobs.flaky_charge("B", fail=True) is SKIPPED


@pytest.mark.django_db(transaction=True)
def test_long_keys_are_stored_with_a_digest_never_truncated_into_a_collision():
    @idempotent(key=lambda suffix: "k" * 300 + suffix)
    def task(suffix: str) -> str:
        return suffix

    assert (task("1"), task("2"), task("1")) == ("1", "2", SKIPPED)
    assert set(ProcessedRequest.objects.values_list("key", flat=True)) == {
        "k" * 210 + "...uuid5:" + str(uuid.uuid5(TASK_NAMESPACE, "k" * 300 + suffix)) for suffix in "12"
    }
    assert len(task_log_key("k" * 300)) == 255
    assert task_log_key("k" * 255) == "k" * 255


@pytest.mark.django_db(transaction=True)
def test_a_job_guards_with_its_own_timeout_and_records_its_queue(postgres_only, redis):
    """Run by a worker, the guard holds its lock at most the job's timeout (``idle_in_transaction_session_
    timeout``, as ``SHOW`` reads it in the body), and the task's row names the job's queue. A job without
    a timeout (-1), or a call outside a job, takes ``SAFEUPDATES_JOB_TIMEOUT``; an explicit timeout wins.
    Inside the caller's transaction the guard leaves that transaction's idle timeout alone."""
    queue = django_rq.get_queue("fast")
    with override_settings(SAFEUPDATES_JOB_TIMEOUT=41):
        queued = [
            queue.enqueue(jobs.session_timeout, name, job_timeout=t) for name, t in [("a", 37), ("b", 1), ("c", -1)]
        ]
        SimpleWorker([queue], connection=queue.connection).work(burst=True)
        assert [job.return_value() for job in queued] == ["37s", "1s", "41s"]
        assert jobs.session_timeout("direct") == "41s"
    assert ProcessedRequest.objects.get(key="session-timeout:a").queue == "fast"
    assert ProcessedRequest.objects.get(key="session-timeout:direct").queue == ""
    assert idempotent(key="explicit:{name}", timeout=43)(jobs.session_timeout.__wrapped__)("x") == "43s"
    with connection.cursor() as cursor:
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        own = cursor.fetchone()[0]
    with transaction.atomic():
        assert jobs.session_timeout("nested") == own


# ---------------------------------------------------------------------------------------------------------
# Namespaces: no client request id can collide with or squat a task's key


def squatting_ids(key: str) -> list[uuid.UUID]:
    """Request ids a client could compute for ``key``: today's uuid5 of the public namespace."""
    return [uuid.uuid5(TASK_NAMESPACE, key)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["enqueue_update", "update_if_newer"])
def test_a_client_request_id_cannot_squat_a_task_key(redis, path):
    profile = Profile.objects.create(name="S")
    for squat in squatting_ids("charge:S"):
        if path == "enqueue_update":
            enqueue_update(profile, request_id=squat, active=True)
        else:
            Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=squat, active=True)
    # The refund runs, exactly once, whatever requests clients recorded first.
    assert jobs.charge("S") == "charged S"
    assert jobs.charge("S") is SKIPPED
    assert (charges(redis, "S"), score("S")) == (1, 1)
    task = ProcessedRequest.objects.get(kind=RequestKind.TASK)
    assert (task.key, task.status) == ("charge:S", RequestStatus.APPLIED)
    assert task.request_id not in squatting_ids("charge:S")
    assert ProcessedRequest.objects.filter(kind=RequestKind.UPDATE).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_task_request_id_reused_by_a_client_is_refused_and_harms_nothing(redis):
    profile = Profile.objects.create(name="U")
    jobs.charge("U")
    task_id = ProcessedRequest.objects.get(kind=RequestKind.TASK).request_id
    with pytest.raises(InvalidUpdate, match="already used for another object"):
        enqueue_update(profile, request_id=task_id, active=True)
    with pytest.raises(InvalidUpdate, match="already used for another object"):
        Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=task_id, active=True)
    assert jobs.charge("U") is SKIPPED
    assert charges(redis, "U") == 1


@pytest.mark.django_db(transaction=True)
def test_another_kinds_row_under_the_tasks_key_does_not_make_the_task_skip():
    """Tasks share the log's ``key`` column with other kinds of rows (a batch item's is
    ``<batch id>:<index>``): an applied row of another kind under a task's idempotency key is not that
    task's record."""
    item = ProcessedRequest.objects.create(kind=RequestKind.BATCH_ITEM, key="b:0", status=RequestStatus.APPLIED)
    ran = []

    @idempotent(key="{0}")
    def task(key: str) -> str:
        ran.append(key)
        return "ran"

    assert task("b:0") == "ran"
    assert task("b:0") is SKIPPED
    assert ran == ["b:0"]
    record = ProcessedRequest.objects.get(kind=RequestKind.TASK)
    assert (record.key, record.status) == ("b:0", RequestStatus.APPLIED)
    item.refresh_from_db()
    assert item.status == RequestStatus.APPLIED


@pytest.mark.django_db(transaction=True)
def test_the_task_is_visible_in_the_admin(admin_client, redis):
    Profile.objects.create(name="C")
    jobs.charge("C")
    response = admin_client.get("/admin/safeupdates/processedrequest/", {"q": "charge:C"})
    assert response.status_code == 200
    assert "charge:C" in response.content.decode()


# ---------------------------------------------------------------------------------------------------------
# Retention: a purged task row would let the side effect run again


@pytest.mark.django_db(transaction=True)
def test_purge_keeps_completed_tasks_unless_task_retention_is_set(redis):
    Profile.objects.create(name="R")
    assert jobs.charge("R") == "charged R"
    enqueue_update(Profile.objects.get(name="R"), active=True)  # an update request, purged as before
    apply_update(str(ProcessedRequest.objects.get(kind=RequestKind.UPDATE).request_id))

    out = StringIO()
    call_command("safeupdates_purge", "--older-than", "0", stdout=out)
    assert "deleted 1 request(s)" in out.getvalue()
    assert "SAFEUPDATES_TASK_RETENTION" in out.getvalue()
    assert list(ProcessedRequest.objects.values_list("kind", "key")) == [(RequestKind.TASK, "charge:R")]
    assert jobs.charge("R") is SKIPPED, "the refund ran again after a purge"
    assert charges(redis, "R") == 1

    with override_settings(SAFEUPDATES_TASK_RETENTION=1):
        dry = StringIO()  # what --dry-run counts is what the purge deletes: no task under a day old
        call_command("safeupdates_purge", "--older-than", "0", "--dry-run", stdout=dry)
        assert "would delete 0 request(s) older than 0 day(s) and 0 task(s)" in dry.getvalue()
        call_command("safeupdates_purge", "--older-than", "0", stdout=out)
        assert ProcessedRequest.objects.filter(kind=RequestKind.TASK).count() == 1  # not a day old
    with override_settings(SAFEUPDATES_TASK_RETENTION=0):
        call_command("safeupdates_purge", "--older-than", "0", "--dry-run", stdout=out)
        assert "would delete 0 request(s) older than 0 day(s) and 1 task(s)" in out.getvalue()
        call_command("safeupdates_purge", "--older-than", "30", stdout=out)
        assert "deleted 0 request(s) older than 30 day(s) and 1 task(s) completed more than 0 day(s) ago" in (
            out.getvalue()
        )
    assert not ProcessedRequest.objects.exists()
    # What the setting means: after its retention, a task's key is forgotten.
    assert jobs.charge("R") == "charged R"


def test_purge_help_documents_task_retention():
    from safeupdates.management.commands.safeupdates_purge import Command

    assert "SAFEUPDATES_TASK_RETENTION" in Command.help


# ---------------------------------------------------------------------------------------------------------
# Concurrency: threads


@pytest.mark.django_db(transaction=True)
def test_eight_concurrent_threads_charge_once(postgres_only, redis):
    Profile.objects.create(name="T")
    results = in_threads(8, lambda: jobs.charge("T", hold=0.5))
    assert sorted(map(str, results)) == ["charged T"] + ["duplicate"] * 7
    assert (charges(redis, "T"), score("T")) == (1, 1)
    assert ProcessedRequest.objects.get(key="charge:T").attempts == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_of_a_failed_task_run_its_body_once(postgres_only, redis):
    """The row lock, not the first INSERT, makes concurrent calls wait: once a failed run committed the
    key's row, no INSERT waits any more, and only ``SELECT ... FOR UPDATE`` keeps the retries apart."""
    fail = True

    @idempotent(key="retried-refund:{order}")
    def refund(order: str) -> str:
        redis.incr(f"refunds:{order}")
        if fail:
            raise ValueError("gateway down")
        time.sleep(0.5)  # long enough for every other retry to reach the row while this one runs
        return "refunded"

    with pytest.raises(ValueError, match="gateway down"):
        refund("R-1")
    assert ProcessedRequest.objects.get(key="retried-refund:R-1").status == RequestStatus.FAILED
    fail = False
    results = in_threads(8, lambda: refund("R-1"))
    assert sorted(map(str, results)) == ["duplicate"] * 7 + ["refunded"]
    assert int(redis.get("refunds:R-1")) == 2, "the refund's body ran more than once after the failure"
    record = ProcessedRequest.objects.get(key="retried-refund:R-1")
    assert (record.status, record.attempts) == (RequestStatus.APPLIED, 2)


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_waits_at_most_the_timeout(postgres_only):
    entered, release = threading.Event(), threading.Event()

    @idempotent(key="slow:{name}")
    def holder(name: str) -> str:
        entered.set()
        release.wait(30)
        return "done"

    @idempotent(key="slow:{name}", timeout=1)
    def impatient(name: str) -> str:
        return "ran twice"

    signalled = []

    def receiver(sender, **kwargs):
        signalled.append((sender, kwargs["surface"], kwargs["using"]))

    thread = threading.Thread(target=lambda: (holder("x"), connection.close()))
    thread.start()
    signals.lock_unavailable.connect(receiver)
    try:
        assert entered.wait(30)
        with pytest.raises(LockUnavailable) as raised:
            impatient("x")
    finally:
        signals.lock_unavailable.disconnect(receiver)
        release.set()
        thread.join(30)
    assert str(raised.value) == (
        "idempotency key 'slow:x' stayed locked for 1s by another run; "
        "it is retried by RQ if the job has retries, or call again later."
    )
    # The metrics' lock-timeout counter: surface "idempotent", on the request log's database.
    assert signalled == [(None, "idempotent", "default")]
    assert impatient("x") is SKIPPED
    assert ProcessedRequest.objects.get(key="slow:x").status == RequestStatus.APPLIED


# ---------------------------------------------------------------------------------------------------------
# Concurrency: real worker processes


@pytest.mark.workers
def test_eight_concurrent_duplicate_jobs_charge_once(postgres_only, workers, redis):
    Profile.objects.create(name="W")
    workers.start(8)
    assert wait_until(lambda: Worker.count(connection=redis) == 8, 60)
    queued = [enqueue(jobs.charge, "W", hold=2.0) for _ in range(8)]
    assert wait_until(lambda: all(job.get_status() == JobStatus.FINISHED for job in queued), 120)

    results = sorted(str(job.return_value()) for job in queued)
    assert results == ["charged W"] + ["duplicate"] * 7
    assert (charges(redis, "W"), score("W")) == (1, 1)
    record = ProcessedRequest.objects.get(key="charge:W")
    assert (record.status, record.attempts) == (RequestStatus.APPLIED, 1)
    # They really ran at the same time: the duplicates started while the charge held the lock.
    for job in queued:
        job.refresh()
    charged = next(job for job in queued if str(job.return_value()) == "charged W")
    waited = [job for job in queued if job is not charged and job.started_at < charged.ended_at]
    print(f"{len(waited)} of 7 duplicates started while the charge held the lock")
    assert len(waited) >= 2


@pytest.mark.workers
def test_killed_worker_does_not_hold_the_idempotency_lock(postgres_only, workers, redis):
    timeout = 10
    Profile.objects.create(name="K")
    workers.start(1)
    first = enqueue(jobs.charge, "K", hold=3600, job_timeout=timeout)
    assert wait_until(lambda: charges(redis, "K") == 1, 30), "the first charge did not start"

    workers.start(1)
    second = enqueue(jobs.charge, "K", job_timeout=timeout)
    # The duplicate starts and waits on the row lock held by the first charge's transaction.
    assert wait_until(lambda: second.get_status() == JobStatus.STARTED, 30)
    killed_at = redis_now(redis)
    crash_worker(workers, 0)

    assert wait_until(lambda: second.get_status() in (JobStatus.FINISHED, JobStatus.FAILED), timeout + 30)
    assert second.get_status() == JobStatus.FINISHED, second.latest_result().exc_string
    second_started = float(redis.lrange("charge-started:K", -1, -1)[0])
    waited = second_started - killed_at
    print(f"the duplicate ran its body {waited:.2f}s after the lock holder was killed (timeout {timeout}s)")
    assert waited <= timeout
    assert second.return_value() == "charged K"
    # The killed run's database write was rolled back with its transaction; its Redis effect was not.
    assert (charges(redis, "K"), score("K")) == (2, 1)
    record = ProcessedRequest.objects.get(key="charge:K")
    assert (record.status, record.attempts) == (RequestStatus.APPLIED, 1)
    assert first.get_status() == JobStatus.STARTED  # until RQ's clean-up marks it abandoned


@pytest.mark.workers
def test_frozen_worker_holds_the_idempotency_lock_at_most_its_timeout(postgres_only, workers, redis):
    """A worker that stops answering (a frozen process, a host gone without closing its connections) keeps
    its connection open: PostgreSQL ends its session after ``timeout`` idle seconds, releasing the lock."""
    timeout = 5
    Profile.objects.create(name="F")
    # The frozen worker serves "slow" only; the duplicate runs on a worker of "default", already up.
    workers.start(1, queues=("slow",))
    workers.start(1, queues=("default",))
    assert wait_until(lambda: Worker.count(connection=redis) == 2, 60)
    enqueue(jobs.charge, "F", hold=3600, job_timeout=timeout, queue="slow")
    assert wait_until(lambda: charges(redis, "F") == 1, 30), "the first charge did not start"
    # The work horse holds the lock's connection (the worker's scheduler, if any, is frozen too).
    horses = child_pids(workers.procs[0].pid)
    assert horses
    try:
        for pid in horses:
            os.kill(pid, signal.SIGSTOP)
        second = enqueue(jobs.charge, "F", job_timeout=6 * timeout)
        assert wait_until(lambda: second.get_status() == JobStatus.FINISHED, 6 * timeout)
    finally:
        for pid in horses:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    first_started, second_started = (float(t) for t in redis.lrange("charge-started:F", 0, -1))
    waited = second_started - first_started
    print(f"the duplicate ran {waited:.2f}s after the frozen run took the lock (timeout {timeout}s)")
    # The frozen run's session goes idle right after its write; PostgreSQL ends it `timeout` s later.
    assert timeout - 1 <= waited <= timeout + 3
    assert second.return_value() == "charged F"
    assert (charges(redis, "F"), score("F")) == (2, 1)
    assert ProcessedRequest.objects.get(key="charge:F").status == RequestStatus.APPLIED
