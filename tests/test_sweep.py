"""A job's sweep: having applied its own record, an RQ apply job applies the other records whose jobs
still wait in its queue, taking those jobs off the queue (safeupdates.pipeline.apply._sweep).

Single jobs run in an in-process ``SimpleWorker`` (a real RQ worker, without the fork); what runs
concurrently runs in real ``rqworker`` processes.
"""

from __future__ import annotations

import logging
import re

import django_rq
import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from redis.exceptions import ResponseError
from rq import SimpleWorker
from rq.job import JobStatus

from safeupdates import enqueue_update, signals
from safeupdates.delivery import rq as queues
from safeupdates.jobs import relay_pending
from safeupdates.models import ProcessedRequest, RequestStatus
from safeupdates.pipeline import apply
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.test_jobs import _alive, all_done
from tests.testapp.models import Gadget, Profile, Restaurant, Ticket
from tests.workers import RowLock, lock_waiters, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def queue(name: str = "default"):
    return django_rq.get_queue(name)


def run_one_job(name: str = "default") -> str:
    """Run the first job of queue ``name`` in this process; its result (the job's summary)."""
    job_id = queue(name).job_ids[0]
    SimpleWorker([queue(name)], connection=queue(name).connection).work(burst=True, max_jobs=1)
    job = queue(name).fetch_job(job_id)
    # Apply jobs keep no result (result_ttl=0): the job's hash is gone once it finished.
    return "finished" if job is None else str(job.get_status())


def statuses(requests) -> list[str]:
    return [ProcessedRequest.objects.get(pk=request.pk).status for request in requests]


def toggle_each(profiles, times: int = 3):
    """``times`` toggles of ``active`` on every profile, the last one True; the requests."""
    requests = []
    for profile in profiles:
        for turn in range(times):
            requests.append(enqueue_update(profile, active=turn % 2 == 0))
    return requests


def test_one_job_applies_every_record_whose_job_waits(redis):
    profiles = ProfileFactory.create_batch(5, active=False)
    requests = toggle_each(profiles)
    assert queue().count == 5  # one job per record: the burst of each coalesced
    assert run_one_job() == "finished"
    assert queue().count == 0  # the other four jobs were taken off the queue by the first
    assert set(statuses(requests)) <= {"applied", "stale"}
    assert not ProcessedRequest.objects.filter(status=RequestStatus.PENDING).exists()
    assert set(Profile.objects.filter(pk__in=[p.pk for p in profiles]).values_list("active", flat=True)) == {True}
    # Each request was applied once: one attempt each.
    assert set(ProcessedRequest.objects.values_list("attempts", flat=True)) == {1}


def test_a_sweep_applies_records_of_a_model_whose_first_column_is_not_its_key(redis):
    """The rows a page locks are matched to its records by primary key, not by the first column."""
    tickets = [Ticket.objects.create(number=f"T-{n}", label="old") for n in range(4)]
    requests = [enqueue_update(ticket, label=f"new {ticket.number}") for ticket in tickets]
    assert run_one_job() == "finished"
    assert queue().count == 0
    assert statuses(requests) == ["applied"] * 4
    assert sorted(Ticket.objects.values_list("label", flat=True)) == [f"new T-{n}" for n in range(4)]


@pytest.mark.parametrize(("limit", "left"), [(0, 4), (1, 3), (2, 2)])
def test_a_job_sweeps_at_most_sweep_records_others(redis, limit, left):
    profiles = ProfileFactory.create_batch(5, active=False)
    toggle_each(profiles)
    with override_settings(SAFEUPDATES_SWEEP_RECORDS=limit):
        run_one_job()
    assert queue().count == left
    waiting = ProcessedRequest.objects.filter(status=RequestStatus.PENDING)
    assert waiting.values("object_id").distinct().count() == left
    while queue().count:
        run_one_job()
    assert not waiting.exists()


@pytest.mark.parametrize(("limit", "left"), [(None, 0), (3, 2)])
def test_a_sweep_takes_the_waiting_records_a_page_at_a_time(redis, monkeypatch, limit, left):
    """Pages of SWEEP_PAGE records, each after the last, until none is left or the limit is reached."""
    monkeypatch.setattr(apply, "SWEEP_PAGE", 2)
    profiles = ProfileFactory.create_batch(6, active=False)
    toggle_each(profiles, times=1)
    with override_settings(**({} if limit is None else {"SAFEUPDATES_SWEEP_RECORDS": limit})):
        run_one_job()
    assert queue().count == left
    waiting = ProcessedRequest.objects.filter(status=RequestStatus.PENDING)
    assert waiting.values("object_id").distinct().count() == left
    assert Profile.objects.filter(active=True).count() == 6 - left


def test_the_jobs_summary_counts_its_own_record_and_those_it_swept(redis, caplog):
    own, *others = ProfileFactory.create_batch(3, active=False)
    enqueue_update(own, active=True)
    for profile in others:
        enqueue_update(profile, active=True)
        enqueue_update(profile, active=False)
    with caplog.at_level(logging.DEBUG, logger="rq.worker"):
        SimpleWorker([queue()], connection=queue().connection).work(burst=True, max_jobs=1, logging_level="DEBUG")
        assert "result: '1 applied; swept 2 other record(s): 2 applied, 2 stale'" in caplog.text
        caplog.clear()
        enqueue_update(own, newsletter=True)  # nothing else waits: nothing swept, nor said
        SimpleWorker([queue()], connection=queue().connection).work(burst=True, max_jobs=1, logging_level="DEBUG")
        assert re.search(r"result: '1 applied'$", caplog.text, re.MULTILINE), caplog.text


class _Clock:
    """apply's clock: the job starts at 0 s; every later reading says ``elapsed``."""

    def __init__(self, elapsed: float) -> None:
        self.readings = iter([0.0])
        self.elapsed = elapsed

    def monotonic(self) -> float:
        return next(self.readings, self.elapsed)


@pytest.mark.parametrize(("elapsed", "left"), [(14.9, 0), (15.0, 1)])
def test_a_sweep_starts_a_page_only_in_the_first_quarter_of_the_jobs_timeout(redis, monkeypatch, elapsed, left):
    monkeypatch.setattr(apply, "time", _Clock(elapsed))
    first, second = ProfileFactory.create_batch(2, active=False)
    enqueue_update(first, active=True)
    enqueue_update(second, active=True)
    with override_settings(SAFEUPDATES_JOB_TIMEOUT=60):  # a quarter: 15 s
        run_one_job()
    assert queue().count == left
    assert ProcessedRequest.objects.filter(status=RequestStatus.PENDING).count() == left


def test_a_request_after_its_records_job_was_swept_gets_a_job_of_its_own(redis):
    first, second = ProfileFactory.create_batch(2, active=False)
    enqueue_update(first, active=True)
    enqueue_update(second, active=True)
    run_one_job()
    assert queue().count == 0
    # The swept job's id is free again: the next request of that record enqueues it anew.
    late = enqueue_update(second, newsletter=True)
    assert queue().count == 1
    run_one_job()
    assert statuses([late]) == ["applied"]
    assert Profile.objects.get(pk=second.pk).newsletter is True


def test_a_record_whose_write_spans_tables_is_left_to_its_own_job(redis):
    """A child of multi-table inheritance (its write locks and writes two tables) is not swept."""
    own = ProfileFactory(active=False)
    restaurant = Restaurant.objects.create(name="Luigi's")
    enqueue_update(own, active=True)  # the first job in the queue
    child = enqueue_update(restaurant, serves_pizza=True)
    run_one_job()
    assert statuses([child]) == ["pending"]
    assert queue().job_ids == [queues.job_id(child.content_type_id, child.object_id)]
    run_one_job()
    assert statuses([child]) == ["applied"]
    assert Restaurant.objects.get(pk=restaurant.pk).serves_pizza


def test_a_page_of_records_it_cannot_take_does_not_stop_the_sweep(redis, monkeypatch):
    """The next page starts after the last record of the page before, taken or not: a full page of
    records whose jobs are no longer in the queue (a worker took them, or they were lost) is not read
    again, and the record after it is swept."""
    monkeypatch.setattr(apply, "SWEEP_PAGE", 2)
    own = ProfileFactory(active=False)
    enqueue_update(own, active=True)  # the job that sweeps
    # The sweep's order within a content type is the object id's, as text.
    *gone, later = sorted(ProfileFactory.create_batch(3, active=False), key=lambda profile: str(profile.pk))
    left = [enqueue_update(profile, active=True) for profile in gone]
    swept = enqueue_update(later, active=True)
    for request in left:
        queue().remove(queues.job_id(request.content_type_id, request.object_id))
    assert run_one_job() == "finished"
    assert statuses([swept]) == ["applied"]  # from the second page
    assert statuses(left) == ["pending", "pending"]  # the relay's
    assert queue().count == 0


@pytest.mark.parametrize(
    ("corrupt", "error"),
    [({"content_type_id": 0}, "content type 0 no longer exists"), ({"object_id": "-1x"}, "invalid primary key")],
    ids=["content-type-gone", "bad-key"],
)
def test_a_swept_record_that_names_no_row_is_rejected_and_the_page_goes_on(redis, corrupt, error):
    """A record whose content type is gone, or whose key is no key of its model, needs no row lock: the
    page rejects its request, and still locks and applies the records after it (it comes first: content
    type 0, or a key that sorts before digits)."""
    own, gone, other = ProfileFactory.create_batch(3, active=False)
    enqueue_update(own, active=True)  # the first job in the queue
    orphan = enqueue_update(gone, active=True)
    on_other = enqueue_update(other, active=True)
    ProcessedRequest.objects.filter(pk=orphan.pk).update(**corrupt)
    queue().remove(queues.job_id(orphan.content_type_id, orphan.object_id))
    corrupted = ProcessedRequest.objects.get(pk=orphan.pk)
    queues.deliver(orphan.request_id, corrupted.content_type_id, corrupted.object_id, "default")  # its job now
    run_one_job()
    assert queue().count == 0
    assert statuses([orphan, on_other]) == ["rejected", "applied"]
    assert error in ProcessedRequest.objects.get(pk=orphan.pk).error


def test_records_of_another_queue_are_left_to_their_jobs(redis):
    here, there = ProfileFactory.create_batch(2, active=False)
    enqueue_update(here, active=True)
    elsewhere = enqueue_update(there, active=True, queue="slow")
    run_one_job()
    assert statuses([elsewhere]) == ["pending"]
    assert queue("slow").count == 1
    run_one_job("slow")
    assert statuses([elsewhere]) == ["applied"]


def test_a_sweep_whose_write_fails_gives_the_record_its_job_back(redis, refusing_trigger, caplog):
    refusing_trigger("55P03")  # lock_not_available: transient, the job would be retried
    good, refused = ProfileFactory.create_batch(2, active=False)
    applied = enqueue_update(good, active=True)
    held = enqueue_update(refused, name="forbidden")
    assert run_one_job() == "finished"  # its own record was applied: the job did not fail
    assert "a sweep stopped; the 1 record(s) it owed get their jobs back" in caplog.text
    assert statuses([applied, held]) == ["applied", "pending"]
    # The swept record's job, back on the queue under its own id.
    assert queue().job_ids == [queues.job_id(held.content_type_id, held.object_id)]
    assert ProcessedRequest.objects.get(pk=held.pk).attempts == 0


@pytest.mark.workers
def test_a_job_a_worker_already_runs_is_not_swept(workers, postgres_only, caplog):
    """Record B's job runs in a worker (held on B's row); A's job, run here, must leave B alone."""
    a, b = ProfileFactory.create_batch(2, active=False)
    workers.start(1)
    row = RowLock(Profile, b.pk).start()
    try:
        on_b = enqueue_update(b, active=True)
        assert wait_until(lambda: bool(lock_waiters()), 20)  # the worker's job holds B's request, waits for the row
        on_a = enqueue_update(a, active=True)
        # Were B's running job taken for a sweep, this job would wait for B's row: let it fail fast.
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")
        run_one_job()
        assert "sweeping record" not in caplog.text
        assert statuses([on_a, on_b]) == ["applied", "pending"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
        row.release()
    assert all_done(30)
    assert ProcessedRequest.objects.get(pk=on_b.pk).attempts == 1


def _sleeping_backends() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep' "
            "AND pid <> pg_backend_pid()"
        )
        return [pid for (pid,) in cursor.fetchall()]


@pytest.mark.workers
def test_a_worker_killed_mid_sweep_leaves_the_record_to_the_relay(workers, slow_trigger):
    """SIGKILL while a job's sweep writes record B (a slow trigger): B's job was taken off the queue and
    the page's transaction dies with the worker; B's request stays pending and the relay delivers it."""
    a, b = ProfileFactory.create_batch(2, active=False)
    on_a = enqueue_update(a, active=True)  # A's job first in the queue: it runs, then sweeps B
    on_b = enqueue_update(b, name="slow")
    workers.start(1)
    assert wait_until(lambda: bool(_sleeping_backends()), 20)  # the page is in B's UPDATE
    assert statuses([on_a]) == ["applied"]
    assert queue().count == 0  # B's job was taken by the sweep ...
    assert queue().started_job_registry.get_job_ids() == [queues.job_id(on_a.content_type_id, on_a.object_id)]
    backends = _sleeping_backends()
    workers.kill(0)
    assert wait_until(lambda: not _alive(backends), 20)
    assert statuses([on_b]) == ["pending"]
    workers.start(1)
    relay_pending(0)
    assert all_done(30)
    assert ProcessedRequest.objects.get(pk=on_b.pk).attempts == 1
    assert Profile.objects.get(pk=b.pk).name == "slow"


def test_a_swept_record_with_more_than_a_batch_pending_is_applied_whole(redis, monkeypatch):
    monkeypatch.setattr(apply, "BATCH_SIZE", 3)
    first, second = ProfileFactory.create_batch(2, active=False)
    enqueue_update(first, active=True)
    burst = [enqueue_update(second, active=turn % 2 == 0) for turn in range(8)]  # ends on False
    burst.append(enqueue_update(second, newsletter=True))
    run_one_job()
    assert queue().count == 0
    assert set(statuses(burst)) == {"applied", "stale"}
    second.refresh_from_db()
    assert (second.active, second.newsletter) == (False, True)


def test_a_swept_record_with_exactly_a_batch_pending_signals_no_duplicate(redis, monkeypatch):
    """A swept record holding a whole batch is applied by the page, and its follow-up finds nothing
    left: that is no redelivery of its (now done) request, so no ``request_duplicate`` is sent."""
    monkeypatch.setattr(apply, "BATCH_SIZE", 3)
    first, second = ProfileFactory.create_batch(2, active=False)
    enqueue_update(first, active=True)
    burst = [enqueue_update(second, score=turn) for turn in range(3)]
    duplicates: list[object] = []

    def receiver(sender, request_id, **kwargs):
        duplicates.append(request_id)

    signals.request_duplicate.connect(receiver, weak=False, dispatch_uid="tests.sweep.duplicate")
    try:
        assert run_one_job() == "finished"
    finally:
        signals.request_duplicate.disconnect(dispatch_uid="tests.sweep.duplicate")
    assert queue().count == 0
    assert statuses(burst) == ["stale", "stale", "applied"]
    assert duplicates == []


def test_a_page_claims_up_to_a_batch_of_each_record_not_of_the_page(redis, monkeypatch):
    """The limit is per record: a page whose records hold more requests together than one batch
    applies them all (a limit over the whole page left the later records' requests pending, their
    jobs taken)."""
    monkeypatch.setattr(apply, "BATCH_SIZE", 2)
    profiles = ProfileFactory.create_batch(4, active=False)
    requests = [enqueue_update(profile, **{name: True}) for profile in profiles for name in ("active", "newsletter")]
    assert run_one_job() == "finished"
    assert queue().count == 0
    assert statuses(requests) == ["applied"] * 8
    assert set(Profile.objects.values_list("active", "newsletter")) == {(True, True)}


def test_a_page_claims_only_pending_requests_of_its_records(redis):
    """A swept record's requests that are done already (applied by an earlier job), and a request of
    another model with the same key, are left as they are."""
    profiles = ProfileFactory.create_batch(2, active=False)
    done = enqueue_update(profiles[1], dark_mode=True)
    queue().empty()
    apply.apply_update(str(done.request_id))
    gadget = Gadget.objects.create(pk=profiles[1].pk)
    elsewhere = enqueue_update(gadget, count=3)
    queue().remove(queues.job_id(elsewhere.content_type_id, elsewhere.object_id))  # its job runs later
    for profile in profiles:
        enqueue_update(profile, active=True)
    assert run_one_job() == "finished"
    assert queue().count == 0
    done.refresh_from_db()
    assert (done.status, done.attempts) == ("applied", 1)
    assert statuses([elsewhere]) == ["pending"]


def test_a_record_whose_follow_up_job_waits_is_swept_by_that_job(redis):
    """A record whose job a worker runs gets a follow-up job for the requests committed meanwhile; if
    that one waits in the queue, a sweep takes it as it takes a record's own job."""
    own, plain, followed = ProfileFactory.create_batch(3, active=False)
    enqueue_update(own, active=True)
    enqueue_update(plain, active=True)
    first = enqueue_update(followed, active=True)
    running = queue().fetch_job(queues.job_id(first.content_type_id, first.object_id))
    queue().remove(running.id)
    running.set_status(JobStatus.STARTED)  # a worker runs it (it read the request already)
    meanwhile = enqueue_update(followed, newsletter=True)
    assert f"{running.id}-next" in queue().job_ids
    assert run_one_job() == "finished"
    assert queue().count == 0
    assert statuses([meanwhile]) == ["applied"]


def test_each_swept_record_is_signalled_as_itself(redis):
    profiles = ProfileFactory.create_batch(3, active=False)
    seen = []

    def receiver(sender, pk, fields, **kwargs):
        seen.append((sender, pk, fields, kwargs["latency"] is not None))

    signals.request_applied.connect(receiver, sender=Profile)
    try:
        for profile in profiles:
            enqueue_update(profile, active=True)
        run_one_job()
    finally:
        signals.request_applied.disconnect(receiver, sender=Profile)
    assert sorted(seen, key=lambda one: one[1]) == [(Profile, p.pk, ("active",), True) for p in profiles]


def test_a_record_whose_row_is_held_gets_its_job_back_and_no_sweep_waits(redis, postgres_only):
    """Record B's row is held by another transaction. A sweep that waited for it would hold C's row
    meanwhile (a deadlock with a transaction that locks both) and could outlive its job's timeout, failing
    a job whose own record was applied (RQ would retry it: a false duplicate). The page applies C, gives
    B its job back and ends; B's own job applies it once its row is free."""
    own, *others = ProfileFactory.create_batch(3, active=False)
    b, c = sorted(others, key=lambda p: str(p.pk))  # the page goes in key order: B first
    requests = [enqueue_update(p, active=True) for p in (own, b, c)]
    duplicates: list[object] = []

    def receiver(sender, request_id, **kwargs):
        duplicates.append(request_id)

    signals.request_duplicate.connect(receiver, sender=Profile)
    try:
        with RowLock(Profile, b.pk), override_settings(SAFEUPDATES_JOB_TIMEOUT=2):
            assert run_one_job() == "finished"
            assert statuses(requests) == ["applied", "pending", "applied"], (own.pk, b.pk, c.pk)
            assert queue().job_ids == [queues.job_id(requests[1].content_type_id, requests[1].object_id)]
            assert queue().failed_job_registry.count == 0
        run_one_job()
    finally:
        signals.request_duplicate.disconnect(receiver, sender=Profile)
    assert statuses(requests) == ["applied"] * 3
    assert duplicates == []


def test_a_value_the_database_refuses_in_a_page_rejects_only_its_request(redis, refusing_trigger):
    refusing_trigger("P0001")  # a trigger's RAISE EXCEPTION: the value's fault, not transient
    own, b, c = ProfileFactory.create_batch(3, active=False)
    enqueue_update(own, active=True)
    on_b = enqueue_update(b, active=True)
    culprit = enqueue_update(b, name="forbidden")
    on_c = enqueue_update(c, active=True)
    run_one_job()
    assert statuses([on_b, culprit, on_c]) == ["applied", "rejected", "applied"]
    assert queue().count == 0
    assert Profile.objects.get(pk=b.pk).active and Profile.objects.get(pk=c.pk).active


def test_a_held_record_with_more_than_a_batch_pending_is_not_waited_for(redis, postgres_only, monkeypatch, caplog):
    monkeypatch.setattr(apply, "BATCH_SIZE", 2)
    own, held = ProfileFactory.create_batch(2, active=False)
    enqueue_update(own, active=True)
    burst = [enqueue_update(held, active=turn % 2 == 0) for turn in range(5)]
    with RowLock(Profile, held.pk), override_settings(SAFEUPDATES_JOB_TIMEOUT=2):
        assert run_one_job() == "finished"
        # Waiting for the row would have outlived the job's timeout: the sweep would have stopped.
        assert "a sweep stopped" not in caplog.text
        assert set(statuses(burst)) == {"pending"}
        assert queue().job_ids == [queues.job_id(burst[0].content_type_id, burst[0].object_id)]
    while queue().count:
        run_one_job()
    assert Profile.objects.get(pk=held.pk).active is True


def test_a_page_writes_each_models_records_in_one_statement_with_each_outcome_its_own(redis, postgres_only):
    """The records of a page are written with one guarded statement per model, not one per record; the
    outcome of each request is the one its record alone would get: applied, stale (a field the row holds
    at a newer version), rejected (a bad value)."""
    own, *others = ProfileFactory.create_batch(4, active=False)
    fresh, held, bad = sorted(others, key=lambda p: str(p.pk))
    gadget = Gadget.objects.create(label="d")
    enqueue_update(own, active=True)
    on_fresh = [enqueue_update(fresh, active=True), enqueue_update(fresh, name="fresh")]
    older = enqueue_update(held, name="older")
    Profile.objects.update_if_newer(held.pk, version=next_version(), name="newer")  # above `older`
    on_held = enqueue_update(held, active=True)
    on_bad = enqueue_update(bad, active=True)
    ProcessedRequest.objects.filter(pk=on_bad.pk).update(changes={"no_such_field": 1})
    on_gadget = enqueue_update(gadget, label="e")
    with CaptureQueriesContext(connection) as queries:
        run_one_job()
    writes = [q["sql"] for q in queries.captured_queries if f'UPDATE "{Profile._meta.db_table}"' in q["sql"]]
    assert statuses([*on_fresh, older, on_held, on_bad, on_gadget]) == [
        "applied",
        "applied",
        "stale",
        "applied",
        "rejected",
        "applied",
    ]
    assert len(writes) == 2, writes  # the job's own record, then the page's records: one statement
    fresh.refresh_from_db()
    held.refresh_from_db()
    assert (fresh.active, fresh.name, held.active, held.name) == (True, "fresh", True, "newer")
    assert held.field_versions["active"] == on_held.version
    assert Gadget.objects.get(pk=gadget.pk).label == "e"
    assert queue().count == 0


def test_a_page_skips_a_request_another_transaction_holds(redis, postgres_only):
    """A page's claim locks SKIP LOCKED: a request that another job holds (it is applying it) is left
    to that job, and the page's other requests are claimed at once, without waiting for that lock."""
    held_profile, free_profile = ProfileFactory.create_batch(2)
    held = enqueue_update(held_profile, active=True)
    free = enqueue_update(free_profile, active=True)
    with RowLock(ProcessedRequest, held.pk):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '3s'")  # waiting for the lock would fail the claim
            claimed = ProcessedRequest.objects.claim_records(
                [(held.content_type_id, held.object_id), (free.content_type_id, free.object_id)], 10
            )
        assert [request.pk for request in claimed] == [free.pk]


def test_one_job_sweeps_the_records_waiting_in_its_own_queue(redis):
    """The records a job takes are those waiting in the queue it runs from, whatever its name."""
    profiles = ProfileFactory.create_batch(3, active=False)
    requests = [enqueue_update(profile, queue="fast", active=True) for profile in profiles]
    assert queue("fast").count == 3
    assert run_one_job("fast") == "finished"
    assert queue("fast").count == 0
    assert statuses(requests) == ["applied"] * 3


def test_take_waiting_takes_nothing_outside_a_job(redis):
    profile = ProfileFactory()
    enqueue_update(profile, active=True)
    record = (ContentType.objects.get_for_model(Profile).pk, str(profile.pk))
    assert queues.take_waiting([record, record]) == [False, False]
    assert queues.take_waiting([]) == []
    assert queue().count == 1


class TestWaitingAndClaimedRecords:
    """The two reads of a page: which records wait (``waiting_records``) and which of their requests a
    page takes (``claim_records``), on a log written here row by row."""

    @staticmethod
    def log(model, object_id, version, **fields):
        return ProcessedRequest.objects.create(
            content_type=ContentType.objects.get_for_model(model),
            object_id=str(object_id),
            version=version,
            queue=fields.pop("queue", "default"),
            **fields,
        )

    @staticmethod
    def two_models_in_key_order():
        """``(content_type_id, model)`` of Profile and of Gadget, the lower content type id first."""
        return sorted((ContentType.objects.get_for_model(model).pk, model) for model in (Profile, Gadget))

    def test_waiting_records_are_those_with_pending_update_requests_of_the_queue_in_key_order(self):
        (first, first_model), (second, second_model) = self.two_models_in_key_order()
        # Inserted out of key order; object ids of both content types interleave.
        self.log(second_model, 1, 10)
        self.log(first_model, 9, 11)
        self.log(first_model, 2, 12)
        self.log(second_model, 7, 13)
        self.log(first_model, 2, 14)  # a second request of a record: one row for it
        self.log(first_model, 5, 15, status=RequestStatus.APPLIED)  # nothing pending
        self.log(first_model, 6, 16, queue="fast")  # another queue's
        ProcessedRequest.objects.create(object_id="3", version=17, queue="default")  # names no model
        waiting = ProcessedRequest.objects.waiting_records
        keys = [(ct, object_id) for ct, object_id, _request_id in waiting("default", None, 10)]
        assert keys == [(first, "2"), (first, "9"), (second, "1"), (second, "7")]
        assert [key[:2] for key in waiting("default", (first, "2"), 10)] == keys[1:]
        assert [key[:2] for key in waiting("default", (first, "9"), 2)] == keys[2:]
        assert [key[:2] for key in waiting("default", (second, "1"), 10)] == keys[3:]
        assert waiting("default", (second, "7"), 10) == []
        assert [key[:2] for key in waiting("fast", None, 10)] == [(first, "6")]
        pending = ProcessedRequest.objects.filter(status=RequestStatus.PENDING)
        for content_type_id, object_id, request_id in waiting("default", None, 10):
            assert pending.filter(content_type_id=content_type_id, object_id=object_id, request_id=request_id).exists()

    def test_a_claim_takes_the_oldest_requests_of_each_record_in_key_order(self):
        (first, first_model), (second, second_model) = self.two_models_in_key_order()
        # Each record's requests inserted newest first; versions of the records interleave.
        for model, object_id, versions in [
            (second_model, 1, [40, 30, 20]),
            (first_model, 2, [41, 31, 21]),
            (first_model, 1, [42, 32, 22]),
        ]:
            for version in versions:
                self.log(model, object_id, version)
        self.log(first_model, 1, 5, status=RequestStatus.APPLIED)  # done: never claimed again
        with transaction.atomic():
            claimed = ProcessedRequest.objects.claim_records([(second, "1"), (first, "2"), (first, "1")], 2)
        assert [(r.content_type_id, r.object_id, r.version) for r in claimed] == [
            (first, "1", 22),
            (first, "1", 32),
            (first, "2", 21),
            (first, "2", 31),
            (second, "1", 20),
            (second, "1", 30),
        ]


def test_a_sweep_whose_first_take_fails_ends_and_its_job_still_finishes(redis, caplog):
    """Redis refuses the sweep's first take (another client made the queue's key a string once the job
    was taken): nothing was taken, nothing is owed, and the job, whose own record is applied, finishes."""
    own, other = ProfileFactory.create_batch(2, active=False)
    mine = enqueue_update(own, active=True)
    theirs = enqueue_update(other, active=True)

    def corrupt_the_queue(sender, pk, **kwargs):
        if pk == own.pk:  # sent after the job's own record committed, before its sweep
            redis.set(queue().key, "not a list")

    job_id = queue().job_ids[0]
    signals.request_applied.connect(corrupt_the_queue, sender=Profile, weak=False, dispatch_uid="tests.corrupt")
    try:
        with caplog.at_level(logging.WARNING, logger="safeupdates"):
            SimpleWorker([queue()], connection=redis).work(burst=True, max_jobs=1)
    finally:
        signals.request_applied.disconnect(sender=Profile, dispatch_uid="tests.corrupt")
        redis.delete(queue().key)
    assert queue().fetch_job(job_id) is None  # finished (an apply job keeps no result); a failed one stays
    (stopped,) = [record for record in caplog.records if "a sweep stopped" in record.getMessage()]
    assert stopped.getMessage() == "safeupdates: a sweep stopped; the 0 record(s) it owed get their jobs back"
    assert stopped.exc_info and isinstance(stopped.exc_info[1], ResponseError)  # Redis's WRONGTYPE, logged
    assert statuses([mine, theirs]) == ["applied", "pending"]  # the relay's, its job lost with the list
