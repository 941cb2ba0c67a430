"""Job controls with real Redis and real rqworker processes: unique, serial (FIFO), throttle, queues."""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import signal
import subprocess
import types
from typing import Any

import django_rq
import pytest
from django.test import override_settings
from rq import Retry, SimpleWorker, Worker
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, ScheduledJobRegistry

from safeupdates import conf
from safeupdates.checks import check_delivery
from safeupdates.contrib.controls.jobs import (
    REAP_GRACE,
    UNIQUE_TTL,
    enqueue,
    parse_throttle,
    reap_if_abandoned,
)
from safeupdates.delivery.rq import dotted_path
from safeupdates.exceptions import InvalidControl
from tests.testapp import jobs
from tests.testapp.jobs import redis_now, runs
from tests.workers import Workers, wait_until


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(line) for line in out.split()]


def crash_worker(workers: Workers, index: int = 0) -> None:
    """SIGKILL worker ``index`` and then its work horse, as a crash or an OOM kill of the machine would.

    RQ's work horse calls ``os.setpgrp()``, so it is in no process group of the worker: it is found
    among the worker's children before the worker dies (the worker first, so it cannot notice the loss).
    """
    children = child_pids(workers.procs[index].pid)
    workers.kill(index)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def work_burst(*names: str) -> None:
    """Run the queued jobs here, with RQ's own SimpleWorker, until the queues are empty."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    queues = [django_rq.get_queue(name) for name in names or ("default",)]
    try:
        SimpleWorker(queues, connection=queues[0].connection).work(burst=True)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def queued(name: str = "default") -> int:
    return django_rq.get_queue(name).count


def helper() -> None:
    """A module-level function that is importable."""


# ---------------------------------------------------------------------------------------------------------
# Arguments


def _nested() -> object:
    def inner() -> None:
        pass

    return inner


BAD_CALLS = {
    "func not callable": ((123,), {}),
    "func path missing": (("tests.testapp.jobs.nope",), {}),
    "func path not callable": (("tests.testapp.jobs.json",), {}),
    "func lambda": ((lambda: None,), {}),
    "func nested": ((_nested(),), {}),
    "queue unknown": ((jobs.record, "log", 1), {"queue": "nope"}),
    "timeout zero": ((jobs.record, "log", 1), {"job_timeout": 0}),
    "timeout negative": ((jobs.record, "log", 1), {"job_timeout": -5}),
    "timeout bool": ((jobs.record, "log", 1), {"job_timeout": True}),
    "timeout float": ((jobs.record, "log", 1), {"job_timeout": 1.5}),
    "unique_key empty": ((jobs.record, "log", 1), {"unique_key": ""}),
    "unique_key not str": ((jobs.record, "log", 1), {"unique_key": 5}),
    "serial_key blank": ((jobs.record, "log", 1), {"serial_key": "  "}),
    "throttle per day": ((jobs.record, "log", 1), {"throttle": "10/day"}),
    "throttle zero": ((jobs.record, "log", 1), {"throttle": "0/second"}),
    "throttle words": ((jobs.record, "log", 1), {"throttle": "ten/minute"}),
    "throttle int": ((jobs.record, "log", 1), {"throttle": 5}),
    "throttle_key alone": ((jobs.record, "log", 1), {"throttle_key": "api"}),
    "retry not Retry": ((jobs.record, "log", 1), {"retry": 3}),
    "unique with serial": ((jobs.record, "log", 1), {"unique_key": "u", "serial_key": "s"}),
    "serial with throttle": ((jobs.record, "log", 1), {"serial_key": "s", "throttle": "1/second"}),
}


@pytest.mark.parametrize("args, kwargs", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_arguments_raise_and_enqueue_nothing(redis, args, kwargs):
    with pytest.raises(InvalidControl):
        enqueue(*args, **kwargs)
    assert redis.dbsize() == 0


def test_invalid_control_is_a_safeupdates_value_error():
    from safeupdates.exceptions import SafeUpdatesError

    assert issubclass(InvalidControl, SafeUpdatesError)
    assert issubclass(InvalidControl, ValueError)


def test_function_path_of_callables_and_paths():
    assert dotted_path(helper) == "tests.test_controls.helper"
    assert dotted_path("tests.testapp.jobs.record") == "tests.testapp.jobs.record"
    # A decorated function is enqueued by the path of its wrapper, which workers import.
    assert dotted_path(jobs.charge) == "tests.testapp.jobs.charge"


def _helper_as(**names: str) -> Any:
    """A copy of :func:`helper` with other ``__module__`` / ``__qualname__``: what a worker would import."""
    copy = types.FunctionType(helper.__code__, helper.__globals__, "helper")
    for name, value in names.items():
        setattr(copy, name, value)
    return copy


CANNOT_BE_IMPORTED = "cannot be imported by a worker; pass a function defined at module level (not a lambda, a nested"
NOT_IMPORTABLE_AS = "is not importable as '{}'; pass a module-level function or its path."


@pytest.mark.parametrize(
    ("func", "message"),
    [
        (lambda: None, CANNOT_BE_IMPORTED),
        (_nested(), CANNOT_BE_IMPORTED),
        (_helper_as(__module__="__main__"), CANNOT_BE_IMPORTED),
        (functools.partial(helper), CANNOT_BE_IMPORTED),  # no __qualname__
        (_helper_as(__module__="tests.no_such_module"), NOT_IMPORTABLE_AS.format("tests.no_such_module.helper")),
        (_helper_as(__qualname__="no_such_function"), NOT_IMPORTABLE_AS.format("tests.test_controls.no_such_function")),
        # Its path imports another function: a worker would run that one.
        (_helper_as(__qualname__="_nested"), NOT_IMPORTABLE_AS.format("tests.test_controls._nested")),
    ],
    ids=["lambda", "nested", "__main__", "partial", "no such module", "no such name", "another function"],
)
def test_a_callable_a_worker_would_not_import_as_itself_is_refused(func, message):
    with pytest.raises(InvalidControl) as excinfo:
        dotted_path(func)
    assert message in str(excinfo.value)


class _Jobs:
    @classmethod
    def run(cls) -> None:
        """A classmethod: each lookup makes a new bound method, equal to the last, never the same."""


def test_a_classmethod_is_enqueued_by_its_path_though_each_lookup_makes_another():
    assert _Jobs.run is not _Jobs.run
    assert dotted_path(_Jobs.run) == "tests.test_controls._Jobs.run"


def test_parse_throttle():
    item = parse_throttle(" 3 / minute ")
    assert (item.amount, item.get_expiry()) == (3, 60)
    assert parse_throttle("1/hour").get_expiry() == 3600
    assert parse_throttle("20/second").get_expiry() == 1


def test_plain_enqueue_goes_to_the_fast_queue(redis):
    job = enqueue(jobs.record, "log", "plain", job_timeout=30)
    assert job is not None
    assert job.origin == conf.fast_queue() == "default"
    assert job.timeout == 30
    assert job.description == "tests.testapp.jobs.record('log', 'plain')"
    assert queued() == 1


def test_queue_argument_and_dotted_path(redis):
    job = enqueue("tests.testapp.jobs.record", "log", "slow one", queue="slow")
    assert job is not None and job.origin == "slow"
    assert (queued("slow"), queued("default")) == (1, 0)


# ---------------------------------------------------------------------------------------------------------
# Unique while queued


def test_unique_key_adds_nothing_while_the_job_waits(redis):
    first = enqueue(jobs.record, "log", 1, unique_key="report:7")
    assert first is not None
    assert enqueue(jobs.record, "log", 2, unique_key="report:7") is None
    assert enqueue(jobs.record, "log", 3, unique_key="report:7") is None
    other = enqueue(jobs.record, "log", 4, unique_key="report:8")
    assert other is not None
    assert queued() == 2


def test_unique_key_is_free_again_when_the_waiting_job_is_gone(redis):
    first = enqueue(jobs.record, "log", 1, unique_key="report:7")
    assert first is not None
    first.delete()
    second = enqueue(jobs.record, "log", 2, unique_key="report:7")
    assert second is not None and second.id != first.id


def test_unique_pointer_lives_while_the_job_waits(redis):
    job = enqueue(jobs.record, "log", 1, unique_key="report:7")
    assert job is not None
    pointer = "safeupdates:unique:report:7"
    assert redis.get(pointer) == job.id.encode()
    assert 0 < redis.ttl(pointer) <= UNIQUE_TTL
    work_burst()
    assert job.get_status() == JobStatus.FINISHED
    assert not redis.exists(pointer), "the pointer outlived its job's start"
    assert enqueue(jobs.record, "log", 2, unique_key="report:7") is not None


def test_long_or_odd_keys_get_a_digest(redis):
    enqueue(jobs.record, "log", 1, unique_key="user 7 / ünïcode")
    (pointer,) = redis.keys("safeupdates:unique:*")
    assert pointer.startswith(b"safeupdates:unique:sha1-")


@pytest.mark.workers
def test_unique_until_executing(workers, redis):
    log, release = "unique-log", "unique-release"
    first = enqueue(jobs.wait_for_release, log, "first", release, unique_key="sync:42")
    assert first is not None
    assert enqueue(jobs.wait_for_release, log, "dropped", release, unique_key="sync:42") is None
    assert queued() == 1

    workers.start(1)
    assert wait_until(lambda: len(runs(log)) == 1, 30), "the first job did not start"
    # Started: a request made now may not have been seen by the running job, so a new job is queued...
    second = enqueue(jobs.wait_for_release, log, "second", release, unique_key="sync:42")
    assert second is not None and second.id != first.id
    # ... and while that one waits, further requests add nothing.
    assert enqueue(jobs.wait_for_release, log, "dropped", release, unique_key="sync:42") is None
    assert queued() == 1

    redis.rpush(release, "go", "go")
    assert wait_until(lambda: second.get_status() == JobStatus.FINISHED, 30)
    assert [run["label"] for run in runs(log)] == ["first", "second"]
    assert first.get_status() == JobStatus.FINISHED
    assert not redis.exists("safeupdates:unique:sync:42"), "the pointer outlived its job's start"


# ---------------------------------------------------------------------------------------------------------
# Serial (FIFO per key)


def assert_serial(records: list[dict], labels: list) -> None:
    """``records`` ran in the order ``labels`` and never overlapped (Redis time)."""
    assert [record["label"] for record in records] == labels
    for before, after in itertools.pairwise(records):
        assert after["start"] >= before["end"], f"{after['label']} started before {before['label']} ended"


def test_serial_job_arms_a_watchdog_and_disarms_it(redis):
    job = enqueue(jobs.scheduled_jobs, serial_key="acct", job_timeout=30)
    assert job is not None and job.get_status() == JobStatus.QUEUED  # the slot was free
    waiting = enqueue(jobs.scheduled_jobs, serial_key="acct", job_timeout=30)
    assert waiting is not None and waiting.get_status() == JobStatus.RATE_LIMITED
    assert queued() == 1
    work_burst()
    # While each job ran, its watchdog was scheduled; each was deleted when its job ended.
    assert (job.return_value(), waiting.return_value()) == (1, 1)
    assert ScheduledJobRegistry("default", connection=redis).count == 0


def test_the_watchdog_leaves_finished_and_missing_jobs_alone(redis):
    job = enqueue(jobs.record, "log", 1, serial_key="acct")
    assert job is not None
    work_burst()
    assert reap_if_abandoned(job.id, "2026-01-01T00:00:00.000000Z") == f"job {job.id} is finished: nothing to reap"
    assert reap_if_abandoned("missing", "2026-01-01T00:00:00.000000Z") == "job missing is gone: nothing to reap"


@pytest.mark.workers
def test_serial_order_and_no_overlap_with_three_workers(workers, redis):
    workers.start(3)
    assert wait_until(lambda: Worker.count(connection=redis) == 3, 30)
    labels = {"acct-1": [], "acct-2": []}
    for batch in range(2):
        for i in range(6):
            for key in labels:
                label = f"{key}-{batch}-{i}"
                labels[key].append(label)
                assert enqueue(jobs.record, f"log:{key}", label, 0.15, serial_key=key) is not None
        if batch == 0:
            # Cross a second boundary: RQ orders waiting jobs by enqueue second first, then by job id.
            deadline = redis_now() + 1.1
            wait_until(lambda: redis_now() > deadline, 5)  # noqa: B023 - called before the loop moves on

    assert wait_until(lambda: sum(len(runs(f"log:{key}")) for key in labels) == 24, 90)
    for key, expected in labels.items():
        assert_serial(runs(f"log:{key}"), expected)


@pytest.mark.workers
def test_serial_retry_without_interval_keeps_its_place(workers, redis):
    workers.start(3)
    enqueue(jobs.fail_first_run, "log", "flaky", 0.2, serial_key="k", retry=Retry(max=1))
    enqueue(jobs.record, "log", "next", serial_key="k")
    assert wait_until(lambda: len(runs("log")) == 3, 60)
    records = runs("log")
    assert [record["label"] for record in records] == ["flaky", "flaky", "next"]
    assert records[2]["start"] >= records[1]["end"]


@pytest.mark.workers
def test_serial_retry_with_interval_goes_to_the_back_of_the_line(workers, redis):
    workers.start(2)
    enqueue(jobs.fail_first_run, "log", "flaky", serial_key="k", retry=Retry(max=1, interval=2))
    enqueue(jobs.record, "log", "next", serial_key="k")
    assert wait_until(lambda: len(runs("log")) == 3, 60)
    assert [record["label"] for record in runs("log")] == ["flaky", "next", "flaky"]


@pytest.mark.workers
def test_killed_worker_does_not_hold_a_serial_slot_beyond_the_job_timeout(workers, redis):
    timeout = 6
    workers.start(1, scheduler=False)  # the worker that will die: it holds no scheduler lock
    stuck = enqueue(jobs.hang, "log", "stuck", serial_key="acct", job_timeout=timeout)
    assert wait_until(lambda: len(runs("log")) == 1, 30)
    after = enqueue(jobs.record, "log", "after", serial_key="acct")
    assert after is not None and after.get_status() == JobStatus.RATE_LIMITED
    workers.start(2)  # survivors, one of them runs RQ's scheduler
    assert wait_until(lambda: Worker.count(connection=redis) == 3, 60)
    killed_at = redis_now(redis)
    crash_worker(workers, 0)

    assert wait_until(lambda: len(runs("log")) == 2, timeout + 60)
    stuck_run, after_run = runs("log")
    waited = after_run["start"] - stuck_run["start"]
    print(f"serial slot handed on {waited:.2f}s after the killed job started (timeout {timeout}s)")
    # Never while the killed job could still be running under RQ's own timeout ...
    assert waited >= timeout
    # ... and soon after its deadline (or after the kill, if the survivors were slow to boot). RQ alone
    # would wait for the execution heartbeat to expire (>= 60 s), then for its maintenance (every 10 min).
    # The slack covers the scheduler's 1 s poll, whole-second scheduling and a job pick-up.
    deadline = max(stuck_run["start"] + timeout + REAP_GRACE, killed_at)
    assert after_run["start"] <= deadline + 6
    # Nothing dropped without a record: the killed job is failed as abandoned.
    assert stuck.get_status() == JobStatus.FAILED
    assert stuck.id in FailedJobRegistry("default", connection=redis).get_job_ids()


# ---------------------------------------------------------------------------------------------------------
# Throttle


@pytest.mark.workers
def test_throttle_defers_the_excess_to_later_windows(workers, redis):
    per_window, window, count = 2, 1.0, 8
    workers.start(3)
    assert wait_until(lambda: Worker.count(connection=redis) == 3, 30)
    enqueued = [enqueue(jobs.record, "log", i, throttle=f"{per_window}/second") for i in range(count)]

    assert wait_until(lambda: len(runs("log")) == count, 90)
    records = runs("log")
    assert sorted(record["label"] for record in records) == list(range(count)), "a job was lost or ran twice"
    starts = sorted(record["start"] for record in records)
    # A start is recorded a moment after the job passed the limiter (two Redis calls apart); allow half a
    # window for that. Unthrottled, the 8 jobs would all start within well under a second.
    latency = 0.5
    # Fixed windows: at most N starts in a window, so at most 2N in any span shorter than a window ...
    for first, last in zip(starts, starts[2 * per_window :], strict=False):
        assert last - first >= window - latency
    # ... and the jobs need at least ceil(count / N) windows, which follow each other.
    span = starts[-1] - starts[0]
    print(f"{count} jobs at {per_window}/second started over {span:.2f}s (Redis time)")
    assert span >= (math.ceil(count / per_window) - 1) * window - latency
    deferred = [Job.fetch(job.id, connection=redis).number_of_retries or 0 for job in enqueued]
    # How many were deferred depends on how fast the workers reached the limiter: on a loaded machine
    # they come late, in later windows, and fewer need deferring. The starts above carry the limit.
    assert sum(1 for n in deferred if n) >= 1
    assert all(job.get_status() == JobStatus.FINISHED for job in enqueued)


def test_throttled_jobs_are_deferred_to_the_window_reset(redis):
    enqueued = [enqueue(jobs.record, "log", i, throttle="1/minute", throttle_key="partner") for i in range(3)]
    work_burst()
    assert [run["label"] for run in runs("log")] == [0]
    assert enqueued[0].get_status() == JobStatus.FINISHED
    # The window is a Redis key living as long as the window: no limiter key outlives its period.
    (window,) = redis.keys("LIMITS:*")
    assert 0 < redis.pttl(window) <= 60_000
    registry = ScheduledJobRegistry("default", connection=redis)
    for job in enqueued[1:]:
        job.refresh()
        assert (job.get_status(), job.number_of_retries) == (JobStatus.SCHEDULED, 1)
        # Due when the window resets (RQ schedules in whole seconds of the worker's clock).
        due_in = registry.get_scheduled_time(job).timestamp() - redis_now(redis)
        assert 60 - 3 <= due_in <= 60 + 1


def test_throttle_key_defaults_to_the_dotted_path(redis):
    job = enqueue(jobs.record, "log", 1, throttle="5/minute")
    assert job is not None
    assert job.meta["safeupdates"]["throttle"] == ["5/minute", "tests.testapp.jobs.record"]
    job = enqueue(jobs.record, "log", 1, throttle="5/minute", throttle_key="partner-api")
    assert job is not None
    assert job.meta["safeupdates"]["throttle"] == ["5/minute", "partner-api"]


# ---------------------------------------------------------------------------------------------------------
# Fast and slow queues


def test_the_fast_queue_setting():
    assert conf.fast_queue() == "default"
    with override_settings(SAFEUPDATES_QUEUE="fast"):
        assert conf.fast_queue() == "fast"
    with override_settings(SAFEUPDATES_QUEUE="default", SAFEUPDATES_FAST_QUEUE="fast"):
        assert conf.fast_queue() == "fast"


def test_check_w002_passes_for_known_queues():
    with override_settings(SAFEUPDATES_FAST_QUEUE="fast"):
        assert check_delivery(None) == []


def test_check_w002_warns_about_unknown_queues():
    with override_settings(SAFEUPDATES_FAST_QUEUE=7):
        messages = check_delivery(None)
    with override_settings(SAFEUPDATES_FAST_QUEUE="video", SAFEUPDATES_SLOW_QUEUE="video"):
        messages += check_delivery(None)  # SLOW_QUEUE is no setting (nothing read it)
    assert [(m.id, m.msg, m.hint) for m in messages] == [
        (
            "safeupdates.W002",
            "SAFEUPDATES_FAST_QUEUE is 7, which is not the name of a queue in RQ_QUEUES.",
            "Set SAFEUPDATES_FAST_QUEUE to one of: default, fast, slow.",
        ),
        (
            "safeupdates.W002",
            "SAFEUPDATES_FAST_QUEUE is 'video', which is not a queue in RQ_QUEUES; jobs sent there would be refused.",
            "Add 'video' to RQ_QUEUES or set SAFEUPDATES_FAST_QUEUE to one of: default, fast, slow.",
        ),
    ]


def test_check_w002_is_registered():
    from django.core import checks

    with override_settings(SAFEUPDATES_FAST_QUEUE="video"):
        # Only the compatibility checks: Django 6.1's run_checks() also runs the database checks of the
        # model fields by default, which a test without database access may not.
        ids = [message.id for message in checks.run_checks(tags=[checks.Tags.compatibility])]
    assert "safeupdates.W002" in ids
