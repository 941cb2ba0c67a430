"""The outcome signals of safeupdates.signals: one per request, after commit, never for a rolled-back
write, and a receiver that raises changes nothing. In this process, then with real workers."""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone

from safeupdates import enqueue_update, signals
from safeupdates.contrib.prometheus import metrics
from safeupdates.jobs import apply_update
from safeupdates.managers import Outcome
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.testapp.models import Profile, Restaurant
from tests.testapp.signals import RECORDED_KEY
from tests.workers import wait_until

NAMES = {signal: name for name, signal in signals.OUTCOME_SIGNALS.items()}


@pytest.fixture
def received():
    """Every outcome signal sent in this process: ``(name, sender, kwargs, in a transaction?)``."""
    got: list[tuple[str, type, dict, bool]] = []

    def receiver(signal, sender, **kwargs):
        got.append((NAMES[signal], sender, kwargs, connections[kwargs["using"]].in_atomic_block))

    for signal in NAMES:
        signal.connect(receiver, weak=False, dispatch_uid="tests.received")
    yield got
    for signal in NAMES:
        signal.disconnect(dispatch_uid="tests.received")


def by_request(got):
    return {str(kwargs["request_id"]): (name, kwargs) for name, _sender, kwargs, _atomic in got}


@pytest.mark.django_db(transaction=True)
class TestInProcess:
    def test_a_job_signals_each_request_after_its_commit(self, redis, received):
        """Three requests of one record: one written, one held by it, one held by a newer direct write."""
        profile = ProfileFactory()
        held_by_row = enqueue_update(profile, newsletter=True)
        direct = next_version()
        Profile.objects.update_if_newer(profile.pk, version=direct, newsletter=False)
        with transaction.atomic():
            older = enqueue_update(profile, active=True)
            newer = enqueue_update(profile, active=False)
        assert received == []  # enqueueing is no outcome
        assert apply_update(str(older.request_id)) == "1 applied, 2 stale"
        # In version order.
        assert [kwargs["request_id"] for _n, _s, kwargs, _a in received] == [
            held_by_row.request_id,
            older.request_id,
            newer.request_id,
        ]
        assert all(sender is Profile for _name, sender, _kwargs, _atomic in received)
        assert not any(atomic for *_rest, atomic in received)  # after the commit
        got = by_request(received)
        expected = {
            str(newer.request_id): ("applied", newer.version, ("active",), {}),
            str(older.request_id): ("stale", older.version, (), {"active": newer.version}),
            str(held_by_row.request_id): ("stale", held_by_row.version, (), {"newsletter": direct}),
        }
        assert {
            rid: (name, kwargs["version"], kwargs["fields"], kwargs["held"]) for rid, (name, kwargs) in got.items()
        } == expected
        for _name, kwargs in got.values():
            assert (kwargs["pk"], kwargs["job_id"], kwargs["using"]) == (profile.pk, None, "default")
            assert isinstance(kwargs["latency"], float) and 0 <= kwargs["latency"] < 60

    def test_a_receiver_of_one_model_hears_what_its_row_held(self, redis):
        """A receiver connected for the model alone (``sender=Profile``) is told, as one for every
        model is, which version the row held a field at, and the request's latency."""
        heard: dict[str, dict] = {}
        latencies: list[float] = []

        def receiver(sender, request_id, held, latency, **kwargs):
            heard[str(request_id)] = held
            latencies.append(latency)

        profile = ProfileFactory()
        held_by_row = enqueue_update(profile, newsletter=True)
        direct = next_version()
        Profile.objects.update_if_newer(profile.pk, version=direct, newsletter=False)
        written = enqueue_update(profile, active=True)
        # The only receiver: the metrics' receivers (of every model) disconnected for the while.
        for name, signal in signals.OUTCOME_SIGNALS.items():
            signal.disconnect(dispatch_uid=f"safeupdates.prometheus.{name}")
        signals.request_stale.connect(receiver, sender=Profile, weak=False, dispatch_uid="tests.profile_only")
        try:
            assert not any(signal.has_listeners(None) for signal in signals.OUTCOME_SIGNALS.values())
            assert apply_update(str(written.request_id)) == "1 applied, 1 stale"
        finally:
            signals.request_stale.disconnect(sender=Profile, dispatch_uid="tests.profile_only")
            metrics.connect()
        assert heard == {str(held_by_row.request_id): {"newsletter": direct}}
        assert len(latencies) == 1 and isinstance(latencies[0], float) and 0 <= latencies[0] < 60

    def test_no_signal_before_the_commit_nor_for_a_rolled_back_write(self, received):
        profile = ProfileFactory()
        with pytest.raises(RuntimeError), transaction.atomic():
            Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=True)
            assert received == []
            raise RuntimeError("the caller fails after the write")
        assert received == []
        rid = uuid.uuid4()
        with transaction.atomic():
            Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True)
            assert received == []
        assert [(name, kwargs["request_id"]) for name, _s, kwargs, _a in received] == [("applied", rid)]

    def test_one_statement_path_names_what_it_wrote_and_what_held(self, received):
        profile = ProfileFactory()
        older = next_version()
        newer = next_version()
        Profile.objects.update_if_newer(profile.pk, version=newer, newsletter=True)
        rid = uuid.uuid4()
        result = Profile.objects.update_if_newer(
            profile.pk, version=older, request_id=rid, active=True, newsletter=False
        )
        assert result.outcome == Outcome.APPLIED
        [(name, sender, kwargs, atomic)] = received
        assert (name, sender, atomic) == ("applied", Profile, False)
        assert (kwargs["fields"], kwargs["held"], kwargs["version"]) == (("active",), {"newsletter": newer}, older)
        if connections["default"].vendor == "postgresql":
            assert kwargs["latency"] == 0.0  # recorded and written by one statement
        else:
            assert 0 <= kwargs["latency"] < 5

    @pytest.mark.parametrize("path", ["a pending request's id", "a child of multi-table inheritance"])
    def test_the_reserving_path_records_and_names_what_it_wrote_what_held_and_where(self, redis, received, path):
        """Where one statement cannot record and write (the id of a request that enqueue_update() left
        pending; a model whose fields live in two tables), the request is reserved, written, then
        recorded: its log row and its signal say what the one-statement path's say."""
        model = Restaurant if path.startswith("a child") else Profile
        obj, bystander = model.objects.create(), model.objects.create()
        field, other = ("seats", "open") if model is Restaurant else ("score", "newsletter")
        rid = uuid.uuid4()
        if path.startswith("a pending"):
            version = enqueue_update(obj, request_id=rid, **{field: 7, other: True}).version
        else:
            version = next_version()
        newer = next_version()
        model.objects.update_if_newer(obj.pk, version=newer, **{other: False})
        received.clear()

        result = model.objects.update_if_newer(obj.pk, version=version, request_id=rid, **{field: 7, other: True})

        assert (result.outcome, result.version) == (Outcome.APPLIED, version)
        [(name, sender, kwargs, atomic)] = received
        assert (name, sender, atomic, kwargs["pk"], kwargs["using"]) == ("applied", model, False, obj.pk, "default")
        assert (kwargs["fields"], kwargs["held"], kwargs["version"]) == ((field,), {other: newer}, version)
        logged = ProcessedRequest.objects.get(request_id=rid)
        assert (logged.status, logged.error, logged.version) == ("applied", "", version)
        obj.refresh_from_db()
        bystander.refresh_from_db()
        assert (getattr(obj, field), getattr(obj, other), getattr(bystander, field)) == (7, False, 0)

    @pytest.mark.parametrize("mode", ["version", "timestamp"])
    def test_the_reserving_path_rejects_a_missing_row_with_its_error_and_key(self, received, mode):
        """Timestamp mode, and a model whose fields live in two tables, record then write: a key with no
        row is rejected, its error recorded, its signal naming the key."""
        rid, missing = uuid.uuid4(), 10**9
        when = {"version": next_version()} if mode == "version" else {"synced_at": timezone.now()}
        result = Restaurant.objects.update_if_newer(missing, request_id=rid, seats=3, **when)
        assert result.outcome == Outcome.MISSING
        [(name, sender, kwargs, _atomic)] = received
        assert (name, sender, kwargs["pk"], kwargs["fields"], kwargs["held"]) == (
            "rejected",
            Restaurant,
            missing,
            (),
            {},
        )
        logged = ProcessedRequest.objects.get(request_id=rid)
        assert (logged.status, logged.error) == ("rejected", "the target object does not exist")

    def test_timestamp_mode_records_what_it_wrote_and_what_held(self, received):
        """A newer timestamp writes every field given; an older one holds them all, at their versions."""
        profile = ProfileFactory()
        now = timezone.now()
        first, second = uuid.uuid4(), uuid.uuid4()
        Profile.objects.update_if_newer(profile.pk, synced_at=now, request_id=first, active=True, score=4)
        Profile.objects.update_if_newer(
            profile.pk, synced_at=now - timedelta(seconds=1), request_id=second, active=False, score=5
        )
        applied, stale = (kwargs for _name, _sender, kwargs, _atomic in received)
        assert [name for name, *_rest in received] == ["applied", "stale"]
        assert (applied["pk"], applied["fields"], applied["held"]) == (profile.pk, ("active", "score"), {})
        written_at = ProcessedRequest.objects.get(request_id=first).version
        assert (stale["pk"], stale["fields"], stale["held"]) == (
            profile.pk,
            (),
            {"active": written_at, "score": written_at},
        )
        assert ProcessedRequest.objects.get(request_id=second).error == ""

    def test_a_receiver_for_one_model_connected_late_hears_the_next_write_and_none_once_gone(self):
        """Connecting and disconnecting a receiver is seen by the next write (and by ``listened()``,
        which decides the extra reads)."""
        from safeupdates.lifecycle import listened

        profile = ProfileFactory()
        heard: list[tuple[type, object]] = []

        def receiver(sender, pk, **kwargs):
            heard.append((sender, pk))

        def write() -> None:
            Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=True)

        listening_before = listened(Profile)
        write()  # a write before the receiver is connected
        signals.request_applied.connect(receiver, sender=Profile, weak=False, dispatch_uid="tests.late")
        try:
            assert listened(Profile)
            write()
            assert heard == [(Profile, profile.pk)]
        finally:
            signals.request_applied.disconnect(sender=Profile, dispatch_uid="tests.late")
        write()
        assert heard == [(Profile, profile.pk)]
        assert listened(Profile) is listening_before

    def test_a_signal_is_asked_and_sent_without_a_sender(self):
        """Receivers' code may ask an outcome signal about no model in particular, or send it with none
        (Django's model signals, which cache their receivers per sender, cannot)."""
        got: list[object] = []

        def receiver(sender, **kwargs):
            got.append(sender)

        for signal in NAMES:
            signal.has_listeners()  # with a cache of receivers per sender, this raised TypeError
        signals.request_applied.connect(receiver, weak=False, dispatch_uid="tests.no_sender")
        try:
            assert signals.request_applied.has_listeners()
            signals.request_applied.send_robust(sender=None, pk=1)
        finally:
            signals.request_applied.disconnect(dispatch_uid="tests.no_sender")
        assert got == [None]

    def test_the_one_statement_path_logs_a_missing_row_with_its_error(self, caplog):
        """Recorded by its one statement, a request for a key with no row is logged as rejected, with why."""
        rid = uuid.uuid4()
        with caplog.at_level(logging.INFO, logger="safeupdates.lifecycle"):
            result = Profile.objects.update_if_newer(10**9, version=next_version(), request_id=rid, active=True)
        assert result.outcome == Outcome.MISSING
        [line] = [r.getMessage() for r in caplog.records if str(rid) in r.getMessage()]
        assert line.startswith(f"safeupdates: request {rid} rejected: testapp.Profile pk=1000000000")
        assert line.endswith(": the target object does not exist")

    def test_stale_duplicate_and_rejected(self, redis, received):
        profile = ProfileFactory()
        old, rid = next_version(), uuid.uuid4()
        newer = next_version()
        Profile.objects.update_if_newer(profile.pk, version=newer, active=True)
        assert Profile.objects.update_if_newer(profile.pk, version=old, request_id=rid, active=False).outcome == "stale"
        again = Profile.objects.update_if_newer(profile.pk, version=old, request_id=rid, active=False)
        assert again.outcome == Outcome.DUPLICATE
        missing = uuid.uuid4()
        Profile.objects.update_if_newer(10**9, version=next_version(), request_id=missing, active=True)
        known = enqueue_update(profile, request_id=rid, active=False)  # a double submit of a done request
        assert known.status == "stale"
        assert [(name, str(kwargs["request_id"])) for name, _s, kwargs, _a in received] == [
            ("stale", str(rid)),
            ("duplicate", str(rid)),
            ("rejected", str(missing)),
            ("duplicate", str(rid)),
        ]
        stale, duplicate, rejected, double_submit = (kwargs for _n, _s, kwargs, _a in received)
        assert stale["held"] == {"active": newer}
        assert (double_submit["pk"], double_submit["version"]) == (profile.pk, old)
        assert (duplicate["fields"], duplicate["held"], duplicate["latency"]) == ((), {}, None)
        assert (rejected["pk"], rejected["fields"], rejected["held"]) == (10**9, (), {})

    def test_the_latency_is_the_rows_time_from_created_to_processed(self, redis, received):
        """By the database's clock, as the row holds it, to the microsecond (``_latencies`` 28: a floor of
        one second in place of zero)."""
        request = enqueue_update(ProfileFactory(), active=True)
        apply_update(str(request.request_id))
        request.refresh_from_db()
        [(name, _sender, kwargs, _atomic)] = received
        assert name == "applied"
        assert kwargs["latency"] == (request.processed_at - request.created_at).total_seconds() < 1

    def test_a_job_run_by_a_worker_names_itself(self, redis, received):
        """Run by an RQ worker (in this process), a request's outcome signal carries the job's id
        (``queues.current_job_id`` 1, 3, 5: None, or the text "None", in place of it)."""
        import django_rq
        from rq import SimpleWorker

        request = enqueue_update(ProfileFactory(), active=True)
        queue = django_rq.get_queue("default")
        [job_id] = queue.job_ids
        SimpleWorker([queue], connection=queue.connection).work(burst=True, max_jobs=1)
        [(name, _sender, kwargs, _atomic)] = received
        assert (name, kwargs["request_id"], kwargs["job_id"]) == ("applied", request.request_id, job_id)

    def test_a_duplicate_reads_no_latency(self, redis, received):
        """A request submitted again is announced with no latency, and none is read for it (``_announce``
        9, 10, 18: one more query of the log per double submit)."""
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        profile = ProfileFactory()
        request = enqueue_update(profile, active=True)
        apply_update(str(request.request_id))
        received.clear()
        with CaptureQueriesContext(connection) as queries:
            assert enqueue_update(profile, request_id=request.request_id, active=True).status == "applied"
        [(name, _sender, kwargs, _atomic)] = received
        assert (name, kwargs["latency"]) == ("duplicate", None)
        # The request is read by its request id; the latencies would be read by primary key.
        by_pk = f'"{ProcessedRequest._meta.db_table}"."id" IN ('
        assert not [q["sql"] for q in queries if by_pk in q["sql"]]

    def test_a_job_of_a_request_already_done_is_a_duplicate(self, redis, received):
        profile = ProfileFactory()
        request = enqueue_update(profile, active=True)
        apply_update(str(request.request_id))
        assert apply_update(str(request.request_id)) == "nothing pending"
        assert [name for name, *_rest in received] == ["applied", "duplicate"]

    def test_a_value_the_database_refuses_is_rejected(self, redis, received):
        profile = ProfileFactory()
        request = enqueue_update(profile, score=-13)  # testapp_profile_score_not_minus_13
        assert apply_update(str(request.request_id)) == "1 rejected"
        [(name, _sender, kwargs, _atomic)] = received
        assert (name, kwargs["request_id"], kwargs["fields"]) == ("rejected", request.request_id, ())

    def test_a_request_whose_key_is_corrupt_is_signalled_under_its_key_as_stored(self, redis, received):
        """A key its model cannot read names no row: its rejection, and its duplicate when its job is
        delivered again, name the key as the log holds it."""
        request = enqueue_update(ProfileFactory(), active=True)
        ProcessedRequest.objects.filter(pk=request.pk).update(object_id="abc")
        assert apply_update(str(request.request_id)) == "1 rejected"
        assert apply_update(str(request.request_id)) == "nothing pending"
        assert [(name, sender, kwargs["request_id"], kwargs["pk"]) for name, sender, kwargs, _atomic in received] == [
            ("rejected", Profile, request.request_id, "abc"),
            ("duplicate", Profile, request.request_id, "abc"),
        ]

    def test_failed_once_the_retries_are_spent(self, redis, received, refusing_trigger):
        refusing_trigger("40P01")  # a deadlock: transient
        profile = ProfileFactory()
        request = enqueue_update(profile, name="forbidden")
        with pytest.raises(DatabaseError):
            apply_update(str(request.request_id))  # outside a worker: no retry left
        [(name, sender, kwargs, atomic)] = received
        assert (name, sender, kwargs["request_id"], kwargs["pk"], atomic) == (
            "failed",
            Profile,
            request.request_id,
            profile.pk,
            False,
        )

    def test_a_failed_attempt_is_announced_only_once_no_retry_follows(self, redis, received, caplog):
        """An attempt that RQ will retry is counted, not announced; the last one is signalled and logged
        with its error."""
        request = enqueue_update(ProfileFactory(), active=True)
        ProcessedRequest.objects.fail(request.request_id, "OperationalError: the first outage", final=False)
        assert received == []
        with caplog.at_level(logging.WARNING, logger="safeupdates.lifecycle"):
            ProcessedRequest.objects.fail(request.request_id, "OperationalError: the last outage", final=True)
        [(name, sender, kwargs, _atomic)] = received
        assert (name, sender, kwargs["request_id"]) == ("failed", Profile, request.request_id)
        [line] = [r.getMessage() for r in caplog.records if str(request.request_id) in r.getMessage()]
        assert line.startswith(f"safeupdates: request {request.request_id} failed: testapp.Profile")
        assert line.endswith(": OperationalError: the last outage")

    def test_a_failure_whose_row_was_purged_meanwhile_is_not_announced(self, redis, received):
        """The row of a request that failed for good is gone before its outcome is read back (a purge, an
        admin): nothing to announce, and no error in the worker that recorded the failure."""
        request = enqueue_update(ProfileFactory(), active=True)
        log_table = ProcessedRequest._meta.db_table
        purged: list[bool] = []

        def purge_after_the_update(execute, sql, params, many, context):
            result = execute(sql, params, many, context)
            if not purged and sql.lstrip().upper().startswith("UPDATE") and log_table in sql:
                purged.append(True)
                ProcessedRequest.objects.filter(pk=request.pk).delete()
            return result

        with connection.execute_wrapper(purge_after_the_update):
            ProcessedRequest.objects.fail(request.request_id, "OperationalError: the last outage", final=True)
        assert purged and not ProcessedRequest.objects.filter(pk=request.pk).exists()
        assert received == []

    def test_a_receiver_that_raises_changes_nothing(self, received, caplog):
        def raises(sender, **kwargs):
            raise RuntimeError("a receiver that raises")

        signals.request_applied.connect(raises, weak=False, dispatch_uid="tests.raises")
        try:
            profile, rid = ProfileFactory(), uuid.uuid4()
            with caplog.at_level(logging.ERROR, logger="django.dispatch"):
                result = Profile.objects.update_if_newer(
                    profile.pk, version=next_version(), request_id=rid, active=True
                )
        finally:
            signals.request_applied.disconnect(dispatch_uid="tests.raises")
        assert result.outcome == Outcome.APPLIED
        assert ProcessedRequest.objects.get(request_id=rid).status == "applied"
        assert Profile.objects.get(pk=profile.pk).active is True
        assert [name for name, *_rest in received] == ["applied"]  # the other receivers still ran
        assert any("a receiver that raises" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


@pytest.mark.workers
def test_with_workers(workers, redis, refusing_trigger):
    """Two real workers whose receivers push what they get to Redis (tests/testapp/signals.py), one of
    which raises before the others: a record of 300 requests in one job, records of two requests, a value
    the database refuses, and a record whose deadlocks outlast its retries."""
    refusing_trigger("40P01")
    burst, pairs, refused, failing = (
        ProfileFactory(),
        [ProfileFactory() for _ in range(5)],
        ProfileFactory(),
        ProfileFactory(),
    )
    with transaction.atomic():
        requests = [enqueue_update(burst, score=index) for index in range(300)]
    for profile in pairs:
        requests += [enqueue_update(profile, active=True), enqueue_update(profile, active=False)]
    requests.append(enqueue_update(refused, score=-13))
    doomed = enqueue_update(failing, name="forbidden")
    workers.start(2, env={"SAFEUPDATES_TEST_SIGNALS": "1"})
    log = ProcessedRequest.objects.filter(request_id__in=[r.request_id for r in [*requests, doomed]])
    assert wait_until(lambda: not log.filter(status="pending").exists(), 90), workers.logs()
    statuses = dict(log.values_list("request_id", "status"))

    def recorded() -> list[dict]:
        return [json.loads(entry) for entry in redis.lrange(RECORDED_KEY, 0, -1)]

    # The failed request's signal comes after its last attempt, in autocommit.
    assert wait_until(lambda: sum(e["signal"] != "duplicate" for e in recorded()) == len(statuses), 30), workers.logs()
    entries = recorded()
    outcomes = [e for e in entries if e["signal"] != "duplicate"]
    # One outcome signal per request, the one its row records, none for a rolled-back attempt.
    assert Counter(e["request_id"] for e in outcomes) == Counter(str(rid) for rid in statuses)
    assert {e["request_id"]: e["signal"] for e in outcomes} == {str(rid): status for rid, status in statuses.items()}
    assert Counter(statuses.values()) == {"applied": 6, "stale": 304, "rejected": 1, "failed": 1}
    # A duplicate is only ever a delivery of a request already done.
    assert all(statuses[uuid.UUID(e["request_id"])] != "pending" for e in entries if e["signal"] == "duplicate")
    for entry in outcomes:
        assert entry["in_transaction"] is False and entry["using"] == "default"
        assert entry["job_id"] is not None and entry["sender"] == "testapp.Profile"
    [winner] = [e for e in outcomes if e["pk"] == burst.pk and e["signal"] == "applied"]
    assert (winner["request_id"], winner["fields"], winner["held"]) == (str(requests[299].request_id), ["score"], {})
    last = requests[299].version
    assert all(e["held"] == {"score": last} for e in outcomes if e["pk"] == burst.pk and e["signal"] == "stale")
    # 300 requests, one job, one transaction: every signal of the burst names that job.
    assert len({e["job_id"] for e in outcomes if e["pk"] == burst.pk}) == 1
    assert Profile.objects.get(pk=burst.pk).score == 299
    # The receiver that raised for every applied request failed no job. The failing record's job is RQ's
    # to record as failed, after it raised: after the request's row and its signal, which the waits saw.
    assert wait_until(lambda: django_rq_failed() >= 1, 30), workers.logs()
    assert django_rq_failed() == 1  # the failing record's job only


def django_rq_failed() -> int:
    import django_rq

    return django_rq.get_queue("default").failed_job_registry.count


@pytest.mark.django_db(transaction=True)
def test_each_outcome_is_one_log_line_at_its_level_naming_its_fields(redis, caplog):
    """An applied request is one INFO line naming the fields it wrote, comma-separated; a rejected one a
    WARNING (``_announce`` 38, 40, 41, 50: every line a WARNING, a rejection an INFO, the fields joined
    otherwise)."""
    profile = ProfileFactory()
    applied = enqueue_update(profile, active=True, name="written")
    rejected = enqueue_update(ProfileFactory(), active=True)
    ProcessedRequest.objects.filter(pk=rejected.pk).update(changes={"nope": 1})
    with caplog.at_level(logging.INFO, logger="safeupdates"):
        apply_update(str(applied.request_id))
        apply_update(str(rejected.request_id))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("safeupdates: request")]
    assert lines[0] == (
        logging.INFO,
        f"safeupdates: request {applied.request_id} applied: testapp.Profile pk={profile.pk} "
        f"version={applied.version} fields=active,name",
    )
    assert lines[1][0] == logging.WARNING
    assert lines[1][1].startswith(f"safeupdates: request {rejected.request_id} rejected: testapp.Profile pk=")
    assert len(lines) == 2


@pytest.mark.django_db(transaction=True)
def test_each_request_of_a_record_whose_model_is_gone_is_one_log_line(redis, caplog):
    """Two requests of one record whose model no longer exists: rejected together, each its own WARNING
    naming the model as unknown (``_announce`` 22, 23: the label; 97: a ``break`` after the first line)."""
    from django.contrib.contenttypes.models import ContentType

    profile = ProfileFactory()
    first, second = enqueue_update(profile, active=True), enqueue_update(profile, name="second")
    gone = ContentType.objects.create(app_label="gone", model="gone")
    ProcessedRequest.objects.filter(pk__in=[first.pk, second.pk]).update(content_type=gone)
    with caplog.at_level(logging.INFO, logger="safeupdates"):
        assert apply_update(str(first.request_id)) == "2 rejected"
    lines = sorted(
        (r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("safeupdates: request")
    )
    assert lines == sorted(
        (
            logging.WARNING,
            f"safeupdates: request {request.request_id} rejected: unknown model pk=None version={request.version}: "
            "model gone.gone no longer exists",
        )
        for request in (first, second)
    )
