"""Fan-out / fan-in with real workers: one reduce, whatever the duplication and concurrency."""

from __future__ import annotations

import random
import threading
import uuid

import django_rq
import pytest
from django.db import connection, transaction
from django.db.models import Count
from django.test import override_settings

from safeupdates.contrib.batches.jobs import fan_out, relay_batches, run_batch_item, run_batch_reduce
from safeupdates.contrib.batches.models import Batch, BatchItem
from safeupdates.exceptions import InvalidControl, RequestNotFound
from safeupdates.jobs import relay_pending
from safeupdates.models import ProcessedRequest
from tests.factories import ProfileFactory
from tests.testapp.batch_jobs import add_score, failing_reduce, hold_until_released, record_reduce
from tests.testapp.jobs import record
from tests.testapp.models import Profile, ReduceRun
from tests.workers import start_threads, wait_until


def reduced(batch: Batch) -> bool:
    batch.refresh_from_db()
    return batch.reduced_at is not None


def state_of(batch: Batch, queue: django_rq.queues.DjangoRQ) -> str:
    """What a failed wait prints: the batch's counters, its items' statuses, and the queue's jobs."""
    batch.refresh_from_db()
    items = ProcessedRequest.objects.filter(request_id__in=batch.items.values("request_id"))
    statuses = dict(items.values_list("status").annotate(n=Count("pk")).order_by("status"))
    return (
        f"batch {batch.status}: {batch.succeeded} succeeded, {batch.failed} failed of {batch.total}, "
        f"reduced at {batch.reduced_at}; items by status {statuses}; queue: {queue.count} queued, "
        f"{queue.started_job_registry.count} started, {queue.failed_job_registry.count} failed, "
        f"{queue.scheduled_job_registry.count} scheduled, {queue.deferred_job_registry.count} deferred"
    )


@pytest.mark.workers
def test_redelivered_items_and_three_workers_reduce_once(workers):
    profiles = [ProfileFactory() for _ in range(10)]
    items = [{"pk": profiles[n % 10].pk, "points": 1} for n in range(300)]
    batch = fan_out(add_score, items, then=record_reduce)
    queue = django_rq.get_queue("default")
    item_ids = [job.args[0] for job in queue.jobs]
    assert len(item_ids) == 300
    rng = random.Random(7)
    for request_id in rng.sample(item_ids, 100):  # a third delivered twice
        queue.enqueue(run_batch_item, request_id)
    ids = queue.job_ids
    rng.shuffle(ids)
    queue.connection.delete(queue.key)
    queue.connection.rpush(queue.key, *ids)
    workers.start(3)
    # 400 jobs, each in a work horse of its own: no bound on the time fits both a laptop and a loaded
    # machine under coverage (over 120 s), so the wait fails only when the queue stops moving for 60 s.
    assert wait_until(
        lambda: reduced(batch),
        60,
        progress=lambda: (queue.count, queue.finished_job_registry.count, queue.failed_job_registry.count),
    ), state_of(batch, queue)
    assert wait_until(lambda: queue.count == 0, 60), state_of(batch, queue)
    for _ in range(3):  # the reduce delivered again, after it ran
        queue.enqueue(run_batch_reduce, str(batch.batch_id))
    assert wait_until(lambda: queue.count == 0, 30)
    batch.refresh_from_db()
    assert (batch.succeeded, batch.failed, batch.status) == (300, 0, "done")
    assert ReduceRun.objects.filter(batch_id=str(batch.batch_id)).count() == 1
    assert sum(Profile.objects.values_list("score", flat=True)) == 300  # each item ran once


@pytest.mark.workers
def test_a_failing_item_is_counted_failed_and_the_reduce_runs_once(workers):
    profile = ProfileFactory()
    items = [{"pk": profile.pk, "points": 1}] * 9 + [{"pk": profile.pk, "points": -1}]
    batch = fan_out(
        "tests.testapp.batch_jobs.add_score", items, then="tests.testapp.batch_jobs.record_reduce", retries=1
    )
    workers.start(2)
    assert wait_until(lambda: reduced(batch), 60)
    batch.refresh_from_db()
    assert (batch.succeeded, batch.failed) == (9, 1)
    failed = ProcessedRequest.objects.get(kind="batch_item", status="failed")
    assert "negative points" in failed.error
    assert ReduceRun.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_items_run_synchronously_once(redis):
    profile = ProfileFactory()
    batch = fan_out(add_score, [{"pk": profile.pk, "points": 2}] * 3, then=record_reduce)
    ids = [str(rid) for rid in ProcessedRequest.objects.filter(kind="batch_item").values_list("request_id", flat=True)]
    assert [run_batch_item(rid) for rid in ids + ids] == ["succeeded"] * 3 + ["duplicate"] * 3
    batch.refresh_from_db()
    assert batch.status == "done" and batch.finished_at is not None
    assert run_batch_reduce(str(batch.batch_id)) == "reduced"
    assert run_batch_reduce(str(batch.batch_id)) == "nothing to do"
    profile.refresh_from_db()
    assert profile.score == 6
    assert str(batch) == f"batch {batch.batch_id} 3/3"
    assert batch.progress == 1.0


@pytest.mark.django_db(transaction=True)
def test_lost_items_and_reduce_are_relayed(redis):
    profile = ProfileFactory()
    batch = fan_out(add_score, [{"pk": profile.pk, "points": 1}] * 4, then=record_reduce)
    redis.flushdb()
    assert relay_batches(0, dry_run=True) == 4
    assert relay_pending(0) == 4
    queue = django_rq.get_queue("default")
    for job in queue.jobs:
        run_batch_item(job.args[0])
    redis.flushdb()  # the reduce's job is lost too
    assert relay_pending(0) == 1
    run_batch_reduce(queue.jobs[0].args[0])
    assert reduced(batch)
    assert relay_pending(0) == 0


@pytest.mark.django_db(transaction=True)
def test_empty_batch_reduces_at_once(redis):
    batch = fan_out(add_score, [], then=record_reduce)
    assert batch.status == "done" and batch.total == 0
    job = django_rq.get_queue("default").jobs[0]
    assert job.func_name == "safeupdates.contrib.batches.jobs.run_batch_reduce"


@pytest.mark.django_db
def test_rolled_back_caller_fans_out_nothing(redis):
    with pytest.raises(RuntimeError), transaction.atomic():
        fan_out(add_score, [{"pk": 1, "points": 1}])
        raise RuntimeError
    assert not Batch.objects.exists()
    assert django_rq.get_queue("default").count == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"item_func": lambda item: None, "items": [1]}, "cannot be imported by a worker"),
        ({"item_func": "tests.testapp.batch_jobs.nope", "items": [1]}, "cannot be imported"),
        ({"item_func": "tests.testapp.batch_jobs.Profile.objects", "items": [1]}, "cannot be imported|not callable"),
        ({"item_func": 42, "items": [1]}, "callable or its dotted path"),
        ({"item_func": add_score, "items": [object()]}, "JSON-serialisable"),
        ({"item_func": add_score, "items": [1], "queue": "nope"}, "not in RQ_QUEUES"),
        ({"item_func": add_score, "items": [1], "retries": -1}, "retries"),
    ],
)
def test_bad_arguments(redis, kwargs, message):
    kwargs = dict(kwargs)  # a copy: the parameters are shared by every run of the test in a process
    item_func = kwargs.pop("item_func")
    items = kwargs.pop("items")
    with pytest.raises(InvalidControl, match=message):
        fan_out(item_func, items, **kwargs)
    assert not Batch.objects.exists()


def test_admin_shows_progress(admin_client, db):
    from django.urls import reverse

    fan_out(add_score, [{"pk": 1, "points": 1}] * 2)
    page = admin_client.get(reverse("admin:safeupdates_batches_batch_changelist")).content.decode()
    assert '<progress value="0" max="100">' in page


@pytest.mark.django_db(transaction=True)
@override_settings(SAFEUPDATES_REDUCE_ATTEMPTS=3)
def test_a_failing_reduce_is_relayed_until_its_attempts_are_spent(redis):
    batch = fan_out(add_score, [], then=failing_reduce)  # no items: done at once, its reduce enqueued
    queue = django_rq.get_queue("default")
    for attempt in (1, 2, 3):
        queue.empty()
        with pytest.raises(RuntimeError, match="report service"):
            run_batch_reduce(str(batch.batch_id))
        batch.refresh_from_db()
        assert (batch.reduce_attempts, batch.reduced_at) == (attempt, None)
        assert batch.reduce_error == "RuntimeError: the report service is down"
        assert not ReduceRun.objects.exists()  # what the failed reduce wrote was rolled back
        assert batch.status == ("done" if attempt < 3 else "reduce_failed")
        assert relay_batches(0) == (1 if attempt < 3 else 0)  # the relay delivers it again, then gives up
    assert queue.count == 0
    assert run_batch_reduce(str(batch.batch_id)) == "nothing to do"


@pytest.mark.django_db(transaction=True)
@override_settings(SAFEUPDATES_REDUCE_ATTEMPTS=3, SAFEUPDATES_RELAY_AFTER=3600)
def test_failed_reduce_attempts_are_spaced_out(redis):
    batch = fan_out(add_score, [], then=failing_reduce)
    with pytest.raises(RuntimeError):
        run_batch_reduce(str(batch.batch_id))
    # Copies of the reduce that piled up in the queue run at once: they must not use up the attempts.
    assert [run_batch_reduce(str(batch.batch_id)) for _ in range(3)] == ["too soon"] * 3
    batch.refresh_from_db()
    assert (batch.reduce_attempts, batch.status) == (1, "done")
    assert relay_batches(0) == 0  # not due again before SAFEUPDATES_RELAY_AFTER has passed


@pytest.mark.django_db(transaction=True)
def test_an_item_this_database_does_not_hold_fails_loudly(redis):
    """A worker on another database must not count the item as a duplicate and report success."""
    rid = str(uuid.uuid4())
    with pytest.raises(RequestNotFound, match=rf"batch item {rid} is not in database 'default'"):
        run_batch_item(rid)


@pytest.mark.workers
def test_a_duplicate_of_a_running_item_returns_at_once(workers, redis, postgres_only):
    """The relay delivers again an item whose job is still running (it is pending until it commits). The
    duplicate must not wait on the item's row lock for the item's whole run, holding a worker. (PostgreSQL:
    SQLite has no row locks; the running item holds the whole database's write lock.)"""
    batch = fan_out(hold_until_released, [{"log": "item-runs", "release": "release-item"}], then=record_reduce)
    queue = django_rq.get_queue("default")
    workers.start(2)
    assert wait_until(lambda: redis.llen("item-runs") == 1, 30), workers.logs()
    assert relay_batches(0) == 1  # the duplicate
    marker = queue.enqueue(record, "marker-runs", "after the duplicate")
    try:
        # The second worker takes the duplicate, then the marker: only if the duplicate let it go.
        assert wait_until(lambda: redis.llen("marker-runs") == 1, 15), workers.logs()
        # The job body ran; the worker marks it finished just after (result_ttl may drop it).
        assert wait_until(lambda: marker.get_status() in ("finished", None), 15), workers.logs()
    finally:
        redis.rpush("release-item", "go")
    assert wait_until(lambda: reduced(batch), 30), workers.logs()
    batch.refresh_from_db()
    assert (batch.succeeded, batch.failed) == (1, 0)
    assert redis.llen("item-runs") == 1  # the item ran once
    assert ProcessedRequest.objects.get(kind="batch_item").attempts == 1
    assert ReduceRun.objects.count() == 1
    assert queue.failed_job_registry.count == 0


@pytest.mark.django_db(transaction=True)
def test_an_item_locked_by_its_running_job_is_already_running(redis, postgres_only):
    fan_out(add_score, [{"pk": ProfileFactory().pk, "points": 1}])
    item = ProcessedRequest.objects.get(kind="batch_item")
    locked, release = threading.Event(), threading.Event()

    def running_job() -> None:
        with transaction.atomic():
            ProcessedRequest.objects.select_for_update().get(pk=item.pk)
            locked.set()
            release.wait(30)

    [thread] = start_threads(running_job, 1)
    try:
        assert locked.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")  # the old code waited here (and then raised)
        assert run_batch_item(str(item.request_id)) == "already running"
    finally:
        release.set()
        thread.join()
    assert run_batch_item(str(item.request_id)) == "succeeded"


@pytest.mark.django_db
def test_items_point_at_their_batch(redis):
    batch = fan_out(add_score, [{"pk": 1, "points": 1}] * 3)
    items = BatchItem.objects.filter(batch=batch).order_by("index")
    assert [item.index for item in items] == [0, 1, 2]
    logged = ProcessedRequest.objects.filter(kind="batch_item").values_list("request_id", flat=True)
    assert {item.request_id for item in items} == set(logged)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "item",
    [float("nan"), {"a": [float("inf")]}, "\ud800", {"\udfff": 1}, ["a\x00"], 10**5000, "deep"],
    ids=["nan", "inf", "surrogate", "surrogate key", "nul", "huge int", "deep"],
)
def test_an_item_json_cannot_carry_is_refused_and_the_callers_transaction_goes_on(item):
    if item == "deep":
        for _ in range(100_000):
            item = [item]
    batches = Batch.objects.count()
    with transaction.atomic():
        with pytest.raises(InvalidControl, match="items must be JSON"):
            fan_out(add_score, [{"pk": 1, "points": 1}, item])
        Profile.objects.create(name="after")  # the caller's transaction goes on
    assert Batch.objects.count() == batches
    assert not ProcessedRequest.objects.exists()
