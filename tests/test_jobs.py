"""The job path against real PostgreSQL, real Redis and real ``rqworker`` processes."""

from __future__ import annotations

import hashlib
import io
import random
import re
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import django_rq
import pytest
from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connection,
    connections,
    transaction,
)
from django.test import override_settings
from rq import Queue, SimpleWorker, Worker
from rq.suspension import suspend

from safeupdates import enqueue_update, jobs, signals
from safeupdates.database import statements
from safeupdates.database.errors import describe_database, is_transient
from safeupdates.delivery import rq as queues
from safeupdates.exceptions import InvalidUpdate, RequestNotFound
from safeupdates.jobs import apply_update, deliver, relay_pending
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus
from safeupdates.pipeline.relay import relay
from safeupdates.versions import next_version
from tests.conftest import _create_profile_trigger, _drop_profile_trigger
from tests.factories import DocumentFactory, ProfileFactory
from tests.redis_commands import RedisCommands
from tests.testapp.models import ActiveOnlyProfile, Profile, Tag, Vehicle
from tests.workers import ROOT, RowLock, lock_waiters, subprocess_env, wait_until

FIELDS = ("active", "newsletter", "dark_mode")


def queue():
    return django_rq.get_queue("default")


def pending() -> int:
    return ProcessedRequest.objects.filter(status=RequestStatus.PENDING).count()


def all_done(timeout: float = 60) -> bool:
    return wait_until(lambda: pending() == 0, timeout)


def expected_state(profiles, requests):
    """Every field of every record as if the requests had been applied one by one in version order."""
    state = {p.pk: {f: getattr(p, f) for f in FIELDS} for p in profiles}
    for request in sorted(requests, key=lambda r: r.version):
        for field, value in request.changes.items():
            state[int(request.object_id)][field] = value
    return state


def stored_state(profiles):
    return {
        p["pk"]: {f: p[f] for f in FIELDS}
        for p in Profile.objects.filter(pk__in=[p.pk for p in profiles]).values("pk", *FIELDS)
    }


@pytest.mark.django_db
class TestEnqueueValidation:
    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({}, "at least one"),
            ({"note": "x"}, "not in testapp.Profile.safe_update_fields"),
            ({"lock_version": 9}, "managed by safeupdates"),
            ({"nope": 1}, "has no field 'nope'"),
            ({"active": "maybe"}, "must be either True or False"),
            ({"name": "x" * 30}, "at most 20 characters"),
        ],
    )
    def test_refused_before_anything_is_written(self, redis, changes, message):
        profile = ProfileFactory()
        with pytest.raises(InvalidUpdate, match=message):
            enqueue_update(profile, **changes)
        assert ProcessedRequest.objects.count() == 0
        assert queue().count == 0

    def test_other_bad_arguments(self, redis):
        profile = ProfileFactory()
        with pytest.raises(InvalidUpdate, match="model instance or a model class"):
            enqueue_update("testapp.Profile", profile.pk, active=True)  # type: ignore[arg-type]
        with pytest.raises(InvalidUpdate, match="not a SafeUpdateModel"):
            enqueue_update(DocumentFactory(), title="x")
        with pytest.raises(InvalidUpdate, match="queue 'nope' is not in RQ_QUEUES"):
            enqueue_update(profile, queue="nope", active=True)
        with pytest.raises(InvalidUpdate, match="primary key is required"):
            enqueue_update(Profile, active=True)
        with pytest.raises(InvalidUpdate, match="must be a UUID"):
            enqueue_update(profile, request_id="x", active=True)
        assert ProcessedRequest.objects.count() == 0
        assert queue().count == 0

    def test_a_proxy_narrows_the_fields(self, redis):
        """``ActiveOnlyProfile`` lets queued jobs change ``active`` only, although its concrete model
        allows more."""
        profile = ProfileFactory()
        with pytest.raises(InvalidUpdate, match=r"name is not in testapp\.ActiveOnlyProfile\.safe_update_fields"):
            enqueue_update(ActiveOnlyProfile, profile.pk, name="x")
        with pytest.raises(InvalidUpdate, match=r"not in testapp.ActiveOnlyProfile.safe_update_fields"):
            enqueue_update(ActiveOnlyProfile.objects.get(pk=profile.pk), newsletter=True)
        assert ProcessedRequest.objects.count() == 0
        assert queue().count == 0
        request = enqueue_update(ActiveOnlyProfile, profile.pk, active=True)
        assert request.content_type == ContentType.objects.get_for_model(Profile)  # the record's own

    def test_no_rq_queues_setting_at_all(self, redis):
        profile = ProfileFactory()
        with override_settings():
            del settings.RQ_QUEUES
            with pytest.raises(
                InvalidUpdate,
                match=r"SAFEUPDATES_QUEUE is 'default', which is not a queue in RQ_QUEUES.* \(safeupdates.E002\)",
            ):
                enqueue_update(profile, active=True)
            with pytest.raises(
                InvalidUpdate, match=r"queue 'fast' is not in RQ_QUEUES; pass one of: \(none configured\)"
            ):
                enqueue_update(profile, queue="fast", active=True)
        assert ProcessedRequest.objects.count() == 0
        assert queue().count == 0

    def test_a_queue_not_configured_is_refused_with_the_ones_that_are(self, redis):
        with pytest.raises(InvalidUpdate) as refused:
            enqueue_update(ProfileFactory(), queue="nope", active=True)
        assert str(refused.value) == "queue 'nope' is not in RQ_QUEUES; pass one of: default, fast, slow."
        assert ProcessedRequest.objects.count() == 0

    def test_a_primary_key_longer_than_the_logs_object_id(self, redis):
        tag = Tag.objects.create(code="t" * 300)
        with pytest.raises(InvalidUpdate) as refused:
            enqueue_update(tag, label="x")
        assert str(refused.value) == (
            "testapp.Tag: primary key 'tttttttttt...' has 300 characters, and the request log's object_id holds "
            "at most 255: requests of this row cannot be recorded. Update it without request_id "
            "(update_if_newer()), or give the model a shorter primary key."
        )
        assert ProcessedRequest.objects.count() == 0
        assert queue().count == 0
        short = Tag.objects.create(code="t" * 255)
        enqueue_update(short, label="x")
        assert ProcessedRequest.objects.get().object_id == short.pk

    def test_records_a_pending_request_with_a_version(self, redis, django_capture_on_commit_callbacks):
        profile = ProfileFactory()
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            request = enqueue_update(Profile, profile.pk, active=True)
        assert len(callbacks) == 1
        request.refresh_from_db()
        assert (request.status, request.changes, request.object_id) == ("pending", {"active": True}, str(profile.pk))
        assert request.version > profile.lock_version
        assert request.created_at is not None
        job = queue().jobs[0]
        assert job.args == (str(request.request_id),)  # ids only, never the changes
        assert job.timeout == 60

    def test_the_pending_insert_writes_every_column_as_the_model_would(self, redis, postgres_only):
        """enqueue_update's INSERT lists its columns by hand: a column it leaves out must have a default
        in the database, and the values it writes must be the model's defaults."""
        sql, _params = statements.insert_pending(
            request_id=None, content_type_id=None, object_id="", changes=None, queue="", kind="update", status="pending"
        )
        columns = re.search(r"AS new \(([^)]*)\)", sql).group(1)
        listed = {name.strip().strip('"') for name in columns.split(",")}
        for field in ProcessedRequest._meta.concrete_fields:
            assert field.column in listed or field.primary_key or field.null or field.has_db_default(), field.name
        request = enqueue_update(ProfileFactory(), active=True)
        request.refresh_from_db()
        blank = ProcessedRequest()
        for name in ("kind", "key", "status", "error", "attempts", "processed_at"):
            assert getattr(request, name) == getattr(blank, name), name

    def test_same_request_id_returns_the_recorded_request(self, redis):
        profile = ProfileFactory()
        rid = uuid.uuid4()
        first = enqueue_update(profile, request_id=rid, active=True)
        again = enqueue_update(profile, request_id=rid, active=False)
        assert again.pk == first.pk
        assert again.changes == {"active": True}
        with pytest.raises(InvalidUpdate, match="another object"):
            enqueue_update(ProfileFactory(), request_id=rid, active=True)
        assert ProcessedRequest.objects.count() == 1


@pytest.mark.django_db(transaction=True)
class TestValuesTheDatabaseRefuses:
    """A value refused by the database for what it is (a trigger, a constraint) is the culprit's fault
    alone: it is rejected, the requests merged with it are applied. An error that is not about the value
    (a lost connection, a deadlock, a lock timeout) is retried by RQ, whatever its exception class."""

    # Not transient: raise_exception, assert_failure, check_violation, numeric value out of range,
    # insufficient privilege, object not in prerequisite state (an OperationalError all the same).
    @pytest.mark.parametrize("sqlstate", ["P0001", "P0004", "23514", "22003", "42501", "55000"])
    def test_refused_by_a_trigger_only_the_culprit_is_rejected(self, redis, refusing_trigger, sqlstate):
        refusing_trigger(sqlstate)
        profile = ProfileFactory()
        first_name = profile.name
        first = enqueue_update(profile, active=True)
        culprit = enqueue_update(profile, name="forbidden")
        last = enqueue_update(profile, newsletter=True)
        assert apply_update(str(first.request_id)) == "2 applied, 1 rejected"
        statuses = dict(ProcessedRequest.objects.values_list("pk", "status"))
        assert statuses == {first.pk: "applied", culprit.pk: "rejected", last.pk: "applied"}
        culprit.refresh_from_db()
        assert "the database refused it" in culprit.error
        assert "the name forbidden is forbidden" in culprit.error
        assert culprit.attempts == 1
        profile.refresh_from_db()
        assert (profile.active, profile.newsletter, profile.name) == (True, True, first_name)

    # Transient: serialization failure, deadlock, lock not available, admin shutdown, connection
    # failure, too many connections, query canceled (statement_timeout); though psycopg raises an
    # InternalError for them, a read-only transaction (a failover) and an internal error; and what a
    # pooler says: a protocol violation (PgBouncer's "server conn crashed?", "query_wait_timeout"), a
    # prepared statement that does not exist or already exists (its server connection changed under it).
    @pytest.mark.parametrize(
        "sqlstate",
        ["40001", "40P01", "55P03", "57P01", "08006", "53300", "57014", "25006", "XX000", "08P01", "26000", "42P05"],
    )
    def test_a_transient_error_is_raised_for_rq_to_retry(self, redis, refusing_trigger, sqlstate):
        refusing_trigger(sqlstate)
        profile = ProfileFactory()
        first = enqueue_update(profile, active=True)
        culprit = enqueue_update(profile, name="forbidden")
        with pytest.raises(DatabaseError, match="forbidden"):
            apply_update(str(first.request_id))
        # Called outside a worker there is no retry left: the job's own request is failed, the rest pending.
        statuses = dict(ProcessedRequest.objects.values_list("pk", "status"))
        assert statuses == {first.pk: "failed", culprit.pk: "pending"}

    def test_in_a_worker_with_a_retry_left_the_request_stays_pending(self, redis, refusing_trigger):
        """An RQ worker (in process, no fork) runs the job; its transient error leaves the request
        pending for the retry RQ schedules, its attempt counted."""
        refusing_trigger("40001")
        request = enqueue_update(ProfileFactory(), name="forbidden")
        SimpleWorker([queue()], connection=queue().connection).work(burst=True, max_jobs=1)
        request.refresh_from_db()
        assert (request.status, request.attempts) == ("pending", 1)
        assert queue().count + queue().scheduled_job_registry.count == 1  # RQ's retry
        assert queue().failed_job_registry.count == 0

    def test_in_a_worker_a_request_id_that_is_no_uuid_fails_with_its_retries_left_unused(self, redis):
        """Bad data fails the same way every time: the job fails at once, no retry scheduled (the
        worker-process twin is TestWithWorkers' ``..._fails_without_retries``)."""
        job = queue().enqueue_call(apply_update, args=("not-a-uuid",), **queues.job_options(1, "1"))
        assert job.retries_left == 2  # SAFEUPDATES_RETRY of the test settings
        SimpleWorker([queue()], connection=queue().connection).work(burst=True, max_jobs=1)
        assert job.get_status(refresh=True) == "failed"
        assert queue().failed_job_registry.count == 1
        assert queue().count + queue().scheduled_job_registry.count == 0  # no retry
        assert ProcessedRequest.objects.count() == 0

    def test_a_failed_attempts_error_is_kept_to_its_first_2000_characters(self, redis):
        request = enqueue_update(ProfileFactory(), active=True)
        error = "".join(f"{i:05d}" for i in range(700))  # 3,500 characters, each place its own
        ProcessedRequest.objects.fail(request.request_id, error, final=True)
        request.refresh_from_db()
        assert (request.status, request.error) == ("failed", error[:2000])

    def test_a_failed_attempt_never_overwrites_a_request_that_is_done(self, redis):
        """A job that fails after another one applied its request (a redelivery) changes nothing."""
        request = enqueue_update(ProfileFactory(), active=True)
        apply_update(str(request.request_id))
        ProcessedRequest.objects.fail(request.request_id, "a late failure", final=True)
        request.refresh_from_db()
        assert (request.status, request.attempts, request.error) == ("applied", 1, "")

    @pytest.mark.workers
    @pytest.mark.parametrize(
        ("sqlstate", "statuses", "attempts"),
        [
            # Once a culprit is found the requests are applied one by one, in version order.
            ("P0001", ["applied", "rejected", "applied"], [1, 1, 1]),
            ("40P01", ["failed", "pending", "pending"], [3, 0, 0]),  # the first try and SAFEUPDATES_RETRY's 2
        ],
    )
    def test_with_a_worker(self, workers, refusing_trigger, sqlstate, statuses, attempts):
        refusing_trigger(sqlstate)
        profile = ProfileFactory()
        with transaction.atomic():  # one job for the three
            requests = [enqueue_update(profile, **c) for c in ({"score": 1}, {"name": "forbidden"}, {"score": 2})]
        workers.start(1)
        first = requests[0]
        assert wait_until(lambda: ProcessedRequest.objects.get(pk=first.pk).status != "pending", 30), workers.logs()
        assert wait_until(lambda: queue().count == 0 and not queue().started_job_registry.count, 30)
        requests = [ProcessedRequest.objects.get(pk=r.pk) for r in requests]
        assert ([r.status for r in requests], [r.attempts for r in requests]) == (statuses, attempts)
        assert queue().failed_job_registry.count == (sqlstate != "P0001")

    def test_a_refused_batch_is_decided_one_request_at_a_time(self, redis, refusing_trigger):
        """Once the database refuses the merged write, each request is written alone, in version order:
        the culprit is rejected, one whose field a newer write holds is stale, the others are applied,
        and each is signalled with the fields it wrote."""
        refusing_trigger("P0001")
        profile = ProfileFactory(active=False)
        held = enqueue_update(profile, score=1)
        culprit = enqueue_update(profile, name="forbidden")
        applied = enqueue_update(profile, active=True)
        Profile.objects.update_if_newer(profile.pk, version=next_version(), score=5)  # newer than `held`
        seen = {}

        def receiver(sender, request_id, fields, **kwargs):
            seen[request_id] = fields

        signals.request_applied.connect(receiver, sender=Profile)
        signals.request_stale.connect(receiver, sender=Profile)
        try:
            assert apply_update(str(held.request_id)) == "1 applied, 1 rejected, 1 stale"
        finally:
            signals.request_applied.disconnect(receiver, sender=Profile)
            signals.request_stale.disconnect(receiver, sender=Profile)
        statuses = dict(ProcessedRequest.objects.values_list("pk", "status"))
        assert [statuses[r.pk] for r in (held, culprit, applied)] == ["stale", "rejected", "applied"]
        assert seen == {held.request_id: (), applied.request_id: ("active",)}
        profile.refresh_from_db()
        assert (profile.score, profile.active) == (5, True)

    def test_a_refusal_is_recorded_up_to_2000_characters(self, redis, postgres_only):
        _create_profile_trigger(
            "safeupdates_test_long", "IF NEW.name = 'forbidden' THEN RAISE EXCEPTION '%', repeat('x', 3000); END IF;"
        )
        try:
            request = enqueue_update(ProfileFactory(), name="forbidden")
            assert apply_update(str(request.request_id)) == "1 rejected"
        finally:
            _drop_profile_trigger("safeupdates_test_long")
        request.refresh_from_db()
        assert request.error.startswith("the database refused it: ProgrammingError: xxx")
        assert len(request.error) == 2000

    # lock_not_available (a lock_timeout or NOWAIT); a deadlock, transient too but no lock timeout.
    @pytest.mark.parametrize(("sqlstate", "signalled"), [("55P03", [(None, "job", "default")]), ("40P01", [])])
    def test_a_lock_timeout_in_a_job_is_signalled_as_the_jobs(self, redis, refusing_trigger, sqlstate, signalled):
        """lock_unavailable (the lock-timeout counter of the metrics) names the job as its surface, and the
        database."""
        seen = []

        def receiver(sender, **kwargs):
            seen.append((sender, kwargs["surface"], kwargs["using"]))

        refusing_trigger(sqlstate)
        request = enqueue_update(ProfileFactory(), name="forbidden")
        signals.lock_unavailable.connect(receiver)
        try:
            with pytest.raises(DatabaseError):
                apply_update(str(request.request_id))
        finally:
            signals.lock_unavailable.disconnect(receiver)
        assert seen == signalled
        # Outside a worker no retry follows: failed, with the error's class in front of its message.
        request.refresh_from_db()
        assert (request.status, request.attempts) == ("failed", 1)
        assert request.error.startswith("OperationalError: the name forbidden is forbidden")

    def test_a_failure_the_log_cannot_record_is_logged_and_the_request_left_pending(
        self, redis, refusing_trigger, caplog
    ):
        """The database refuses to record the failed attempt as well: the job logs it and raises the
        write's error; the request stays pending, for the relay."""
        refusing_trigger("40001")
        request = enqueue_update(ProfileFactory(), name="forbidden")
        table = ProcessedRequest._meta.db_table
        _create_profile_trigger("safeupdates_test_refuse_log", "RAISE EXCEPTION 'the log is read-only';", table=table)
        try:
            with pytest.raises(DatabaseError, match="the name forbidden is forbidden"):
                apply_update(str(request.request_id))
        finally:
            _drop_profile_trigger("safeupdates_test_refuse_log", table=table)
        logged = [(r.getMessage(), r.exc_info is not None) for r in caplog.records if r.name == "safeupdates"]
        assert (f"safeupdates: could not record the failure of request {request.request_id}", True) in logged
        assert "the log is read-only" in caplog.text
        request.refresh_from_db()
        assert (request.status, request.attempts, request.error) == ("pending", 0, "")


@pytest.mark.django_db(transaction=True)
class TestApplyInProcess:
    """apply_update called directly (as a worker would), for its bookkeeping."""

    def test_merges_every_pending_request_of_the_record(self, redis):
        profile = ProfileFactory()
        requests = [enqueue_update(profile, active=value) for value in (True, False, True, False)]
        requests.append(enqueue_update(profile, newsletter=True))
        assert queue().count == 1  # one job while it is queued: a burst costs one job
        assert apply_update(str(requests[0].request_id)) == "2 applied, 3 stale"
        statuses = dict(ProcessedRequest.objects.values_list("request_id", "status"))
        assert [statuses[r.request_id] for r in requests] == ["stale", "stale", "stale", "applied", "applied"]
        profile.refresh_from_db()
        assert (profile.active, profile.newsletter) == (False, True)
        assert apply_update(str(requests[1].request_id)) == "nothing pending"

    def test_again_changes_nothing(self, redis):
        profile = ProfileFactory()
        request = enqueue_update(profile, score=3)
        apply_update(str(request.request_id))
        Profile.objects.filter(pk=profile.pk).update(score=4)
        for _ in range(3):
            assert apply_update(str(request.request_id)) == "nothing pending"
        profile.refresh_from_db()
        assert profile.score == 4
        request.refresh_from_db()
        assert request.attempts == 1

    def test_bad_stored_data_is_rejected_without_retry(self, redis):
        profile = ProfileFactory()
        good = enqueue_update(profile, active=True)
        bad = enqueue_update(profile, score=1)
        ProcessedRequest.objects.filter(pk=bad.pk).update(changes={"score": "many"})
        assert apply_update(str(bad.request_id)) == "1 applied, 1 rejected"
        bad.refresh_from_db()
        assert bad.status == "rejected" and "must be an integer" in bad.error
        good.refresh_from_db()
        assert good.status == "applied"

    def test_more_than_a_batch_of_pending_requests_is_applied_in_version_order(self, redis):
        """A record with more pending requests than a job locks at once (BATCH_SIZE): the job takes them
        oldest first, a batch at a time, until none is left."""
        profile = ProfileFactory()
        count = jobs.BATCH_SIZE + 7
        with transaction.atomic():
            requests = [enqueue_update(profile, score=n) for n in range(1, count + 1)]
        # Each batch writes its newest score; the others of the batch are stale.
        assert apply_update(str(requests[0].request_id)) == f"2 applied, {count - 2} stale"
        assert pending() == 0
        applied = ProcessedRequest.objects.filter(status="applied").order_by("version")
        assert [r.changes["score"] for r in applied] == [jobs.BATCH_SIZE, count]
        done = list(ProcessedRequest.objects.order_by("version").values_list("processed_at", flat=True))
        assert done == sorted(done)  # never a newer request before an older one
        assert set(ProcessedRequest.objects.values_list("attempts", flat=True)) == {1}
        profile.refresh_from_db()
        assert profile.score == count

    def test_a_record_of_exactly_a_batch_is_no_duplicate_of_itself(self, redis, monkeypatch):
        """The job finds the record's requests all applied when it looks for a second batch: that is the
        end of its work, not a redelivery of a request already done (no ``request_duplicate``)."""
        from safeupdates.pipeline import apply

        monkeypatch.setattr(apply, "BATCH_SIZE", 3)
        profile = ProfileFactory()
        with transaction.atomic():
            requests = [enqueue_update(profile, score=n) for n in range(1, 4)]
        duplicates = []
        signals.request_duplicate.connect(lambda **kwargs: duplicates.append(kwargs), weak=False, dispatch_uid="t")
        try:
            assert apply_update(str(requests[0].request_id)) == "1 applied, 2 stale"
            assert duplicates == []
            assert apply_update(str(requests[0].request_id)) == "nothing pending"  # delivered again: one
            assert [d["request_id"] for d in duplicates] == [requests[0].request_id]
        finally:
            signals.request_duplicate.disconnect(dispatch_uid="t")

    def test_a_field_held_by_a_newer_write_is_not_logged_as_written(self, redis):
        """The guarded write wins ``newsletter`` but not ``active``, which a direct save wrote after the
        request got its version: the request for ``active`` is stale, not applied."""
        profile = ProfileFactory()
        held = enqueue_update(profile, active=True)
        won = enqueue_update(profile, newsletter=True)
        profile.refresh_from_db()
        profile.active = False
        profile.save(update_fields=["active"])
        assert apply_update(str(held.request_id)) == "1 applied, 1 stale"
        statuses = dict(ProcessedRequest.objects.values_list("pk", "status"))
        assert statuses == {held.pk: "stale", won.pk: "applied"}
        profile.refresh_from_db()
        assert (profile.active, profile.newsletter) == (False, True)

    def test_missing_target_is_rejected(self, redis):
        profile = ProfileFactory()
        request = enqueue_update(profile, active=True)
        Profile.objects.filter(pk=profile.pk).delete()
        assert apply_update(str(request.request_id)) == "1 rejected"
        request.refresh_from_db()
        assert (request.status, request.error) == ("rejected", "the target object does not exist")

    @pytest.mark.parametrize(
        ("corrupt", "error"),
        [
            ({"object_id": "abc"}, "testapp.Profile: invalid primary key 'abc': “abc” value must be an integer."),
            ({"version": None}, "the request has no version."),
            ("model", "model gone.gone no longer exists"),
            ({"content_type_id": 987654}, "content type 987654 no longer exists"),
        ],
    )
    def test_corrupt_rows_are_rejected(self, redis, corrupt, error):
        from django.contrib.contenttypes.models import ContentType

        request = enqueue_update(ProfileFactory(), active=True)
        if corrupt == "model":
            corrupt = {"content_type": ContentType.objects.create(app_label="gone", model="gone")}
        ProcessedRequest.objects.filter(pk=request.pk).update(**corrupt)
        assert apply_update(str(request.request_id)) == "1 rejected"
        request.refresh_from_db()
        assert (request.status, request.error) == ("rejected", error)

    def test_a_request_for_a_model_without_safe_update_fields_changes_nothing(self, redis):
        """A log row naming a model that has no ``safe_update_fields`` (one that stopped being a
        SafeUpdateModel, or a row written by hand) is rejected: a job may change no field of it."""
        from django.contrib.contenttypes.models import ContentType

        vehicle = Vehicle.objects.create(wheels=4)
        request = enqueue_update(ProfileFactory(), active=True)
        ProcessedRequest.objects.filter(pk=request.pk).update(
            content_type=ContentType.objects.get_for_model(Vehicle), object_id=str(vehicle.pk), changes={"wheels": 18}
        )
        assert apply_update(str(request.request_id)) == "1 rejected"
        request.refresh_from_db()
        assert request.error == (
            "testapp.Vehicle.wheels is not in testapp.Vehicle.safe_update_fields (); add it there to let queued "
            "jobs change it."
        )
        assert Vehicle.objects.get(pk=vehicle.pk).wheels == 4

    @pytest.mark.parametrize(
        ("corrupt", "error"),
        [
            ({"changes": "active"}, "changes must be a JSON object of field: value, not str."),
            ({"changes": ["active", True]}, "changes must be a JSON object of field: value, not list."),
            ({"changes": 7}, "changes must be a JSON object of field: value, not int."),
            ({"content_type": None}, "the request names no model (content_type is NULL)."),
        ],
    )
    def test_a_corrupt_row_is_rejected_and_its_record_applied(self, redis, corrupt, error):
        """A row whose ``changes`` is no JSON object, or that names no model, ends rejected whichever of the
        record's requests the job was delivered for; the record's other requests are applied."""
        profile = ProfileFactory()
        good = enqueue_update(profile, active=True)
        bad = enqueue_update(profile, newsletter=True)
        later = enqueue_update(profile, dark_mode=True)
        ProcessedRequest.objects.filter(pk=bad.pk).update(**corrupt)
        results = [apply_update(str(bad.request_id)), apply_update(str(good.request_id))]
        assert "rejected" in ", ".join(results) and "2 applied" in ", ".join(results), results
        statuses = dict(ProcessedRequest.objects.values_list("pk", "status"))
        assert statuses == {good.pk: "applied", bad.pk: "rejected", later.pk: "applied"}
        bad.refresh_from_db()
        assert (bad.error, bad.attempts) == (error, 1)
        profile.refresh_from_db()
        assert (profile.active, profile.newsletter, profile.dark_mode) == (True, False, True)
        assert relay_pending(0) == 0  # nothing left for the relay to deliver again and again

    def test_a_request_that_names_no_model_rejects_itself_only_and_once(self, redis):
        """The job of a request without a content type rejects that request: not another orphan, not an
        ``@idempotent`` task's row (which names no model either), and not again once it is done."""
        first, second = (enqueue_update(ProfileFactory(), active=True) for _ in range(2))
        ProcessedRequest.objects.filter(pk__in=[first.pk, second.pk]).update(content_type=None)
        task = ProcessedRequest.objects.create(
            request_id=uuid.uuid4(), kind=RequestKind.TASK, status=RequestStatus.PENDING, object_id=""
        )
        assert apply_update(str(second.request_id)) == "1 rejected"
        statuses = dict(ProcessedRequest.objects.values_list("pk", "status"))
        assert statuses == {first.pk: "pending", second.pk: "rejected", task.pk: "pending"}
        assert apply_update(str(second.request_id)) == "nothing pending"  # done: a duplicate delivery
        assert apply_update(str(task.request_id)) == "nothing pending"  # a task's row: no update request
        assert ProcessedRequest.objects.get(pk=second.pk).attempts == 1
        assert ProcessedRequest.objects.get(pk=task.pk).status == "pending"

    def test_an_orphan_another_transaction_holds_is_left_to_it_without_waiting(self, redis, postgres_only):
        """A request that names no model, its row locked by another job: this job leaves it (that job
        rejects it), never waiting for the lock, nor rejecting it a second time once the other commits."""
        orphan = enqueue_update(ProfileFactory(), active=True)
        ProcessedRequest.objects.filter(pk=orphan.pk).update(content_type=None)
        with RowLock(ProcessedRequest, orphan.pk):
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '2s'")  # a claim that waited would fail here, not hang
            try:
                assert apply_update(str(orphan.request_id)) == "nothing pending"
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("RESET lock_timeout")
        orphan.refresh_from_db()
        assert (orphan.status, orphan.attempts) == ("pending", 0)

    def test_a_request_another_job_held_through_the_claim_is_not_taken_for_an_orphan(self, redis, postgres_only):
        """Another job holds the record's pending request while this one claims (so the claim finds
        nothing), then lets it go without applying it (it rolled back): the request still names its
        model, so this job leaves it pending for the relay; it is no orphan to reject."""
        request = enqueue_update(ProfileFactory(), active=True)
        lock = RowLock(ProcessedRequest, request.pk).start()
        claimed = []

        def the_other_job_rolls_back_after_the_claim(execute, sql, params, many, context):
            result = execute(sql, params, many, context)
            # The claiming path's claim (the one statement of the two-round-trip path, which comes
            # first, skips the held request too, and claims nothing then).
            if not claimed and sql.upper().startswith("SELECT") and "SKIP LOCKED" in sql.upper():
                claimed.append(sql)
                lock.release()
            return result

        try:
            with connection.execute_wrapper(the_other_job_rolls_back_after_the_claim):
                assert apply_update(str(request.request_id)) == "nothing pending"
        finally:
            if not claimed:
                lock.release()
        assert claimed, "the job claimed nothing with SKIP LOCKED"
        request.refresh_from_db()
        assert (request.status, request.attempts, request.error) == ("pending", 0, "")

    @pytest.mark.workers
    def test_corrupt_rows_with_a_worker_and_the_relay(self, workers):
        profiles = [ProfileFactory() for _ in range(3)]
        requests = [enqueue_update(p, **{f: True}) for p in profiles for f in ("active", "newsletter")]
        corrupt = [{"changes": "active"}, {"changes": ["active"]}, {"content_type": None}]
        for request, values in zip(requests[::2], corrupt, strict=True):
            ProcessedRequest.objects.filter(pk=request.pk).update(**values)
        workers.start(1)

        def idle() -> bool:
            return queue().count == 0 and not queue().started_job_registry.count

        # The job of the record whose request lost its content type can no longer find the record: the
        # record's other request waits for the relay.
        for _ in range(2):
            assert wait_until(idle, 30), workers.logs()
            call_command("safeupdates_relay", "--older-than", "0", verbosity=0)
        assert all_done(30), workers.logs()
        assert [ProcessedRequest.objects.get(pk=r.pk).status for r in requests] == ["rejected", "applied"] * 3
        assert wait_until(idle, 30)
        assert queue().failed_job_registry.count == 0

    def test_a_request_this_database_does_not_hold_fails_loudly(self, redis):
        """A job run by a worker on another database (two projects sharing a queue) must not report
        success while its request stays pending for good."""
        rid = uuid.uuid4()
        name = connection.settings_dict["NAME"]
        with pytest.raises(RequestNotFound) as raised:
            apply_update(str(rid))
        assert name in describe_database("default")
        assert str(raised.value) == (
            f"request {rid} is not in database 'default' ({describe_database('default')}): this worker's "
            "DATABASES differ from those of the process that enqueued it (two projects sharing one RQ queue?), "
            "or the request was purged."
        )

    def test_a_value_the_database_refuses_is_rejected_alone(self, redis):
        profile = ProfileFactory()
        first = enqueue_update(profile, active=True)
        refused = enqueue_update(profile, score=-13)  # violates a CHECK constraint
        last = enqueue_update(profile, newsletter=True)
        assert apply_update(str(first.request_id)) == "2 applied, 1 rejected"
        statuses = dict(ProcessedRequest.objects.values_list("pk", "status"))
        assert statuses == {first.pk: "applied", refused.pk: "rejected", last.pk: "applied"}
        refused.refresh_from_db()
        assert "the database refused it: IntegrityError" in refused.error
        profile.refresh_from_db()
        assert (profile.active, profile.newsletter, profile.score) == (True, True, 0)

    def test_field_removed_from_safe_update_fields_is_rejected(self, redis, monkeypatch):
        profile = ProfileFactory()
        request = enqueue_update(profile, score=2)
        monkeypatch.setattr(Profile, "safe_update_fields", ("active",))
        apply_update(str(request.request_id))
        request.refresh_from_db()
        assert request.status == "rejected" and "safe_update_fields" in request.error

    def test_stale_after_a_direct_save(self, redis):
        profile = ProfileFactory()
        request = enqueue_update(profile, active=True)
        profile.refresh_from_db()
        profile.active = False
        profile.save()  # a direct edit supersedes requests allocated before it
        apply_update(str(request.request_id))
        request.refresh_from_db()
        assert request.status == "stale"
        profile.refresh_from_db()
        assert profile.active is False

    def test_rolled_back_caller_enqueues_nothing(self, redis):
        profile = ProfileFactory()
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue_update(profile, active=True)
            raise RuntimeError("the view failed after enqueueing")
        assert ProcessedRequest.objects.count() == 0
        assert queue().count == 0

    def test_redis_down_at_commit_leaves_the_request_for_the_relay(self, redis):
        profile = ProfileFactory()
        with override_settings(RQ_QUEUES={"default": {"URL": "redis://127.0.0.1:1/0"}}):
            request = enqueue_update(profile, active=True)  # one WARNING line: the relay will deliver it
        assert ProcessedRequest.objects.get(pk=request.pk).status == "pending"
        assert queue().count == 0
        assert relay_pending(0) == 1
        assert queue().count == 1

    def test_another_redis_error_at_commit_is_not_raised_to_the_committed_caller(self, redis):
        """Not only a lost connection: whatever enqueuing the job raises after the commit leaves the request
        for the relay. The caller's ``atomic()``, whose commit holds, does not raise (it would be taken for
        a failure and retried), and its other on-commit work runs."""
        profile = ProfileFactory()
        redis.set(queue().key, "not a list")  # every push to the queue: WRONGTYPE
        ran = []
        with transaction.atomic():
            request = enqueue_update(profile, active=True)
            transaction.on_commit(lambda: ran.append("the caller's own"))
        assert ran == ["the caller's own"]
        assert ProcessedRequest.objects.get(pk=request.pk).status == "pending"
        redis.delete(queue().key)
        assert relay_pending(0) == 1
        assert queue().count == 1

    def test_queue_name_is_registered_once_and_by_the_relay(self, redis, monkeypatch):
        """RQ adds the queue to its set of queues on every enqueue, in a round trip of its own;
        enqueue_update does it once per process, and every relay delivery does it again."""

        def registered() -> bool:
            return "default" in [q.name for q in Queue.all(connection=redis)]

        monkeypatch.setattr(queues, "_registered", set())
        enqueue_update(ProfileFactory(), active=True)
        assert registered()
        redis.flushdb()  # Redis lost its data, the set of queues with it
        with RedisCommands(redis) as sent:
            enqueue_update(ProfileFactory(), active=True)
        assert sent["SADD"] == 0  # no second round trip
        assert queue().count == 1 and not registered()
        relay_pending(0)
        assert registered()

    def test_a_relay_pass_that_finds_only_waiting_jobs_registers_the_queue(self, redis, monkeypatch):
        """Redis lost its data, then a web process gave the record its job again, without putting the
        queue back into RQ's set of queues (it did so once, before): the relay finds the job waiting and
        enqueues nothing, and puts the queue back all the same (in the pipeline it asks with)."""

        def registered() -> bool:
            return "default" in [q.name for q in Queue.all(connection=redis)]

        monkeypatch.setattr(queues, "_registered", set())
        profile = ProfileFactory()
        enqueue_update(profile, active=True)
        redis.flushdb()
        enqueue_update(profile, active=False)  # the record's job again, the queue not registered again
        assert queue().count == 1 and not registered()
        report = relay(0)
        assert (report.due, report.enqueued, report.waiting) == (1, 0, 1)
        assert registered()

    def test_a_relay_pass_settles_lost_and_waiting_jobs_in_two_pipelines(self, redis):
        """Records whose jobs Redis lost get them back in one pipeline (RQ's ``enqueue_many``), not in a
        unique-enqueue script each; a record whose job still waits keeps it, found in the same pipeline
        that asked for the others, not by a status and a place asked in turn. 100 lost jobs took 100 to
        120 ms in round trips (target: a pass under 50 ms)."""

        lost = [enqueue_update(ProfileFactory(), active=True) for _ in range(5)]
        queue().empty()  # their jobs are gone
        kept = enqueue_update(ProfileFactory(), active=True)  # its job waits in the queue
        with RedisCommands(redis) as sent:
            report = relay(0)
        assert (report.due, report.enqueued, report.waiting) == (6, 5, 1)
        assert (sent["EVALSHA"], sent["MULTI"]) == (0, 1)  # no unique script; one MULTI: enqueue_many's
        content_type = ContentType.objects.get_for_model(Profile).pk
        assert sorted(job.id for job in queue().jobs) == sorted(
            queues.job_id(content_type, str(request.object_id)) for request in [*lost, kept]
        )
        for job in queue().jobs:
            job.perform()
        assert set(ProcessedRequest.objects.values_list("status", flat=True)) == {"applied"}

    def test_a_burst_costs_one_small_round_trip_per_toggle(self, redis, postgres_only):
        """The first toggle enqueues the record's job (RQ's unique script); the next ones see other
        requests of the record pending, ask for the job's status (HGET), find it queued, and stop.
        PostgreSQL only: the hint comes with the request's INSERT, which SQLite does not have."""

        profile = ProfileFactory()
        enqueue_update(profile, active=True)
        with RedisCommands(redis) as sent:
            for value in (False, True, False):
                enqueue_update(profile, active=value)
            assert (sent["EVALSHA"], sent["HGET"]) == (0, 3)
            assert queue().count == 1
            sent.reset()
            enqueue_update(ProfileFactory(), active=True)  # another record: no pending requests, no status asked
            assert (sent["EVALSHA"], sent["HGET"]) == (1, 0)

    def test_job_hash_without_a_status_gets_a_job_of_its_own(self, redis):
        profile = ProfileFactory()
        job_id = queues.job_id(ContentType.objects.get_for_model(Profile).pk, str(profile.pk))
        redis.hset(f"rq:job:{job_id}", "origin", "default")  # exists, so not unique, but has no status
        request = enqueue_update(profile, active=True)
        [job] = queue().jobs
        assert job.id != job_id and job.args == (str(request.request_id),)

    def test_relay_command(self, redis):
        profile = ProfileFactory()
        enqueue_update(profile, active=True)
        redis.flushdb()
        from io import StringIO

        out = StringIO()
        call_command("safeupdates_relay", "--older-than", "3600", stdout=out)
        assert "0 due (pending > 3600s): enqueued 0 job(s), 0 already queued" in out.getvalue()
        call_command("safeupdates_relay", "--older-than", "0", "--dry-run", stdout=out)
        assert "would deliver 1 job(s)" in out.getvalue()
        assert queue().count == 0
        call_command("safeupdates_relay", "--older-than", "0", stdout=out)
        assert queue().count == 1

    @pytest.mark.parametrize("option", ["--older-than", "--interval"])
    @pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
    def test_relay_command_refuses_what_is_not_a_finite_number(self, redis, option, value):
        enqueue_update(ProfileFactory(), active=True)
        redis.flushdb()
        with pytest.raises(CommandError, match=f"{option} must be a"):
            call_command("safeupdates_relay", f"{option}={value}", stdout=io.StringIO())
        assert queue().count == 0


def test_the_database_named_in_errors_is_described_without_its_password(monkeypatch):
    """describe_database() (in RequestNotFound's message): vendor, name, host and port, no password."""
    config = connections["default"].settings_dict
    vendor = connections["default"].display_name
    for key, value in {"NAME": "app", "HOST": "db.example", "PORT": "6543", "PASSWORD": "s3cret"}.items():
        monkeypatch.setitem(config, key, value)
    assert describe_database("default") == f"{vendor} app at db.example:6543"
    monkeypatch.setitem(config, "PORT", "")
    assert describe_database("default") == f"{vendor} app at db.example:default port"
    monkeypatch.setitem(config, "HOST", "")  # a local socket (PostgreSQL) or a file (SQLite)
    assert describe_database("default") == f"{vendor} app"


def test_an_error_without_a_sqlstate_is_transient_if_it_is_operational():
    """No SQLSTATE (SQLite's errors, a connection lost before the server answered, an error raised with no
    cause): an OperationalError or InterfaceError is retried, any other error rejects its request."""
    locked = OperationalError("database is locked")
    locked.__cause__ = sqlite3.OperationalError("database is locked")
    refused = IntegrityError("CHECK constraint failed")
    refused.__cause__ = sqlite3.IntegrityError("CHECK constraint failed")
    assert is_transient(locked) and not is_transient(refused)
    assert is_transient(InterfaceError("connection already closed")) and is_transient(OperationalError("lost"))
    assert not is_transient(DatabaseError("refused"))
    # A driver's error whose SQLSTATE is empty has none either: the class of the error decides.
    for sqlstate in ("", None, b"40001"):
        lost, bad = OperationalError("lost"), DatabaseError("refused")
        lost.__cause__, bad.__cause__ = _DriverError(sqlstate), _DriverError(sqlstate)
        assert is_transient(lost) and not is_transient(bad), sqlstate


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


@pytest.mark.parametrize(
    ("object_id", "key"),
    [
        ("5", "5"),
        ("a-Z_9", "a-Z_9"),
        ("k" * 64, "k" * 64),
        ("k" * 65, _sha1("k" * 65)),  # RQ's ids are short
        ("a b", _sha1("a b")),  # and of letters, digits, - and _ only
        ("a:b", _sha1("a:b")),
        ("é", _sha1("é")),
    ],
)
def test_a_job_id_holds_a_short_key_as_it_is_and_any_other_as_its_digest(object_id, key):
    """Every apply job of one record shares its id (RQ's ``unique=True`` keeps one of them waiting); the
    records of two databases never share one."""
    assert queues.job_id(7, object_id) == f"safeupdates-7-{key}"
    assert queues.job_id(7, object_id, "tenant2") == f"safeupdates_tenant2-7-{key}"
    assert queues.job_id(7, object_id, "a-b") == f"safeupdates__{_sha1('a-b')[:20]}-7-{key}"
    # An alias of up to 32 ASCII letters and digits as it is, any other as a digest.
    assert queues.job_id(7, object_id, "t" * 32) == f"safeupdates_{'t' * 32}-7-{key}"
    for alias in ("t" * 33, "tenanté"):
        assert queues.job_id(7, object_id, alias) == f"safeupdates__{_sha1(alias)[:20]}-7-{key}"


class _DriverError(Exception):
    """A database driver's error carrying ``sqlstate`` as given (PostgreSQL's drivers: a code or None)."""

    def __init__(self, sqlstate: object) -> None:
        super().__init__("driver error")
        self.sqlstate = sqlstate


@pytest.mark.workers
class TestWithWorkers:
    def test_the_seeds_story_in_reverse_order(self, workers):
        """Two records, "on" then "off" each; the queued jobs are reversed before any worker runs."""
        profiles = [ProfileFactory(), ProfileFactory()]
        requests = [enqueue_update(p, active=v) for p in profiles for v in (True, False)]
        q = queue()
        ids = q.job_ids
        q.connection.delete(q.key)
        q.connection.rpush(q.key, *reversed(ids))
        workers.start(1)
        assert all_done()
        assert stored_state(profiles) == expected_state(profiles, requests)
        assert all(p["active"] is False for p in Profile.objects.values("active"))

    def test_a_request_id_that_is_no_uuid_fails_without_retries(self, workers):
        """Bad data fails the same way every time: RQ must not retry it."""
        with pytest.raises(InvalidUpdate, match="must be a UUID"):
            apply_update("not-a-uuid")
        job = queue().enqueue_call(apply_update, args=("not-a-uuid",), **queues.job_options(1, "1"))
        assert job.retries_left == 2  # SAFEUPDATES_RETRY of the test settings
        workers.start(1)
        assert wait_until(lambda: job.get_status() == "failed", 30), workers.logs()
        [worker] = Worker.all(queue=queue())
        assert worker.failed_job_count == 1, workers.logs()  # one run, no retry
        result = job.latest_result()
        assert result is not None and "InvalidUpdate: request_id must be a UUID, got 'not-a-uuid'" in result.exc_string
        assert ProcessedRequest.objects.count() == 0

    def test_a_worker_on_another_database_fails_the_job(self, workers, tmp_path):
        """Two settings share one queue: the worker whose database does not hold the request fails the job
        (RQ keeps it, with the reason), instead of "Job OK" and a request pending for good."""
        other = f"sqlite:///{tmp_path / 'other.sqlite3'}"
        migrate = [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"]
        subprocess.run(migrate, env=subprocess_env(DATABASE_URL=other), cwd=ROOT, check=True, timeout=120)
        request = enqueue_update(ProfileFactory(), active=True)
        workers.start(1, env={"DATABASE_URL": other})
        failed = queue().failed_job_registry
        assert wait_until(lambda: failed.count == 1, 30), workers.logs()
        [job] = [queue().fetch_job(job_id) for job_id in failed.get_job_ids()]
        result = job.latest_result()
        assert result is not None and result.exc_string is not None
        assert f"RequestNotFound: request {request.request_id} is not in database 'default'" in result.exc_string
        assert "other.sqlite3" in result.exc_string
        assert ProcessedRequest.objects.get(pk=request.pk).status == "pending"

    def test_a_late_older_request_is_stale(self, workers, postgres_only):
        """The "on" request gets its version first but commits last, after "off" was applied."""
        profile = ProfileFactory()
        workers.start(1)
        allocated, go = threading.Event(), threading.Event()
        holder: dict[str, ProcessedRequest] = {}

        def slow_caller() -> None:
            try:
                with transaction.atomic():
                    holder["on"] = enqueue_update(profile, active=True)
                    allocated.set()
                    go.wait(20)
            finally:
                connections.close_all()

        thread = threading.Thread(target=slow_caller)
        thread.start()
        assert allocated.wait(10)
        off = enqueue_update(profile, active=False)
        assert wait_until(lambda: ProcessedRequest.objects.get(pk=off.pk).status == "applied", 30)
        go.set()
        thread.join()
        assert all_done()
        assert ProcessedRequest.objects.get(pk=holder["on"].pk).status == "stale"
        profile.refresh_from_db()
        assert profile.active is False

    def test_duplicated_deliveries_apply_once(self, workers):
        profile = ProfileFactory()
        requests = [enqueue_update(profile, score=n) for n in range(1, 6)]
        for request in requests * 4:
            queue().enqueue(apply_update, str(request.request_id))
            deliver(request.request_id, request.content_type_id, request.object_id, "default")
        workers.start(2)
        assert all_done()
        assert wait_until(lambda: queue().count == 0, 30)
        assert list(ProcessedRequest.objects.values_list("attempts", flat=True)) == [1] * 5
        profile.refresh_from_db()
        assert profile.score == 5

    def test_flushdb_then_relay(self, workers, redis):
        profiles = [ProfileFactory() for _ in range(3)]
        requests = [enqueue_update(p, newsletter=True) for p in profiles]
        redis.flushdb()  # Redis lost every job
        workers.start(1)
        assert wait_until(lambda: workers.rq_states() == ["idle"], 30), workers.logs()
        assert pending() == 3  # nothing can run them ...
        call_command("safeupdates_relay", "--older-than", "0", verbosity=0)  # ... until the relay
        assert all_done()
        assert stored_state(profiles) == expected_state(profiles, requests)

    def test_worker_killed_mid_job(self, workers, postgres_only):
        """SIGKILL while the job's one statement waits for the row: the statement (claim, write and
        outcome together) is its own transaction, which PostgreSQL has been sent in full; it commits
        once the row is free, though its client is gone, and the request is applied once."""
        profile = ProfileFactory()
        workers.start(1)
        row = RowLock(Profile, profile.pk).start()
        request = enqueue_update(profile, active=True)
        assert wait_until(lambda: bool(lock_waiters()), 20)  # the job is blocked in its UPDATE
        backends = lock_waiters()
        workers.kill(0)
        row.release()
        assert wait_until(lambda: not _alive(backends), 20)
        request.refresh_from_db()
        assert (request.status, request.attempts) == ("applied", 1)
        workers.start(1)
        relay_pending(0)  # nothing to deliver
        assert all_done()
        request.refresh_from_db()
        assert (request.status, request.attempts) == ("applied", 1)
        profile.refresh_from_db()
        assert profile.active is True

    def test_worker_killed_mid_job_in_the_claiming_path(self, workers, postgres_only):
        """SIGKILL while a job that claimed in a transaction (its record has a request to reject) waits
        for the row: its transaction dies with it, every request stays pending; the relay redelivers."""
        profile = ProfileFactory()
        workers.start(1)
        row = RowLock(Profile, profile.pk).start()
        with transaction.atomic():
            corrupt = enqueue_update(profile, newsletter=True)
            ProcessedRequest.objects.filter(pk=corrupt.pk).update(changes="newsletter")
            request = enqueue_update(profile, active=True)
        assert wait_until(lambda: bool(lock_waiters()), 20)  # the job is blocked in its UPDATE
        backends = lock_waiters()
        workers.kill(0)
        row.release()
        # Its backend runs the UPDATE once the row is free, then finds its client gone and rolls back; a
        # surviving work horse would have committed before its backend went away.
        assert wait_until(lambda: not _alive(backends), 20)
        assert set(ProcessedRequest.objects.values_list("status", flat=True)) == {"pending"}
        assert not lock_waiters()
        workers.start(1)
        relay_pending(0)
        assert all_done()
        statuses = dict(ProcessedRequest.objects.values_list("pk", "status"))
        assert statuses == {corrupt.pk: "rejected", request.pk: "applied"}
        request.refresh_from_db()
        assert request.attempts == 1
        profile.refresh_from_db()
        assert (profile.active, profile.newsletter) == (True, False)

    def test_a_second_job_skips_the_requests_a_running_job_holds(self, workers, postgres_only):
        """Two jobs of one record at once (a duplicate delivery): the second must not wait for the
        requests the first one has locked, nor hold a worker while it runs."""
        profile = ProfileFactory()
        workers.start(1)
        row = RowLock(Profile, profile.pk).start()
        try:
            request = enqueue_update(profile, active=True)
            assert wait_until(lambda: bool(lock_waiters()), 20)  # the job holds the request, waits for the row
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '3s'")
            try:
                assert apply_update(str(request.request_id)) == "nothing pending"
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("RESET lock_timeout")
        finally:
            row.release()
        assert all_done(30)
        request.refresh_from_db()
        assert (request.status, request.attempts) == ("applied", 1)

    def test_no_window_while_a_job_of_the_record_runs(self, workers, postgres_only):
        """A request committed after its record's job started gets a job of its own, not the relay."""
        profile = ProfileFactory()
        workers.start(2)
        row = RowLock(Profile, profile.pk).start()
        first = enqueue_update(profile, active=True)
        assert wait_until(lambda: bool(lock_waiters()), 20)
        second = enqueue_update(profile, newsletter=True)
        row.release()
        assert all_done(30)  # no relay ran
        assert set(ProcessedRequest.objects.values_list("status", flat=True)) == {"applied"}
        assert {first.pk, second.pk} == set(ProcessedRequest.objects.values_list("pk", flat=True))

    def test_requests_while_a_job_of_the_record_runs_share_one_follow_up_job(self, workers, postgres_only):
        """A burst that lands while the record's job runs (a slow or cut-off worker) costs one more job,
        not one job per toggle: the record's follow-up job, queued once, applies them all."""
        profile = ProfileFactory()
        workers.start(1)
        row = RowLock(Profile, profile.pk).start()
        enqueue_update(profile, active=True)
        assert wait_until(lambda: bool(lock_waiters()), 20)
        for value in (False, True, False, True):
            enqueue_update(profile, active=value)
        assert queue().count == 1  # before: 4, one per toggle
        row.release()
        assert all_done(30)  # no relay ran
        assert Profile.objects.get(pk=profile.pk).active is True
        assert set(ProcessedRequest.objects.values_list("status", flat=True)) <= {"applied", "stale"}

    def test_transient_error_is_retried(self, workers, postgres_only):
        """The job's connection is terminated mid-statement: RQ retries it and it applies once."""
        profile = ProfileFactory()
        workers.start(1)
        row = RowLock(Profile, profile.pk).start()
        request = enqueue_update(profile, active=True)
        assert wait_until(lambda: bool(lock_waiters()), 20)
        _terminate_waiting_backends()
        row.release()
        assert all_done()
        request.refresh_from_db()
        assert request.status == "applied"
        assert request.attempts == 2  # the failed attempt and the successful one
        assert request.error == ""

    @override_settings(SAFEUPDATES_RETRY={"max": 1, "interval": 0})
    def test_failed_once_retries_are_spent(self, workers, postgres_only):
        profile = ProfileFactory()
        workers.start(1)
        row = RowLock(Profile, profile.pk).start()
        request = enqueue_update(profile, active=True)
        try:
            for _ in range(2):  # the first try and its one retry
                assert wait_until(lambda: bool(lock_waiters()), 20)
                terminated = _terminate_waiting_backends()
                assert wait_until(lambda pids=terminated: not _alive(pids), 10)  # not seen waiting next time
            assert wait_until(lambda: ProcessedRequest.objects.get(pk=request.pk).status == "failed", 30)
        finally:
            row.release()
        request.refresh_from_db()
        assert request.attempts == 2
        assert "OperationalError" in request.error
        profile.refresh_from_db()
        assert profile.active is False
        # The failed job keeps the record's job id (RQ's failed registry): the next request of the record
        # gets a job of its own, and no relay is needed.
        second = enqueue_update(profile, newsletter=True)
        assert wait_until(lambda: ProcessedRequest.objects.get(pk=second.pk).status == "applied", 30)


def _terminate_waiting_backends() -> list[int]:
    """Terminate the backends waiting for a lock (the job's connection): a transient error for it."""
    pids = lock_waiters()
    with connection.cursor() as cursor:
        for pid in pids:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    return pids


def _alive(pids: list[int]) -> bool:
    """Whether any of these backends still exists."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
        return cursor.fetchone()[0] > 0


@pytest.mark.workers
def test_stress_kills_flush_duplicates_shuffle(workers, redis):
    """Issue 3's bar: 2,000+ random single-field toggles on 40 records, 3 workers, 3 SIGKILLs, one
    FLUSHDB mid-run, a fifth of the jobs delivered twice, the queue shuffled, then the relay."""
    rng = random.Random(20261129)
    profiles = [ProfileFactory() for _ in range(40)]
    # After the flush only `active` records get toggles: the requests of the `frozen` ones lost with
    # Redis can only come back through the relay.
    frozen, active = profiles[:10], profiles[10:]
    workers.start(3)
    q = queue()
    requests: list[ProcessedRequest] = []
    kills_at, flush_at = {500, 1000, 1500}, 1250
    lost_in_flush = 0
    started = time.monotonic()

    def toggle(profile: Profile) -> None:
        request = enqueue_update(profile, **{rng.choice(FIELDS): rng.random() < 0.5})
        requests.append(request)
        if rng.random() < 0.2:  # a duplicate delivery of this request's job
            q.enqueue(apply_update, str(request.request_id))

    for n in range(2000):
        toggle(rng.choice(profiles if n < flush_at else active))
        if n % 100 == 99:  # shuffle whatever is queued
            ids = q.job_ids
            rng.shuffle(ids)
            with q.connection.pipeline() as pipe:
                pipe.delete(q.key)
                if ids:
                    pipe.rpush(q.key, *ids)
                pipe.execute()
        if n in kills_at:
            workers.kill(next(i for i, p in enumerate(workers.procs) if p.poll() is None))
            workers.start(1)
        if n == flush_at:
            # Hold the workers (RQ's own suspension) so that the jobs of this burst are surely still
            # queued when Redis loses everything; FLUSHDB also drops the suspension flag.
            suspend(q.connection)
            # A worker that found the queue empty waits in its blocking dequeue and sees the suspension
            # only when a job comes: one harmless job per worker wakes each one that waits.
            for _ in range(workers.alive()):
                q.enqueue("time.sleep", 0, result_ttl=0)
            assert wait_until(lambda: workers.rq_states() == ["suspended"] * workers.alive(), 60), workers.logs()
            for profile in frozen:
                toggle(profile)
            lost_in_flush = pending()
            redis.flushdb()
    enqueued = time.monotonic() - started
    wait_until(lambda: q.count == 0, 120)
    wait_until(lambda: pending() <= lost_in_flush, 60)
    pending_before_relay = pending()
    relay_passes = 0
    while pending() and relay_passes < 20:
        relay_pending(0)
        relay_passes += 1
        wait_until(lambda: pending() == 0, 10)
    elapsed = time.monotonic() - started

    statuses = Counter(ProcessedRequest.objects.values_list("status", flat=True))
    print(
        f"\nstress: {len(requests)} toggles, 40 records, 3 workers, 3 SIGKILLs, FLUSHDB with {lost_in_flush} "
        f"requests queued: enqueued in {enqueued:.1f}s, all terminal after {elapsed:.1f}s; "
        f"{pending_before_relay} pending before the relay, {relay_passes} relay pass(es); statuses {dict(statuses)}"
    )
    assert lost_in_flush >= len(frozen)
    assert pending_before_relay > 0 and relay_passes >= 1  # the relay, not luck, delivered them
    assert set(statuses) <= {"applied", "stale"}, statuses
    assert sum(statuses.values()) == len(requests)
    for request in requests:
        request.refresh_from_db()
    assert stored_state(profiles) == expected_state(profiles, requests)
    assert set(ProcessedRequest.objects.values_list("attempts", flat=True)) == {1}
    # The newest request of every (record, field) was applied: nothing newer was dropped as stale.
    newest: dict[tuple[str, str], ProcessedRequest] = {}
    for request in requests:
        key = (request.object_id, next(iter(request.changes)))
        if key not in newest or newest[key].version < request.version:
            newest[key] = request
    assert {r.status for r in newest.values()} == {"applied"}


@pytest.mark.django_db
@pytest.mark.parametrize("status", [RequestStatus.PENDING, RequestStatus.FAILED])
def test_finish_records_only_a_jobs_own_outcomes(status):
    """A job's outcomes are applied, stale or rejected; anything else is a bug of the caller, refused
    with its status named, and nothing of the batch is recorded."""
    from safeupdates.lifecycle import Result

    applied, odd = (ProcessedRequest.objects.create(object_id="1", version=v) for v in (1, 2))
    batch = [Result(applied, RequestStatus.APPLIED), Result(odd, status)]
    with pytest.raises(ValueError, match=rf"^finish\(\) records applied, stale or rejected, not {status!r}$"):
        ProcessedRequest.objects.finish(batch, None)
    assert set(ProcessedRequest.objects.values_list("status", "attempts")) == {(RequestStatus.PENDING, 0)}


# --- a delivery: the record's job, its follow-up job, then a job of the request's own (mutation survivors) ---


@pytest.mark.django_db(transaction=True)
def test_a_request_whose_records_job_waits_with_nothing_pending_is_left_to_that_job(redis):
    """The record's job still waits in the queue, but its requests were applied meanwhile (as a sweep applies
    a record whose job waits): the next request, the only one pending, is left to that job, which reads it
    when it starts. No follow-up job (``deliver_with_outcome`` 44 enqueued one)."""
    profile = ProfileFactory()
    enqueue_update(profile, active=True)
    [job] = queue().jobs
    assert apply_update(job.args[0]) == "1 applied"
    second = enqueue_update(profile, active=False)
    assert queue().job_ids == [job.id]
    assert apply_update(job.args[0]) == "1 applied"
    second.refresh_from_db()
    assert second.status == RequestStatus.APPLIED


@pytest.mark.django_db(transaction=True)
def test_a_request_whose_records_two_jobs_have_started_gets_a_job_of_its_own(redis):
    """The record's job and its follow-up job have both started (a worker cut off mid-job leaves a job so):
    either may have read the pending requests already, so the next request gets a job of its own, with
    its id, its database and the caller's meta (``deliver_with_outcome`` 60 to 66 dropped them)."""
    from rq.job import JobStatus

    profile = ProfileFactory()
    content_type = ContentType.objects.get_for_model(Profile).pk
    record_job = queues.job_id(content_type, str(profile.pk))
    enqueue_update(profile, active=True)
    queue().fetch_job(record_job).set_status(JobStatus.STARTED)
    enqueue_update(profile, active=False)
    queue().fetch_job(f"{record_job}-next").set_status(JobStatus.STARTED)
    request = enqueue_update(profile, newsletter=True)
    [own] = [job for job in queue().jobs if job.id not in (record_job, f"{record_job}-next")]
    assert (own.func_name, own.args, own.kwargs) == (queues.APPLY_UPDATE, (str(request.request_id),), {})
    job, outcome = queues.deliver_with_outcome(
        request.request_id, content_type, str(profile.pk), "default", meta={"trace": "of the caller"}
    )
    assert outcome == queues.ENQUEUED and job is not None
    stored = queue().fetch_job(job.id)
    assert (stored.args, stored.kwargs, stored.meta.get("trace")) == ((str(request.request_id),), {}, "of the caller")
    # ... and the options of every apply job: its timeout, retries, no result kept (67 dropped them).
    first = queue().fetch_job(record_job)
    assert (stored.timeout, stored.result_ttl, stored.retries_left, stored.retry_intervals, stored.description) == (
        first.timeout,
        first.result_ttl,
        first.retries_left,
        first.retry_intervals,
        first.description,
    )
    assert stored.result_ttl == 0 and stored.retries_left
    assert stored.failure_ttl == 7 * 24 * 3600  # a failed job is kept 7 days (docs/limits.md)
    assert apply_update(*stored.args) == "2 applied, 1 stale"  # the older "active" is stale
    # A request of another database: its job carries that database (``deliver_with_outcome`` 61 dropped it).
    for _ in range(2):  # that database's record job and follow-up job, started
        started, _outcome = queues.deliver_with_outcome(
            request.request_id, content_type, str(profile.pk), "default", using="tenant"
        )
        assert started is not None
        started.set_status(JobStatus.STARTED)
    own, outcome = queues.deliver_with_outcome(
        request.request_id, content_type, str(profile.pk), "default", using="tenant"
    )
    assert outcome == queues.ENQUEUED and own is not None
    assert queue().fetch_job(own.id).kwargs == {"using": "tenant"}


@pytest.mark.django_db(transaction=True)
def test_a_queue_enqueues_at_once_also_inside_a_transaction(settings, redis):
    """django-rq's default commit mode (``on_db_commit``) holds an ``enqueue_call()`` made inside a
    transaction until it commits, and returns None. safeupdates' queues enqueue at once: its callers choose
    the moment, for example in ``on_commit`` (``get_queue`` 10 left django-rq's default)."""
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, "at-once": settings.RQ_QUEUES["default"]}  # built anew
    with transaction.atomic():
        job = queues.get_queue("at-once").enqueue_call(print, args=("now",))
        assert job is not None and redis.exists(job.key)
