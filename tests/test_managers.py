from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import IntegrityError, connection, connections, transaction
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeupdates.exceptions import InvalidUpdate, LockUnavailable
from safeupdates.managers import Outcome, UpdateResult
from safeupdates.models import ProcessedRequest, RequestStatus
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.testapp.models import Profile
from tests.workers import RowLock, locked_elsewhere, run_threads, start_threads

FIELDS = ("active", "newsletter", "dark_mode")


def snapshot(profile: Profile) -> tuple:
    row = Profile.objects.values().get(pk=profile.pk)
    return tuple(sorted(row.items())), ProcessedRequest.objects.count()


@pytest.mark.django_db
class TestVersionMode:
    def test_newer_write_applies_and_raises_lock_version(self):
        profile = ProfileFactory()
        version = next_version()
        result = Profile.objects.update_if_newer(profile.pk, version=version, active=True)
        assert result == UpdateResult(applied=True, outcome=Outcome.APPLIED, version=version)
        profile.refresh_from_db()
        assert profile.active is True
        assert profile.lock_version > version  # a change token: fresh, above every version written
        assert profile.field_version("active") == version

    def test_older_write_is_a_silent_no_op(self):
        profile = ProfileFactory()
        old, new = next_version(), next_version()
        Profile.objects.update_if_newer(profile.pk, version=new, active=False)
        before = snapshot(profile)
        result = Profile.objects.update_if_newer(profile.pk, version=old, active=True)
        assert result == UpdateResult(applied=False, outcome=Outcome.STALE, version=old)
        assert snapshot(profile) == before

    def test_same_version_again_is_stale(self):
        profile = ProfileFactory()
        version = next_version()
        assert Profile.objects.update_if_newer(profile.pk, version=version, score=1).applied
        assert Profile.objects.update_if_newer(profile.pk, version=version, score=2).outcome == Outcome.STALE
        profile.refresh_from_db()
        assert profile.score == 1

    def test_guard_is_per_field(self):
        """The DESIGN example: an older, late request for `active` is not superseded by a newer one
        that changed only `newsletter`."""
        profile = ProfileFactory()
        older, newer = next_version(), next_version()
        Profile.objects.update_if_newer(profile.pk, version=newer, newsletter=True)
        result = Profile.objects.update_if_newer(profile.pk, version=older, active=True)
        assert result.outcome == Outcome.APPLIED
        profile.refresh_from_db()
        assert (profile.active, profile.newsletter) == (True, True)
        assert profile.lock_version > newer  # the older request's write moved the change token too

    def test_mixed_fields_write_only_the_newer_ones(self):
        profile = ProfileFactory()
        v1, v2 = next_version(), next_version()
        Profile.objects.update_if_newer(profile.pk, version=v2, active=True)
        result = Profile.objects.update_if_newer(profile.pk, version=v1, active=False, newsletter=True)
        assert result.applied
        profile.refresh_from_db()
        assert (profile.active, profile.newsletter) == (True, True)
        assert profile.field_versions["active"] == v2
        assert profile.field_versions["newsletter"] == v1

    def test_missing_row(self):
        result = Profile.objects.update_if_newer(10**9, version=next_version(), active=True)
        assert result.outcome == Outcome.MISSING
        assert not result.applied

    def test_text_and_integer_fields(self):
        profile = ProfileFactory()
        Profile.objects.update_if_newer(profile.pk, version=next_version(), name="O'Brien %s", score="7")
        profile.refresh_from_db()
        assert (profile.name, profile.score) == ("O'Brien %s", 7)

    def test_attname_of_a_field_is_accepted(self):
        profile = ProfileFactory()
        assert Profile.objects.update_if_newer(profile.pk, version=next_version(), note="hello").applied


@pytest.mark.django_db
class TestTimestampMode:
    def test_applies_when_newer_and_records_synced_at(self):
        profile = ProfileFactory()
        base = profile.lock_version
        t1 = timezone.now() - timedelta(minutes=5)
        result = Profile.objects.update_if_newer(profile.pk, synced_at=t1, active=True)
        assert result.applied and result.version and result.version > base
        profile.refresh_from_db()
        assert profile.last_synced_at == t1
        assert profile.lock_version > result.version
        assert profile.active is True

    def test_older_timestamp_is_stale(self):
        profile = ProfileFactory()
        now = timezone.now()
        Profile.objects.update_if_newer(profile.pk, synced_at=now, active=True)
        before = snapshot(profile)
        result = Profile.objects.update_if_newer(profile.pk, synced_at=now - timedelta(seconds=1), active=False)
        assert result.outcome == Outcome.STALE
        assert snapshot(profile) == before
        equal = Profile.objects.update_if_newer(profile.pk, synced_at=now, active=False)
        assert equal.outcome == Outcome.STALE

    def test_timestamp_write_supersedes_older_versions(self):
        profile = ProfileFactory()
        older = next_version()
        Profile.objects.update_if_newer(profile.pk, synced_at=timezone.now(), active=True)
        assert Profile.objects.update_if_newer(profile.pk, version=older, active=False).outcome == Outcome.STALE

    def test_missing_row(self):
        assert Profile.objects.update_if_newer(10**9, synced_at=timezone.now(), active=True).outcome == "missing"

    def test_naive_timestamp_refused(self):
        profile = ProfileFactory()
        before = snapshot(profile)
        with pytest.raises(InvalidUpdate, match="naive"):
            Profile.objects.update_if_newer(profile.pk, synced_at=datetime(2026, 1, 1), active=True)
        assert snapshot(profile) == before

    def test_future_beyond_skew_refused(self):
        profile = ProfileFactory()
        before = snapshot(profile)
        with pytest.raises(InvalidUpdate, match="future"):
            Profile.objects.update_if_newer(profile.pk, synced_at=timezone.now() + timedelta(minutes=6), active=True)
        assert snapshot(profile) == before
        ok = Profile.objects.update_if_newer(profile.pk, synced_at=timezone.now() + timedelta(minutes=4), active=True)
        assert ok.applied

    @override_settings(SAFEUPDATES_MAX_CLOCK_SKEW=timedelta(seconds=0))
    def test_skew_setting_read_at_call_time(self):
        profile = ProfileFactory()
        with pytest.raises(InvalidUpdate, match="SAFEUPDATES_MAX_CLOCK_SKEW"):
            Profile.objects.update_if_newer(profile.pk, synced_at=timezone.now() + timedelta(seconds=30), active=True)

    def test_without_use_tz_a_naive_timestamp_is_a_time_in_time_zone(self):
        """Under ``USE_TZ = False`` a naive ``synced_at`` is a time in ``TIME_ZONE`` (UTC here), compared
        with the database's time there, not in the time zone activated for the request; an aware one is
        refused."""
        profile = ProfileFactory()
        before = snapshot(profile)
        with override_settings(USE_TZ=False), timezone.override("Pacific/Kiritimati"):  # UTC+14
            now = datetime.now(dt_timezone(timedelta(0))).replace(tzinfo=None)
            aware = datetime(2026, 1, 2, 3, 4, tzinfo=dt_timezone(timedelta(0)))
            with pytest.raises(InvalidUpdate) as excinfo:
                Profile.objects.update_if_newer(profile.pk, synced_at=aware, active=True)
            assert str(excinfo.value) == (
                "synced_at=2026-01-02T03:04:00+00:00 is aware while USE_TZ=False; pass a naive datetime."
            )
            with pytest.raises(InvalidUpdate, match="in the future"):
                Profile.objects.update_if_newer(profile.pk, synced_at=now + timedelta(hours=10), active=True)
            assert snapshot(profile) == before
            earlier = now - timedelta(minutes=1)
            assert Profile.objects.update_if_newer(profile.pk, synced_at=earlier, active=True).applied
            profile.refresh_from_db()
            assert (profile.active, profile.last_synced_at) == (True, earlier)

    def test_other_timezones_compare_as_instants(self):
        profile = ProfileFactory()
        tz = dt_timezone(timedelta(hours=5))
        assert Profile.objects.update_if_newer(profile.pk, synced_at=timezone.now().astimezone(tz), active=True).applied


@pytest.mark.django_db
class TestIdempotency:
    def test_recorded_and_duplicate(self):
        profile = ProfileFactory()
        rid = uuid.uuid4()
        version = next_version()
        first = Profile.objects.update_if_newer(profile.pk, version=version, request_id=rid, active=True)
        assert first.outcome == Outcome.APPLIED
        record = ProcessedRequest.objects.get(request_id=rid)
        assert (record.status, record.version, record.changes, record.attempts) == (
            "applied",
            version,
            {"active": True},
            1,
        )
        assert record.target == profile
        assert record.processed_at is not None
        Profile.objects.update_if_newer(profile.pk, version=next_version(), active=False)
        before = snapshot(profile)
        again = Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=str(rid), active=True)
        assert again == UpdateResult(False, Outcome.DUPLICATE, version)
        assert snapshot(profile) == before

    def test_stale_request_is_recorded_stale(self):
        profile = ProfileFactory()
        old = next_version()
        Profile.objects.update_if_newer(profile.pk, version=next_version(), active=True)
        rid = uuid.uuid4()
        assert Profile.objects.update_if_newer(profile.pk, version=old, request_id=rid, active=False).outcome == "stale"
        assert ProcessedRequest.objects.get(request_id=rid).status == RequestStatus.STALE
        assert (
            Profile.objects.update_if_newer(profile.pk, version=old, request_id=rid, active=False).outcome
            == "duplicate"
        )

    def test_missing_target_is_recorded_rejected(self):
        rid = uuid.uuid4()
        result = Profile.objects.update_if_newer(10**9, version=next_version(), request_id=rid, active=True)
        assert result.outcome == Outcome.MISSING
        record = ProcessedRequest.objects.get(request_id=rid)
        assert record.status == RequestStatus.REJECTED
        assert "does not exist" in record.error

    def test_timestamp_mode_with_request_id(self):
        profile = ProfileFactory()
        rid = uuid.uuid4()
        now = timezone.now()
        assert Profile.objects.update_if_newer(profile.pk, synced_at=now, request_id=rid, active=True).applied
        assert (
            Profile.objects.update_if_newer(profile.pk, synced_at=now, request_id=rid, active=True).outcome
            == "duplicate"
        )
        assert ProcessedRequest.objects.get(request_id=rid).status == "applied"

    def test_missing_target_timestamp_mode(self):
        rid = uuid.uuid4()
        assert (
            Profile.objects.update_if_newer(10**9, synced_at=timezone.now(), request_id=rid, active=True).outcome
            == "missing"
        )
        assert ProcessedRequest.objects.get(request_id=rid).status == RequestStatus.REJECTED

    def test_pending_request_from_enqueue_is_applied_once(self):
        from safeupdates import enqueue_update

        profile = ProfileFactory()
        with transaction.atomic():  # keep the on-commit delivery out of this test
            request = enqueue_update(profile, active=True)
            result = Profile.objects.update_if_newer(
                profile.pk, version=request.version, request_id=request.request_id, active=True
            )
            transaction.set_rollback(False)
            assert result.outcome == Outcome.APPLIED
            request.refresh_from_db()
            assert (request.status, request.attempts) == ("applied", 1)
            assert (
                Profile.objects.update_if_newer(
                    profile.pk, version=request.version, request_id=request.request_id, active=True
                ).outcome
                == Outcome.DUPLICATE
            )
            transaction.set_rollback(True)

    def test_request_id_of_another_object_or_pending_other_changes_is_refused(self, redis):
        from safeupdates import enqueue_update

        profile, other = ProfileFactory(), ProfileFactory()
        rid = uuid.uuid4()
        Profile.objects.update_if_newer(profile.pk, synced_at=timezone.now(), request_id=rid, active=True)
        with pytest.raises(InvalidUpdate, match="another object"):
            Profile.objects.update_if_newer(other.pk, synced_at=timezone.now(), request_id=rid, active=True)
        pending = enqueue_update(profile, newsletter=True)
        before = snapshot(profile)
        with pytest.raises(InvalidUpdate) as raised:
            Profile.objects.update_if_newer(
                profile.pk, synced_at=timezone.now(), request_id=pending.request_id, newsletter=False
            )
        assert str(raised.value) == (
            f"request_id {pending.request_id} is a pending request with other changes ({{'newsletter': True}}); "
            "let its job apply it, or use a new request id."
        )
        assert snapshot(profile) == before

    def test_written_in_the_callers_transaction(self):
        profile = ProfileFactory()
        rid = uuid.uuid4()
        with pytest.raises(RuntimeError), transaction.atomic():
            Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True)
            raise RuntimeError("caller fails after the write")
        assert not ProcessedRequest.objects.filter(request_id=rid).exists()
        profile.refresh_from_db()
        assert profile.active is False


ONE_MODE = r"^pass exactly one of version= \(version mode\) or synced_at= \(timestamp mode\)\.$"


@pytest.mark.django_db
class TestInvalidUpdate:
    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"active": True}, ONE_MODE),
            ({"version": 1, "synced_at": timezone.now(), "active": True}, ONE_MODE),
            ({"version": 0, "active": True}, "positive integer"),
            ({"version": -5, "active": True}, "positive integer"),
            ({"version": True, "active": True}, "positive integer"),
            ({"version": "7", "active": True}, "positive integer"),
            ({"version": 1}, "at least one"),
            ({"version": 1, "nope": True}, "has no field 'nope'"),
            ({"version": 1, "pk": 3}, "primary key"),
            ({"version": 1, "id": 3}, "primary key"),
            ({"version": 1, "lock_version": 3}, "managed by safeupdates"),
            ({"version": 1, "field_versions": {}}, "managed by safeupdates"),
            ({"version": 1, "last_synced_at": None}, "managed by safeupdates"),
            ({"version": 1, "name": "x" * 21}, "at most 20 characters"),
            ({"version": 1, "score": "many"}, "must be an integer"),
            ({"version": 1, "active": "perhaps"}, "must be either True or False"),
            ({"version": 1, "active": None}, "must be either True or False"),
            ({"version": 1, "score": None}, "cannot be null"),
            ({"synced_at": "2026-01-01", "active": True}, "must be a datetime"),
            ({"version": 1, "request_id": "not-a-uuid", "active": True}, "must be a UUID"),
        ],
    )
    def test_refused_and_nothing_written(self, kwargs, message):
        profile = ProfileFactory()
        before = snapshot(profile)
        with pytest.raises(InvalidUpdate, match=message):
            Profile.objects.update_if_newer(profile.pk, **kwargs)
        assert snapshot(profile) == before

    def test_bad_primary_key(self):
        with pytest.raises(InvalidUpdate, match="invalid primary key"):
            Profile.objects.update_if_newer("abc", version=1, active=True)
        with pytest.raises(InvalidUpdate, match="primary key is required"):
            Profile.objects.update_if_newer(None, version=1, active=True)

    def test_relation_is_not_a_column(self, django_user_model):
        from django.contrib.auth.models import User

        with pytest.raises(InvalidUpdate):
            from safeupdates.write.validation import writable_field

            writable_field(User, "groups")


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=st.lists(st.tuples(st.sampled_from(FIELDS), st.booleans()), min_size=1, max_size=12),
    data=st.data(),
)
def test_any_order_and_duplication_ends_as_version_order(requests, data):
    """Guarantee 1: applying the requests in any order, each any number of times, ends equal to
    applying each once in version order."""
    profile = ProfileFactory()
    numbered = [(next_version(), field, value, uuid.uuid4()) for field, value in requests]
    deliveries = data.draw(st.lists(st.sampled_from(numbered), min_size=len(numbered), max_size=3 * len(numbered)))
    deliveries += numbered  # every request at least once
    deliveries = data.draw(st.permutations(deliveries))
    use_ids = data.draw(st.booleans())
    for version, field, value, rid in deliveries:
        Profile.objects.update_if_newer(
            profile.pk, version=version, request_id=rid if use_ids else None, **{field: value}
        )

    expected = {field: getattr(profile, field) for field in FIELDS}
    for _version, field, value, _rid in sorted(numbered, key=lambda r: r[0]):
        expected[field] = value
    profile.refresh_from_db()
    assert {field: getattr(profile, field) for field in FIELDS} == expected
    assert profile.lock_version > max(v for v, *_ in numbered)
    if use_ids:
        statuses = dict(ProcessedRequest.objects.filter(object_id=str(profile.pk)).values_list("request_id", "status"))
        assert len(statuses) == len(numbered)
        newest = {}
        for version, field, _value, rid in numbered:
            newest[field] = max(newest.get(field, (0, None)), (version, rid))
        winners = {rid for _v, rid in newest.values()}
        # The newest request of each field always finds an older version stored, so it is applied
        # (older ones are applied too when they arrived before it, stale otherwise).
        assert {rid for rid, status in statuses.items() if status == "applied"} >= winners


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicates_apply_once(postgres_only):
    profile = ProfileFactory()
    rid = uuid.uuid4()
    version = next_version()
    barrier = threading.Barrier(6)
    outcomes: list[Outcome] = []

    def run() -> None:
        barrier.wait()
        outcomes.append(Profile.objects.update_if_newer(profile.pk, version=version, request_id=rid, score=5).outcome)

    run_threads(run, 6)
    assert sorted(outcomes) == sorted([Outcome.APPLIED] + [Outcome.DUPLICATE] * 5)
    assert ProcessedRequest.objects.get(request_id=rid).attempts == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["version", "timestamp"])
def test_concurrent_duplicates_waiting_on_the_row_apply_once(postgres_only, mode):
    """Both calls pass the "request id unknown" test before either has written: the second must wait for
    the first's log row and report a duplicate, never an IntegrityError."""
    profile = ProfileFactory()
    rid = uuid.uuid4()
    kwargs = {"version": next_version()} if mode == "version" else {"synced_at": timezone.now()}
    outcomes: list[object] = []

    def run() -> None:
        try:
            outcomes.append(Profile.objects.update_if_newer(profile.pk, request_id=rid, active=True, **kwargs).outcome)
        except Exception as exc:  # recorded, so that the assertion shows it
            outcomes.append(exc)

    with RowLock(Profile, profile.pk):
        callers = start_threads(run, 2)
        time.sleep(0.5)  # both pass the "request id unknown" test, then wait for the row
    for caller in callers:
        caller.join()
    assert sorted(map(str, outcomes)) == ["applied", "duplicate"]


@pytest.mark.django_db(transaction=True)
class TestWithLock:
    def test_yields_the_locked_row_and_commits(self):
        profile = ProfileFactory(score=1)
        with Profile.objects.with_lock(profile.pk) as locked:
            assert connection.in_atomic_block
            locked.score += 1
            locked.save()
        profile.refresh_from_db()
        assert profile.score == 2

    def test_missing_row(self):
        with pytest.raises(Profile.DoesNotExist), Profile.objects.with_lock(10**9):
            pass

    def test_bad_timeout(self):
        with pytest.raises(InvalidUpdate, match="timeout"), Profile.objects.with_lock(1, timeout=0):
            pass

    def test_nowait_and_timeout_raise_lock_unavailable(self, postgres_only):
        profile = ProfileFactory()
        row = RowLock(Profile, profile.pk).start()
        try:
            with pytest.raises(LockUnavailable, match="nowait"), Profile.objects.with_lock(profile.pk, nowait=True):
                pass
            started = time.monotonic()
            with pytest.raises(LockUnavailable, match="timeout"), Profile.objects.with_lock(profile.pk, timeout=0.2):
                pass
            assert time.monotonic() - started >= 0.2  # the database waited, then gave up
            with transaction.atomic():  # the caller's transaction is usable after LockUnavailable
                with pytest.raises(LockUnavailable), Profile.objects.with_lock(profile.pk, nowait=True):
                    pass
                assert Profile.objects.filter(pk=profile.pk).exists()
        finally:
            row.release()
        with Profile.objects.with_lock(profile.pk, timeout=1) as locked:
            assert locked.pk == profile.pk
            with connection.cursor() as cursor:  # the lock timeout applied to the lock only
                cursor.execute("SHOW lock_timeout")
                assert cursor.fetchone()[0] == "0"

    @pytest.mark.parametrize("by_hand", [False, True], ids=["atomic", "autocommit off"])
    def test_inside_the_callers_transaction_the_lock_is_held_until_it_ends(self, by_hand, postgres_only):
        """As the docstring says: the block's exit releases nothing but what an error's savepoint took."""
        held, failed = ProfileFactory(), ProfileFactory()

        def callers_transaction() -> Any:
            if not by_hand:
                return transaction.atomic()
            transaction.set_autocommit(False)
            return contextlib.ExitStack()

        try:
            with callers_transaction():
                with Profile.objects.with_lock(held.pk):
                    pass
                with pytest.raises(RuntimeError), Profile.objects.with_lock(failed.pk):
                    raise RuntimeError
                assert locked_elsewhere(Profile, held.pk)
                assert not locked_elsewhere(Profile, failed.pk)
            if by_hand:
                assert locked_elsewhere(Profile, held.pk)
                transaction.commit()
        finally:
            transaction.set_autocommit(True)
        assert not locked_elsewhere(Profile, held.pk)

    def test_read_modify_write_under_threads(self, postgres_only):
        profile = ProfileFactory(score=0)

        def increment() -> None:
            for _ in range(10):
                with Profile.objects.with_lock(profile.pk) as locked:
                    Profile.objects.filter(pk=locked.pk).update(score=locked.score + 1)

        run_threads(increment, 4)
        profile.refresh_from_db()
        assert profile.score == 40


@pytest.mark.django_db(transaction=True)
def test_async_update_if_newer():
    profile = ProfileFactory()
    version = next_version()

    async def update() -> UpdateResult:
        try:
            return await Profile.objects.aupdate_if_newer(profile.pk, version=version, active=True)
        finally:
            await sync_to_async(connections.close_all)()

    result = asyncio.run(update())
    assert result.outcome == Outcome.APPLIED
    profile.refresh_from_db()
    assert profile.active is True


class ReadsFromAReplica:
    """A router that sends reads to a replica this test suite does not have: a read would fail."""

    def db_for_read(self, model, **hints):
        return "replica"

    def db_for_write(self, model, **hints):
        return "default"


@pytest.mark.django_db
@override_settings(DATABASE_ROUTERS=[f"{__name__}.ReadsFromAReplica"])
def test_writes_and_locks_go_to_the_routers_database_for_writes():
    profile = Profile.objects.using("default").create(name="routed")
    first, second = next_version(), next_version()
    assert Profile.objects.update_if_newer(profile.pk, version=first, active=True).applied
    assert Profile.objects.update_if_newer(profile.pk, version=second, request_id=uuid.uuid4(), newsletter=True).applied
    with Profile.objects.with_lock(profile.pk) as locked:
        assert locked.active and locked.newsletter


@pytest.mark.django_db
def test_the_apply_job_asks_the_database_it_writes_which_versions_held_a_request_back():
    """A stale request: the job reads the row's versions where it wrote, not on the router's database
    for reads (a mutation survivor: reading them there went unnoticed)."""
    from safeupdates import enqueue_update
    from safeupdates.jobs import apply_update

    profile = ProfileFactory()
    pending = enqueue_update(profile, active=True)  # not committed: never sent to a queue
    assert Profile.objects.update_if_newer(profile.pk, version=next_version(), active=False).applied
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ReadsFromAReplica"]):
        apply_update(str(pending.request_id))
    assert ProcessedRequest.objects.get(pk=pending.pk).status == RequestStatus.STALE


def waiting_on_locks(count: int, using: str = "default") -> bool:
    """True once ``count`` other backends wait for a lock on database ``using`` (the statements a test
    lined up)."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0] >= count


@pytest.mark.django_db(transaction=True)
class TestClaimBeforeWrite:
    """Two concurrent calls with one request id: the request is claimed before any row is written."""

    def race(self, calls):
        """Run ``calls`` at once, each blocked on a row lock until all are lined up; return their results."""
        from tests.workers import wait_until

        results: list = []
        errors: list = []

        def runner(call):
            def run():
                try:
                    results.append(call())
                except Exception as exc:
                    errors.append(exc)

            return run

        pks = sorted({pk for pk, _call in calls})
        locks = [RowLock(Profile, pk).start() for pk in pks]
        threads = [t for _pk, call in calls for t in start_threads(runner(call), 1)]
        try:
            assert wait_until(lambda: waiting_on_locks(len(calls)), timeout=10)
        finally:
            for lock in locks:
                lock.release()
            for thread in threads:
                thread.join()
        return results, errors

    def test_one_request_id_on_two_objects_writes_one(self, postgres_only):
        first, second = ProfileFactory(), ProfileFactory()
        rid, version = uuid.uuid4(), next_version()
        results, errors = self.race(
            [
                (pk, lambda pk=pk: Profile.objects.update_if_newer(pk, version=version, request_id=rid, active=True))
                for pk in (first.pk, second.pk)
            ]
        )
        assert [type(e) for e in errors] == [InvalidUpdate], errors
        assert [r.outcome for r in results] == [Outcome.APPLIED]
        actives = sorted(Profile.objects.filter(pk__in=[first.pk, second.pk]).values_list("active", flat=True))
        assert actives == [False, True]
        record = ProcessedRequest.objects.get(request_id=rid)
        assert Profile.objects.get(pk=record.object_id).active is True

    def test_one_request_id_with_other_changes_writes_one(self, postgres_only):
        profile = ProfileFactory()
        rid, version = uuid.uuid4(), next_version()
        results, errors = self.race(
            [
                (
                    profile.pk,
                    lambda: Profile.objects.update_if_newer(profile.pk, version=version, request_id=rid, active=True),
                ),
                (
                    profile.pk,
                    lambda: Profile.objects.update_if_newer(
                        profile.pk, version=version, request_id=rid, newsletter=True
                    ),
                ),
            ]
        )
        assert not errors
        assert sorted(r.outcome for r in results) == [Outcome.APPLIED, Outcome.DUPLICATE]
        row = Profile.objects.get(pk=profile.pk)
        recorded = ProcessedRequest.objects.get(request_id=rid).changes
        assert (row.active, row.newsletter) == (recorded.get("active", False), recorded.get("newsletter", False))
        assert row.active != row.newsletter  # exactly one of the two calls wrote

    def test_two_transactions_with_one_new_request_id_write_once_and_both_go_on(self, postgres_only):
        """The second call's one statement fails on the log's unique request id once the first commits;
        in the caller's transaction it fails inside a savepoint, so the call finds the duplicate and the
        transaction goes on to commit what it does next."""
        profile = ProfileFactory()
        rid, version = uuid.uuid4(), next_version()

        def call():
            with transaction.atomic():
                result = Profile.objects.update_if_newer(profile.pk, version=version, request_id=rid, active=True)
                Profile.objects.create(name=f"after {result.outcome}")
            return result

        results, errors = self.race([(profile.pk, call), (profile.pk, call)])
        assert not errors
        assert sorted(r.outcome for r in results) == [Outcome.APPLIED, Outcome.DUPLICATE]
        after = Profile.objects.filter(name__startswith="after ").values_list("name", flat=True)
        assert sorted(after) == ["after applied", "after duplicate"]

    def test_two_transactions_by_hand_with_one_new_request_id_write_once_and_both_go_on(self, postgres_only):
        """As above, with autocommit turned off by hand: the failed statement needs its savepoint there
        too, or PostgreSQL refuses the rest of the caller's transaction. Each outcome is signalled once
        the caller has committed and turned autocommit on again."""
        from safeupdates import signals

        profile = ProfileFactory()
        rid, version = uuid.uuid4(), next_version()
        heard: list[str] = []

        def hear(signal_name):
            def receiver(sender, request_id, **kwargs):
                heard.append(f"{signal_name} {request_id}")

            return receiver

        receivers = {"applied": hear("applied"), "duplicate": hear("duplicate")}
        for name, receiver in receivers.items():
            signals.OUTCOME_SIGNALS[name].connect(receiver, weak=False, dispatch_uid=f"by-hand-{name}")

        def call():
            transaction.set_autocommit(False)
            try:
                result = Profile.objects.update_if_newer(profile.pk, version=version, request_id=rid, active=True)
                Profile.objects.create(name=f"after {result.outcome}")
                transaction.commit()
            except BaseException:
                transaction.rollback()
                raise
            finally:
                transaction.set_autocommit(True)
            return result

        try:
            results, errors = self.race([(profile.pk, call), (profile.pk, call)])
        finally:
            for name in receivers:
                signals.OUTCOME_SIGNALS[name].disconnect(dispatch_uid=f"by-hand-{name}")
        assert not errors
        assert sorted(r.outcome for r in results) == [Outcome.APPLIED, Outcome.DUPLICATE]
        after = Profile.objects.filter(name__startswith="after ").values_list("name", flat=True)
        assert sorted(after) == ["after applied", "after duplicate"]
        assert sorted(heard) == [f"applied {rid}", f"duplicate {rid}"]

    def test_two_calls_with_a_pending_requests_id_apply_it_once(self, postgres_only, redis):
        """The request row is locked before the record is written (issue 19's probe): the second call
        waits for the first one's transaction and finds the request done, a duplicate. Without the lock
        both would write, the second one find its own version there (stale) and overwrite the status."""
        from safeupdates import enqueue_update

        profile = ProfileFactory()
        pending = enqueue_update(profile, active=True)

        def call():
            return Profile.objects.update_if_newer(
                profile.pk, version=pending.version, request_id=pending.request_id, active=True
            )

        results, errors = self.race([(profile.pk, call), (profile.pk, call)])
        assert not errors
        assert sorted(r.outcome for r in results) == [Outcome.APPLIED, Outcome.DUPLICATE]
        record = ProcessedRequest.objects.get(pk=pending.pk)
        assert (record.status, record.attempts) == ("applied", 1)
        assert Profile.objects.get(pk=profile.pk).active is True


@pytest.mark.django_db
class TestVersionsBeyondTheSource:
    @pytest.mark.parametrize("ahead", [1, 2**40])
    def test_a_version_not_handed_out_yet_is_refused(self, ahead):
        profile = ProfileFactory()
        before = snapshot(profile)
        with pytest.raises(InvalidUpdate, match="not been handed out"):
            Profile.objects.update_if_newer(profile.pk, version=next_version() + ahead, active=True)
        with pytest.raises(InvalidUpdate, match="not been handed out"):
            Profile.objects.bulk_update_if_newer([(profile.pk, next_version() + ahead, {"active": True})])
        assert snapshot(profile) == before

    @pytest.mark.parametrize("version", [2**62, 2**63, 2**64])
    def test_huge_versions_are_refused_without_a_database_error(self, version):
        profile = ProfileFactory()
        before = snapshot(profile)
        with pytest.raises(InvalidUpdate):
            Profile.objects.update_if_newer(profile.pk, version=version, request_id=uuid.uuid4(), active=True)
        with pytest.raises(InvalidUpdate):
            Profile.objects.bulk_update_if_newer([(profile.pk, version, {"active": True})])
        assert snapshot(profile) == before

    def test_a_version_handed_out_by_another_process_is_accepted(self):
        profile = ProfileFactory()
        with connections["default"].cursor() as cursor:  # as another process would: not through next_version()
            cursor.execute(
                "SELECT nextval('safeupdates_version_seq')"
                if connection.vendor == "postgresql"
                else "UPDATE safeupdates_versioncounter SET value = value + 1 RETURNING value"
            )
            version = cursor.fetchone()[0]
        assert Profile.objects.update_if_newer(profile.pk, version=version, active=True).applied


@pytest.mark.django_db(transaction=True)
def test_a_version_mode_write_without_request_id_is_one_statement_in_autocommit(postgres_only):
    """One guarded statement is atomic by itself: no transaction around it (BEGIN and COMMIT would be
    two more round trips than the ORM update it replaces)."""
    profile = Profile.objects.create(name="p")
    seen = []

    def watch(execute, sql, params, many, context):
        seen.append((sql.split()[0], connection.in_atomic_block))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watch):
        result = Profile.objects.update_if_newer(profile.pk, version=next_version(), active=True)
    assert result.outcome is Outcome.APPLIED
    assert [atomic for verb, atomic in seen if verb == "UPDATE"] == [False]
    assert Profile.objects.get(pk=profile.pk).active is True
    seen.clear()
    with connection.execute_wrapper(watch):
        stale = Profile.objects.update_if_newer(profile.pk, version=1, active=False)
    assert stale.outcome is Outcome.STALE
    assert [verb for verb, _atomic in seen] == ["UPDATE", "SELECT"]  # the write, then exists() for the outcome
    assert not any(atomic for _verb, atomic in seen)


@pytest.mark.django_db(transaction=True)
def test_a_refused_write_in_the_callers_transaction_leaves_it_usable(postgres_only):
    profile = Profile.objects.create(name="p")
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            Profile.objects.update_if_newer(profile.pk, version=next_version(), score=-13)  # the check constraint
        Profile.objects.update_if_newer(profile.pk, version=next_version(), score=2)
    assert Profile.objects.get(pk=profile.pk).score == 2


@pytest.mark.django_db
def test_a_request_the_log_refuses_is_an_error_on_every_database_not_a_lookup_failure():
    """The request log's INSERT of a new update request skips a known request id. On SQLite that is
    ``INSERT OR IGNORE``, which skips a row that breaks any constraint, not only the unique request id
    (here the JSON check of ``changes``): the row then could not be found, and the caller got
    ``DoesNotExist``. It is the database's refusal, as PostgreSQL's ``DataError`` is; nothing is written."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import DatabaseError

    content_type = ContentType.objects.get_for_model(Profile)
    request_id = uuid.uuid4()
    with pytest.raises(DatabaseError, match=f"{request_id}|invalid input syntax for type json"), transaction.atomic():
        ProcessedRequest.objects.reserve(request_id, content_type, "1", {"active": float("nan")})
    assert not ProcessedRequest.objects.filter(request_id=request_id).exists()
