"""The apply job in two round trips on PostgreSQL: the record's pending requests read, then claimed,
written and recorded in one statement, without a transaction of the job's own; the claiming path (a
transaction, ``FOR UPDATE SKIP LOCKED``, savepoints) only where something can fail half-way. Whichever
path a job takes, the outcomes are the same: the property test runs both on the same requests."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeupdates import enqueue_update, signals
from safeupdates.jobs import apply_update
from safeupdates.lifecycle import MISSING_TARGET
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.testapp.models import Profile

pytestmark = [pytest.mark.django_db(transaction=True)]


def statuses(requests: list[ProcessedRequest]) -> list[str]:
    found = dict(ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests]).values_list("pk", "status"))
    return [found[r.pk] for r in requests]


def verbs(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"].split()[0].upper() for query in queries.captured_queries]


class TestTwoRoundTrips:
    def test_a_record_s_requests_are_read_then_applied_by_one_statement_in_autocommit(self, redis, postgres_only):
        profile = ProfileFactory()
        requests = [enqueue_update(profile, active=value) for value in (True, False, True)]
        requests.append(enqueue_update(profile, newsletter=True))
        with CaptureQueriesContext(connection) as queries:
            assert apply_update(str(requests[0].request_id)) == "2 applied, 2 stale"
        # No BEGIN, no SAVEPOINT, no COMMIT: each statement is its own transaction.
        assert verbs(queries) == ["SELECT", "WITH"]
        assert statuses(requests) == ["stale", "stale", "applied", "applied"]
        profile.refresh_from_db()
        assert (profile.active, profile.newsletter) == (True, True)
        attempts = ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests]).values_list("attempts", flat=True)
        assert list(attempts) == [1, 1, 1, 1]
        assert ProcessedRequest.objects.filter(processed_at__isnull=True).count() == 0

    def test_a_missing_row_rejects_its_requests_in_one_statement(self, redis, postgres_only):
        profile = ProfileFactory()
        requests = [enqueue_update(profile, active=True), enqueue_update(profile, score=2)]
        Profile.objects.filter(pk=profile.pk).delete()
        with CaptureQueriesContext(connection) as queries:
            assert apply_update(str(requests[0].request_id)) == "2 rejected"
        assert verbs(queries) == ["SELECT", "WITH"]
        errors = set(ProcessedRequest.objects.values_list("error", flat=True))
        assert errors == {MISSING_TARGET}

    def test_a_row_newer_everywhere_makes_every_request_stale(self, redis, postgres_only):
        profile = ProfileFactory()
        request = enqueue_update(profile, active=True)
        Profile.objects.update_if_newer(profile.pk, version=next_version(), active=False)
        with CaptureQueriesContext(connection) as queries:
            assert apply_update(str(request.request_id)) == "1 stale"
        assert verbs(queries) == ["SELECT", "WITH"]
        profile.refresh_from_db()
        assert profile.active is False

    def test_inside_the_caller_s_transaction_the_claiming_path_is_taken(self, redis, postgres_only):
        profile = ProfileFactory()
        request = enqueue_update(profile, active=True)
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            assert apply_update(str(request.request_id)) == "1 applied"
        assert "SAVEPOINT" in verbs(queries)  # the claim and the write, in savepoints of the caller's


class TestWhereOneStatementDoesNotServe:
    def test_a_request_another_job_holds_is_left_to_it_and_the_rest_applied(self, redis, postgres_only):
        profile = ProfileFactory()
        held = enqueue_update(profile, active=True)
        later = enqueue_update(profile, newsletter=True)
        locked, release = threading.Event(), threading.Event()

        def hold() -> None:  # another job's claim of the first request
            try:
                with transaction.atomic():
                    ProcessedRequest.objects.select_for_update().get(pk=held.pk)
                    locked.set()
                    release.wait(30)
            finally:
                connections.close_all()

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert locked.wait(30)
            # The read saw both; the statement could not claim the held one: it wrote nothing, and the
            # claiming path applied the other.
            assert apply_update(str(later.request_id)) == "1 applied"
            assert statuses([held, later]) == ["pending", "applied"]
        finally:
            release.set()
            holder.join()
        assert apply_update(str(held.request_id)) == "1 applied"
        profile.refresh_from_db()
        assert (profile.active, profile.newsletter) == (True, True)

    def test_a_value_the_database_refuses_rolls_back_the_statement_and_the_culprit_alone_is_rejected(
        self, redis, postgres_only
    ):
        profile = ProfileFactory()
        first = enqueue_update(profile, active=True)
        refused = enqueue_update(profile, score=-13)  # a CHECK constraint
        last = enqueue_update(profile, newsletter=True)
        assert apply_update(str(first.request_id)) == "2 applied, 1 rejected"
        assert statuses([first, refused, last]) == ["applied", "rejected", "applied"]
        assert ProcessedRequest.objects.get(pk=refused.pk).attempts == 1  # the failed statement counted none

    def test_a_request_finished_between_the_read_and_the_statement_is_not_recorded_twice(
        self, redis, postgres_only, monkeypatch
    ):
        """Another job applies the record after this job read its requests: the statement claims none,
        writes nothing, and the claiming path finds nothing pending."""
        profile = ProfileFactory()
        request = enqueue_update(profile, score=5)
        log = type(ProcessedRequest.objects.all())
        read = log.pending_of

        raced: list[bool] = []

        def read_then_lose_the_race(self: Any, rid: uuid.UUID, limit: int) -> list[ProcessedRequest]:
            found = read(self, rid, limit)
            if raced:  # the other job's own read
                return found
            raced.append(True)
            done = threading.Thread(target=lambda: (apply_update(str(request.request_id)), connections.close_all()))
            done.start()
            done.join()
            return found

        monkeypatch.setattr(log, "pending_of", read_then_lose_the_race)
        applied: list[Any] = []
        signals.request_applied.connect(receiver := lambda **kw: applied.append(kw["request_id"]), weak=False)
        try:
            assert apply_update(str(request.request_id)) == "nothing pending"
        finally:
            signals.request_applied.disconnect(receiver)
        monkeypatch.undo()
        stored = ProcessedRequest.objects.get(pk=request.pk)
        assert (stored.status, stored.attempts) == ("applied", 1)
        assert applied == [request.request_id]  # once: by the other job, not again by this one


# --- the two paths agree -------------------------------------------------------------------------------

FIELDS = ("active", "newsletter", "score")
step = st.one_of(
    st.tuples(st.just("enqueue"), st.sampled_from(FIELDS), st.integers(0, 3)),
    st.tuples(st.just("write"), st.sampled_from(FIELDS), st.integers(0, 3)),
)


def value_of(name: str, number: int) -> Any:
    return number if name == "score" else bool(number % 2)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=8), delete=st.booleans())
def test_the_one_statement_and_the_claiming_path_conclude_alike(redis, postgres_only, steps, delete) -> None:
    """The same requests and direct writes, in the same order, on two rows: one row's job runs in
    autocommit (one statement), the other's inside a transaction (the claiming path). Statuses, fields
    written, fields held, errors, attempts and the rows' values agree."""
    rows = [ProfileFactory(), ProfileFactory()]
    requests: list[list[ProcessedRequest]] = [[], []]
    for kind, name, number in steps:
        for index, row in enumerate(rows):
            value = value_of(name, number)
            if kind == "enqueue":
                requests[index].append(enqueue_update(row, **{name: value}))
            else:
                Profile.objects.update_if_newer(row.pk, version=next_version(), **{name: value})
    if delete:
        Profile.objects.filter(pk__in=[row.pk for row in rows]).delete()
    heard: dict[int, dict[uuid.UUID, tuple[str, tuple[str, ...], tuple[str, ...], bool]]] = {0: {}, 1: {}}
    by_pk = {row.pk: index for index, row in enumerate(rows)}

    def receiver(signal: Any, pk: Any, request_id: uuid.UUID, fields: Any, held: Any, latency: Any, **_: Any) -> None:
        outcome = next(name for name, one in signals.OUTCOME_SIGNALS.items() if one is signal)
        heard[by_pk[pk]][request_id] = (outcome, tuple(fields), tuple(sorted(held)), latency is not None)

    for signal in signals.OUTCOME_SIGNALS.values():
        signal.connect(receiver, weak=False)
    try:
        summaries = []
        for index, of_row in enumerate(requests):
            if not of_row:
                summaries.append("nothing pending")
                continue
            if index == 0:
                summaries.append(apply_update(str(of_row[0].request_id)))
            else:
                with transaction.atomic():
                    summaries.append(apply_update(str(of_row[0].request_id)))
    finally:
        for signal in signals.OUTCOME_SIGNALS.values():
            signal.disconnect(receiver)
    assert summaries[0] == summaries[1]

    def recorded(of_row: list[ProcessedRequest]) -> list[tuple[str, str, int]]:
        found = {r.pk: r for r in ProcessedRequest.objects.filter(pk__in=[r.pk for r in of_row])}
        return [(found[r.pk].status, found[r.pk].error, found[r.pk].attempts) for r in of_row]

    assert recorded(requests[0]) == recorded(requests[1])
    assert [heard[0][r.request_id] for r in requests[0]] == [heard[1][r.request_id] for r in requests[1]]
    values = [Profile.objects.filter(pk=row.pk).values(*FIELDS).first() for row in rows]
    assert values[0] == values[1]


def test_the_read_s_generic_plan_reads_only_the_pending_index(redis, postgres_only) -> None:
    """The read is prepared, and psycopg keeps it: its generic plan must still see that ``status =
    'pending'`` is the condition of the safeupdates_pending index, so that a record's read does not
    grow with its history."""
    from safeupdates.database import statements

    profile = ProfileFactory()
    for _ in range(3):
        ProcessedRequest.objects.bulk_create(
            [
                ProcessedRequest(content_type_id=request.content_type_id, object_id=request.object_id, status="applied")
                for request in [enqueue_update(profile, active=True)]
                for _ in range(1000)
            ]
        )
    sql = statements.pending_of_record("pending").replace("%(request_id)s", "$1").replace("%(limit)s", "$2")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {ProcessedRequest._meta.db_table}")
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cursor.execute(f"PREPARE safeupdates_read(uuid, bigint) AS {sql}")
            cursor.execute("EXPLAIN EXECUTE safeupdates_read(%s, 500)", [uuid.uuid4()])
            plan = "\n".join(row[0] for row in cursor.fetchall())
            cursor.execute("DEALLOCATE safeupdates_read")
        finally:
            cursor.execute("RESET plan_cache_mode")
    assert "safeupdates_pending" in plan, plan
