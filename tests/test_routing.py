"""A database per tenant: two databases (``default`` and ``tenant``), models routed by tenant. Each
operation runs on the database of its records, and versions and request ids never cross between them.

A request's job carries its database when that is not ``default`` (and its job id names it), so that a
worker applies it where it was enqueued, and records of two databases never share a job.
(The reads that decide a write against a real, lagging streaming replica are in
``tests/faults/test_replica.py``.)
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from io import StringIO
from typing import Any

import django_rq
import pytest
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connections, transaction
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone
from rq import SimpleWorker

from safeupdates import enqueue_update, signals
from safeupdates.contrib.batches.jobs import fan_out
from safeupdates.contrib.batches.models import Batch
from safeupdates.contrib.idempotent.decorators import SKIPPED, idempotent
from safeupdates.delivery.rq import job_id
from safeupdates.exceptions import InvalidUpdate
from safeupdates.jobs import apply_update, relay, relay_pending
from safeupdates.managers import SafeUpdateQuerySet
from safeupdates.models import ProcessedRequest, RequestStatus, VersionCounter
from safeupdates.versions import _next_from_counter, last_issued, next_version, raise_floor
from safeupdates.write.validation import clean_changes
from tests.conftest import _create_profile_trigger, _drop_profile_trigger
from tests.test_managers import waiting_on_locks
from tests.testapp.batch_jobs import add_score, record_reduce
from tests.testapp.models import ActiveOnlyProfile, Bookmark, Document, Profile, Restaurant, Specimen
from tests.workers import RowLock, start_threads, wait_until

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "tenant"])

TENANT = "tenant"
_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


class TenantRouter:
    """Every model of the current tenant's context on the tenant's database; elsewhere Django's default
    (an instance's own database, else ``default``)."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return _tenant.get()

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return _tenant.get()


class ProfilesOnTheTenant:
    """Writes of ``Profile`` to the tenant's database, by model alone."""

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return TENANT if model is Profile else None


@contextmanager
def tenant(alias: str = TENANT) -> Iterator[None]:
    token = _tenant.set(alias)
    try:
        yield
    finally:
        _tenant.reset(token)


@pytest.fixture(autouse=True)
def routed() -> Iterator[None]:
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.TenantRouter"]):
        yield


def twins() -> tuple[Profile, Profile]:
    """A record in each database, with the same primary key."""
    home = Profile.objects.using("default").create(name="home")
    away = Profile.objects.using(TENANT).create(pk=home.pk, name="away")
    return home, away


def log(alias: str) -> Any:
    return ProcessedRequest.objects.using(alias)


def run_jobs() -> None:
    """Run every queued job in this process, outside any tenant's context (as a worker would)."""
    queue = django_rq.get_queue("default")
    SimpleWorker([queue], connection=queue.connection).work(burst=True)


def test_update_if_newer_records_and_checks_versions_in_its_database(redis):
    home, away = twins()
    # The default database's versions run ahead: one of them was never handed out by the tenant's.
    for _ in range(5):
        next_version("default")
    ahead = next_version("default")
    assert ahead > last_issued(TENANT)
    with pytest.raises(InvalidUpdate, match=f"version {ahead} has not been handed out"):
        Profile.objects.using(TENANT).update_if_newer(away.pk, version=ahead, active=True)

    # One request id in each database: two requests, each applied once, in its own log.
    request_id = uuid.uuid4()
    for alias, version in (("default", ahead), (TENANT, next_version(TENANT))):
        result = Profile.objects.using(alias).update_if_newer(
            home.pk, version=version, request_id=request_id, active=True
        )
        assert (result.outcome, result.version) == ("applied", version)
        assert list(log(alias).values_list("request_id", "version", "status")) == [(request_id, version, "applied")]
    assert Profile.objects.using(TENANT).get(pk=away.pk).active


def test_update_if_newer_tells_stale_from_missing_by_the_row_in_its_database():
    """Nothing written: whether there is a row is asked of the database written to, never of default."""
    only_home = Profile.objects.using("default").create(name="home only")
    result = Profile.objects.using(TENANT).update_if_newer(only_home.pk, version=next_version(TENANT), active=True)
    assert result.outcome == "missing"
    only_away = Profile.objects.using(TENANT).create(pk=only_home.pk + 1000, name="away only")
    older = next_version(TENANT)
    newer = next_version(TENANT)
    assert Profile.objects.using(TENANT).update_if_newer(only_away.pk, version=newer, active=True).applied
    result = Profile.objects.using(TENANT).update_if_newer(only_away.pk, version=older, active=False)
    assert result.outcome == "stale"
    assert not Profile.objects.using("default").filter(pk=only_away.pk).exists()


def test_two_tenant_transactions_with_one_new_request_id_write_once_and_both_go_on(postgres_only):
    """The loser of the race for a request id fails on the tenant log's unique index inside a savepoint
    on the tenant's database, so its transaction there finds the duplicate and goes on to commit what it
    does next (a savepoint on ``default`` would leave the tenant's transaction aborted)."""
    _home, away = twins()
    request_id, version = uuid.uuid4(), next_version(TENANT)
    results: list[Any] = []
    errors: list[Exception] = []

    def call() -> None:
        try:
            with transaction.atomic(using=TENANT):
                result = Profile.objects.using(TENANT).update_if_newer(
                    away.pk, version=version, request_id=request_id, active=True
                )
                Document.objects.using(TENANT).create(title=f"after {result.outcome}")
            results.append(result.outcome)
        except Exception as exc:
            errors.append(exc)

    lock = RowLock(Profile, away.pk, using=TENANT).start()  # both calls line up behind it
    threads = [t for _ in range(2) for t in start_threads(call, 1)]
    try:
        assert wait_until(lambda: waiting_on_locks(2, using=TENANT), 10)
    finally:
        lock.release()
        for thread in threads:
            thread.join()
    assert not errors, errors
    assert sorted(results) == ["applied", "duplicate"]
    after = Document.objects.using(TENANT).values_list("title", flat=True)
    assert sorted(after) == ["after applied", "after duplicate"]
    assert list(log(TENANT).values_list("request_id", "status")) == [(request_id, "applied")]
    assert not log("default").exists()


def test_what_a_stale_request_was_held_by_is_read_on_its_database():
    """Timestamp mode records after it writes: the versions that held a stale request are read from
    the row it was about, on its database, not from its twin of the same key elsewhere."""
    _home, away = twins()
    now = timezone.now()
    first = Profile.objects.using(TENANT).update_if_newer(away.pk, synced_at=now, active=True)
    got: list[dict[str, int]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        got.append(kwargs["held"])

    signals.request_stale.connect(receiver, weak=False, dispatch_uid="tests.routing.stale")
    try:
        result = Profile.objects.using(TENANT).update_if_newer(
            away.pk, synced_at=now - timedelta(seconds=1), request_id=uuid.uuid4(), active=False
        )
    finally:
        signals.request_stale.disconnect(dispatch_uid="tests.routing.stale")
    assert result.outcome == "stale"
    assert got == [{"active": first.version}]


def test_enqueue_update_writes_the_request_to_the_routers_database(redis):
    _home, away = twins()
    with tenant():
        request = enqueue_update(Profile, away.pk, active=True)
    assert list(log(TENANT).values_list("request_id", flat=True)) == [request.request_id]
    assert not log("default").exists()
    assert request.version is not None and request.version <= last_issued(TENANT)


def test_enqueue_update_using_writes_to_that_database(redis):
    _home, away = twins()
    request = enqueue_update(Profile, away.pk, using=TENANT, active=True)
    assert log(TENANT).filter(request_id=request.request_id).exists()
    assert not log("default").exists()


def test_enqueue_update_of_an_instance_follows_its_database(redis):
    _home, away = twins()
    request = enqueue_update(away, active=True)  # no router decides here: the instance's database should
    assert log(TENANT).filter(request_id=request.request_id).exists()
    assert not log("default").exists()


def test_a_tenants_request_is_delivered_when_the_tenants_transaction_commits(redis):
    """Its job is enqueued on the commit of the transaction that wrote the request, on the tenant's
    database, never before it (the job would find no request, and leave it to the relay), and never for
    a request rolled back."""
    _home, away = twins()
    queue = django_rq.get_queue("default")
    with pytest.raises(RuntimeError), transaction.atomic(using=TENANT):
        enqueue_update(away, active=False)
        raise RuntimeError("the caller failed after enqueueing")
    assert (queue.count, log(TENANT).count()) == (0, 0)
    with transaction.atomic(using=TENANT):
        request = enqueue_update(away, active=True)
        assert queue.count == 0
    assert queue.job_ids == [job_id(request.content_type_id, request.object_id, TENANT)]


def test_the_apply_job_of_a_tenants_request_applies_it_on_the_tenants_database(redis):
    _home, away = twins()
    with tenant():
        request = enqueue_update(Profile, away.pk, active=True)
    run_jobs()
    assert log(TENANT).get(pk=request.pk).status == RequestStatus.APPLIED
    assert Profile.objects.using(TENANT).get(pk=away.pk).active


def test_a_foreign_key_is_checked_on_the_database_the_request_is_written_to(redis):
    """A foreign key's target must exist where the row is written, when the request is enqueued and again
    when its job applies it: the tenant's document, which ``default`` lacks, is accepted, and one only on
    ``default`` refused; one deleted from the tenant's database before the job ran is refused by the job,
    nothing written."""
    document = Document.objects.using(TENANT).create(title="tenant's")
    gone = Document.objects.using(TENANT).create(title="deleted before the job")
    assert not Document.objects.using("default").filter(pk__in=[document.pk, gone.pk]).exists()
    kept, emptied = (Bookmark.objects.using(TENANT).create(label=label) for label in ("kept", "emptied"))
    home_only = Document.objects.using("default").create(pk=gone.pk + 1000, title="default's")
    with tenant():
        earlier = enqueue_update(Bookmark, kept.pk, document=document.pk)
        refused = enqueue_update(Bookmark, emptied.pk, document=gone.pk)
    # Given the database (using=) outside the tenant's context, where Django's own reads go to default:
    # the target is looked for where the request is written, not where the router reads.
    logged = log(TENANT).count()
    with pytest.raises(
        InvalidUpdate,
        match=rf"^testapp.Bookmark.document={home_only.pk} is invalid: document instance with id {home_only.pk} is",
    ):
        enqueue_update(Bookmark, kept.pk, using=TENANT, document=home_only.pk)
    assert log(TENANT).count() == logged
    applied = enqueue_update(Bookmark, kept.pk, using=TENANT, document=document.pk)  # the tenant's only: accepted
    Document.objects.using(TENANT).filter(pk=gone.pk).delete()
    run_jobs()
    assert [log(TENANT).get(pk=r.pk).status for r in (earlier, applied)] == ["stale", "applied"]  # newest wins
    assert Bookmark.objects.using(TENANT).get(pk=kept.pk).document_id == document.pk
    rejected = log(TENANT).get(pk=refused.pk)
    assert (rejected.status, rejected.error) == (
        RequestStatus.REJECTED,
        f"testapp.Bookmark.document={gone.pk} is invalid: document instance with id {gone.pk} is not a valid choice.",
    )
    assert Bookmark.objects.using(TENANT).get(pk=emptied.pk).document_id is None


def test_a_tenants_job_sweeps_the_tenants_records_but_those_whose_write_spans_tables(redis):
    """A job on the tenant's database sweeps the tenant's other waiting records, and tells by the tenant's
    content types (their ids differ from the default database's) which of them span tables."""
    _home, away = twins()
    other = Profile.objects.using(TENANT).create(name="other")
    restaurant = Restaurant.objects.using(TENANT).create(name="Luigi's")
    requests = [enqueue_update(record, using=TENANT, active=True) for record in (away, other)]
    child = enqueue_update(restaurant, using=TENANT, serves_pizza=True)
    queue = django_rq.get_queue("default")
    assert queue.job_ids[0] == job_id(requests[0].content_type_id, requests[0].object_id, TENANT)
    SimpleWorker([queue], connection=queue.connection).work(burst=True, max_jobs=1)
    assert [log(TENANT).get(pk=r.pk).status for r in (*requests, child)] == ["applied", "applied", "pending"]
    assert queue.job_ids == [job_id(child.content_type_id, child.object_id, TENANT)]


def test_a_tenants_swept_request_that_is_stale_is_decided_on_the_tenants_row(redis):
    """A swept record whose request wrote nothing (the row moved on since) is told stale by its own
    row, on the tenant's database, where ``default`` has no row of that key."""
    away = Profile.objects.using(TENANT).create(pk=10_001, name="away")
    other = Profile.objects.using(TENANT).create(pk=10_002, name="other")
    first = enqueue_update(away, using=TENANT, active=True)
    late = enqueue_update(other, using=TENANT, active=True)
    moved = Profile.objects.using(TENANT).get(pk=other.pk)
    moved.active = False
    moved.save()  # a newer write of the field: the request is stale
    assert not Profile.objects.using("default").filter(pk__in=[away.pk, other.pk]).exists()
    queue = django_rq.get_queue("default")
    assert queue.job_ids[0] == job_id(first.content_type_id, first.object_id, TENANT)
    SimpleWorker([queue], connection=queue.connection).work(burst=True, max_jobs=1)
    assert queue.count == 0  # the other record was swept
    assert [log(TENANT).get(pk=r.pk).status for r in (first, late)] == ["applied", "stale"]


def test_a_tenants_job_leaves_a_record_whose_row_is_held_and_waits_for_none(redis, postgres_only):
    """The sweep's row locks (SKIP LOCKED) are taken on the tenant's database: a row another transaction
    holds there is left to its own job, and the rest of the page is applied without waiting for it."""
    _home, away = twins()
    held, free = (Profile.objects.using(TENANT).create(name=name) for name in ("held", "free"))
    requests = [enqueue_update(record, using=TENANT, active=True) for record in (away, held, free)]
    queue = django_rq.get_queue("default")
    with RowLock(Profile, held.pk, using=TENANT), override_settings(SAFEUPDATES_JOB_TIMEOUT=2):
        SimpleWorker([queue], connection=queue.connection).work(burst=True, max_jobs=1)
        assert [log(TENANT).get(pk=r.pk).status for r in requests] == ["applied", "pending", "applied"]
        assert queue.job_ids == [job_id(requests[1].content_type_id, requests[1].object_id, TENANT)]


def test_records_of_two_databases_never_share_a_job(redis):
    home, away = twins()
    # Two databases migrated alike number their content types alike: here, whatever order the test
    # databases were set up in.
    shared = ContentType.objects.db_manager("default").get_for_model(Profile).pk
    ContentType.objects.using(TENANT).all().delete()
    ContentType.objects.using(TENANT).create(pk=shared, app_label="testapp", model="profile")
    ContentType.objects.clear_cache()
    enqueue_update(Profile, home.pk, active=True)
    with tenant():
        enqueue_update(Profile, away.pk, active=True)
    assert django_rq.get_queue("default").count == 2


def test_a_request_names_its_databases_own_content_type_read_again_once_the_cache_is_cleared():
    """Each database numbers its content types: a request carries the one of its own database, also
    after Django's content type cache was cleared and the rows changed (a flush, a restore)."""
    home, away = twins()
    here = ContentType.objects.db_manager("default").get_for_model(Profile).pk
    enqueue_update(Profile, home.pk, active=True)  # the content types of both databases are cached now
    enqueue_update(Profile, away.pk, using=TENANT, active=True)
    ContentType.objects.using(TENANT).all().delete()
    ContentType.objects.using(TENANT).create(pk=here + 1000, app_label="testapp", model="profile")
    ContentType.objects.clear_cache()
    assert enqueue_update(Profile, away.pk, using=TENANT, newsletter=True).content_type_id == here + 1000
    assert enqueue_update(Profile, home.pk, newsletter=True).content_type_id == here
    done = Profile.objects.using(TENANT).update_if_newer(
        away.pk, version=next_version(TENANT), request_id=uuid.uuid4(), dark_mode=True
    )
    assert done.applied
    assert log(TENANT).filter(content_type_id=here + 1000).count() == 2


def test_save_and_delete_of_a_loaded_instance_stay_on_its_database():
    """Outside a tenant's context the router decides nothing: an instance loaded from the tenant's
    database is saved and deleted there (Django's instance hint), never on ``default``, where its twin
    with the same key lives."""
    home, away = twins()
    loaded = Profile.objects.using(TENANT).get(pk=away.pk)
    loaded.name = "moved on"
    loaded.save()
    assert Profile.objects.using(TENANT).get(pk=away.pk).name == "moved on"
    loaded.delete()
    assert not Profile.objects.using(TENANT).filter(pk=away.pk).exists()
    assert Profile.objects.using("default").get(pk=home.pk).name == "home"


def test_a_save_of_a_childs_own_fields_checks_and_writes_on_its_database():
    """A multi-table child saved with ``update_fields`` naming only its own table's fields: the check
    of the parent's row and both writes run on the instance's database, where a twin with the same key
    on ``default`` is left alone."""
    home = Restaurant.objects.using("default").create(name="home", seats=1)
    Restaurant.objects.using(TENANT).create(pk=home.pk, name="away", seats=1)
    loaded = Restaurant.objects.using(TENANT).get(pk=home.pk)
    loaded.seats = 5
    loaded.save(update_fields=["seats"])
    row = Restaurant.objects.using(TENANT).get(pk=home.pk)
    assert (row.seats, row.lock_version, row.field_versions["seats"]) == (5, loaded.lock_version, loaded.lock_version)
    assert Restaurant.objects.using("default").get(pk=home.pk).seats == 1


def test_a_proxys_request_goes_where_the_router_sends_its_concrete_models_writes(redis):
    """The job writes the concrete model's row: its request is recorded, and applied, on the database
    the router gives writes of that model, whatever the proxy it was enqueued through."""
    home, away = twins()
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ProfilesOnTheTenant"]):
        request = enqueue_update(ActiveOnlyProfile, away.pk, active=True)
        assert request._state.db == TENANT
        assert log(TENANT).filter(request_id=request.request_id).exists()
        assert not log("default").exists()
        run_jobs()
    assert Profile.objects.using(TENANT).get(pk=away.pk).active
    assert not Profile.objects.using("default").get(pk=home.pk).active


def test_a_delete_goes_where_the_router_sends_the_model():
    """An instance that was never loaded (no database of its own) is deleted where the router sends
    writes of its model."""
    home, away = twins()
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ProfilesOnTheTenant"]):
        Profile(pk=away.pk, lock_version=away.lock_version).delete()
    assert not Profile.objects.using(TENANT).filter(pk=away.pk).exists()
    assert Profile.objects.using("default").filter(pk=home.pk).exists()


def test_a_delete_the_tenants_database_refuses_marks_the_tenants_transaction_for_rollback(postgres_only):
    """A checked DELETE that fails in the caller's transaction on the tenant's database leaves that
    transaction to be rolled back (as Django's own delete does), not ``default``'s."""
    away = twins()[1]
    loaded = Profile.objects.using(TENANT).get(pk=away.pk)
    with connections[TENANT].cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION safeupdates_test_no_delete() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql; "
            f"CREATE TRIGGER safeupdates_test_no_delete BEFORE DELETE ON {Profile._meta.db_table} "
            "FOR EACH ROW EXECUTE FUNCTION safeupdates_test_no_delete();"
        )
    try:
        with transaction.atomic(using=TENANT), transaction.atomic(using="default"):
            with pytest.raises(DatabaseError, match="refused"):
                loaded.delete()
            assert connections[TENANT].needs_rollback
            assert not connections["default"].needs_rollback
    finally:
        with connections[TENANT].cursor() as cursor:
            cursor.execute(f"DROP TRIGGER safeupdates_test_no_delete ON {Profile._meta.db_table}")
            cursor.execute("DROP FUNCTION safeupdates_test_no_delete()")
    assert Profile.objects.using(TENANT).filter(pk=away.pk).exists()


def test_the_relay_scans_the_database_it_is_given(redis):
    home, away = twins()
    other = Profile.objects.using(TENANT).create(name="other")
    enqueue_update(Profile, home.pk, active=True)
    with tenant():
        for pk in (away.pk, other.pk):
            enqueue_update(Profile, pk, newsletter=True)
    assert relay(0, using=TENANT, dry_run=True).due == 2
    assert relay(0, using="default", dry_run=True).due == 1
    assert relay_pending(0, using=TENANT, dry_run=True) == 2  # the scheduled job's entry point


def test_the_relays_deliveries_apply_on_the_database_it_is_given(redis):
    _home, away = twins()
    with tenant():
        request = enqueue_update(Profile, away.pk, active=True)
    django_rq.get_queue("default").empty()  # the job was lost
    assert relay(0, using=TENANT).enqueued == 1
    run_jobs()
    assert log(TENANT).get(pk=request.pk).status == RequestStatus.APPLIED


def test_the_relay_finds_a_tenants_waiting_job_under_its_own_id(redis):
    """The relay's pipelines ask RQ for the tenant's job ids (with the database in them): a job that
    waits is found waiting, not delivered again."""
    _home, away = twins()
    with tenant():
        enqueue_update(Profile, away.pk, active=True)
    report = relay(0, using=TENANT)
    assert (report.enqueued, report.waiting) == (0, 1)
    assert django_rq.get_queue("default").count == 1


def test_verify_checks_the_database_it_is_given():
    home, away = twins()
    for alias, obj in (("default", home), (TENANT, away)):
        Profile.objects.using(alias).update_if_newer(
            obj.pk, version=next_version(alias), request_id=uuid.uuid4(), active=True
        )
    Profile.objects.using(TENANT).filter(pk=away.pk).update(active=False)  # behind the app's back

    out = StringIO()
    call_command("safeupdates_verify", "testapp.Profile", stdout=out)  # default: no drift there
    assert out.getvalue().splitlines()[-1] == "no drift"
    out = StringIO()
    with pytest.raises(SystemExit):
        call_command("safeupdates_verify", "testapp.Profile", "--database", TENANT, stdout=out, stderr=StringIO())
    assert out.getvalue().splitlines()[0] == f"testapp.Profile pk={away.pk} active: stored False, request log says True"


def test_purge_purges_the_database_it_is_given():
    home, away = twins()
    for alias, obj in (("default", home), (TENANT, away)):
        Profile.objects.using(alias).update_if_newer(
            obj.pk, version=next_version(alias), request_id=uuid.uuid4(), active=True
        )
        log(alias).update(created_at=Now() - timedelta(days=3))
    out = StringIO()
    call_command("safeupdates_purge", "--older-than", "1", "--database", TENANT, stdout=out)
    assert out.getvalue().startswith("deleted 1 request(s)")
    assert not log(TENANT).exists()
    assert log("default").count() == 1


def ahead_of_the_tenant() -> None:
    """Make the default database's versions run ahead of the tenant's, so that a version tells its source."""
    while last_issued("default") <= last_issued(TENANT) + 5:
        next_version("default")


def test_enqueue_update_using_takes_versions_and_request_ids_from_that_database(redis):
    home, away = twins()
    ahead_of_the_tenant()
    request_id = uuid.uuid4()
    there = enqueue_update(Profile, away.pk, using=TENANT, request_id=request_id, active=True)
    here = enqueue_update(Profile, home.pk, using="default", request_id=request_id, newsletter=True)
    assert there.version is not None and there.version <= last_issued(TENANT) < last_issued("default")
    # The same request id is a new request in each database: one row in each log, one job each.
    assert log(TENANT).get(request_id=request_id).changes == {"active": True}
    assert log("default").get(request_id=request_id).changes == {"newsletter": True}
    assert here.version != there.version or here.pk != there.pk
    assert django_rq.get_queue("default").count == 2
    # Known in its own database only: a second call there is the same request.
    assert enqueue_update(Profile, away.pk, using=TENANT, request_id=request_id, active=True).pk == there.pk


def test_a_tenants_job_carries_its_database_and_names_it_in_its_id(redis):
    home, away = twins()
    enqueue_update(Profile, home.pk, active=True)
    enqueue_update(Profile, away.pk, using=TENANT, active=True)
    jobs = {job.id: job for job in django_rq.get_queue("default").jobs}
    here = ContentType.objects.db_manager("default").get_for_model(Profile).pk
    there = ContentType.objects.db_manager(TENANT).get_for_model(Profile).pk
    assert jobs[job_id(here, str(home.pk))].kwargs == {}  # the default database: the job as it always was
    assert jobs[job_id(there, str(away.pk), TENANT)].kwargs == {"using": TENANT}
    assert job_id(there, str(away.pk), TENANT) != job_id(there, str(away.pk))


def test_apply_update_using_applies_on_that_database_only(redis):
    home, away = twins()
    request = enqueue_update(Profile, away.pk, using=TENANT, active=True)
    # The same request id, pending in the default database: never touched by the tenant's job.
    twin = enqueue_update(Profile, home.pk, using="default", request_id=request.request_id, newsletter=True)
    assert apply_update(str(request.request_id), using=TENANT) == "1 applied"
    assert log(TENANT).get(request_id=request.request_id).status == RequestStatus.APPLIED
    assert log("default").get(request_id=twin.request_id).status == RequestStatus.PENDING
    assert Profile.objects.using(TENANT).get(pk=away.pk).active
    assert not Profile.objects.using("default").get(pk=home.pk).newsletter
    # A version written on the tenant's row comes from the tenant's source.
    assert Profile.objects.using(TENANT).get(pk=away.pk).lock_version <= last_issued(TENANT)


@pytest.fixture
def tenant_refuses(postgres_only) -> Iterator[Any]:
    """A trigger on the tenant's Profile table that refuses ``name = 'forbidden'`` with a given SQLSTATE."""
    created = []

    def create(sqlstate: str) -> None:
        _create_profile_trigger(
            "safeupdates_test_refuse",
            f"IF NEW.name = 'forbidden' THEN RAISE EXCEPTION 'refused' USING ERRCODE = '{sqlstate}'; END IF;",
            using=TENANT,
        )
        created.append(sqlstate)

    yield create
    if created:
        _drop_profile_trigger("safeupdates_test_refuse", using=TENANT)


def test_a_failed_attempt_is_recorded_on_the_database_of_the_request(redis, tenant_refuses):
    """A transient error on the tenant's database: the tenant's request counts the attempt and, outside a
    worker (no retry follows), fails; the default database's twin request stays untouched."""
    tenant_refuses("40001")
    home, away = twins()
    request = enqueue_update(Profile, away.pk, using=TENANT, name="forbidden")
    twin = enqueue_update(Profile, home.pk, using="default", request_id=request.request_id, name="forbidden")
    with pytest.raises(DatabaseError, match="refused"):
        apply_update(str(request.request_id), using=TENANT)
    assert log(TENANT).values_list("status", "attempts").get(pk=request.pk) == ("failed", 1)
    assert log("default").values_list("status", "attempts").get(pk=twin.pk) == ("pending", 0)


def test_a_failed_requests_signal_names_its_record_and_its_database(redis, tenant_refuses):
    """The failed request's model is found by its content type on its own database, which numbers its
    content types otherwise than ``default``."""
    tenant_refuses("40001")
    _home, away = twins()
    here = ContentType.objects.db_manager("default").get_for_model(Profile).pk
    ContentType.objects.using(TENANT).all().delete()
    ContentType.objects.using(TENANT).create(pk=here + 1000, app_label="testapp", model="profile")
    ContentType.objects.clear_cache()
    request = enqueue_update(Profile, away.pk, using=TENANT, name="forbidden")
    got: list[tuple[Any, ...]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        got.append((sender, kwargs["pk"], kwargs["using"], kwargs["request_id"]))

    signals.request_failed.connect(receiver, weak=False, dispatch_uid="tests.routing.failed")
    try:
        with pytest.raises(DatabaseError, match="refused"):
            apply_update(str(request.request_id), using=TENANT)
    finally:
        signals.request_failed.disconnect(dispatch_uid="tests.routing.failed")
    assert got == [(Profile, away.pk, TENANT, request.request_id)]


def test_a_value_the_tenants_database_refuses_is_rejected_alone(redis, tenant_refuses):
    """The requests of a refused batch are written one by one, each in a savepoint on the tenant's database."""
    tenant_refuses("P0001")
    _home, away = twins()
    first = enqueue_update(Profile, away.pk, using=TENANT, active=True)
    culprit = enqueue_update(Profile, away.pk, using=TENANT, name="forbidden")
    last = enqueue_update(Profile, away.pk, using=TENANT, newsletter=True)
    assert apply_update(str(first.request_id), using=TENANT) == "2 applied, 1 rejected"
    statuses = dict(log(TENANT).values_list("pk", "status"))
    assert [statuses[r.pk] for r in (first, culprit, last)] == ["applied", "rejected", "applied"]
    away.refresh_from_db()
    assert (away.active, away.newsletter, away.name) == (True, True, "away")


def test_a_value_the_tenants_database_refuses_in_a_swept_page_rejects_only_its_request(redis, tenant_refuses):
    """The page's savepoint is taken on the tenant's database: a refused value there sinks neither the page
    nor the job's transaction."""
    tenant_refuses("P0001")
    _home, away = twins()
    b, c = (Profile.objects.using(TENANT).create(name=name) for name in ("b", "c"))
    enqueue_update(away, using=TENANT, active=True)  # the first job in the queue
    on_b = enqueue_update(b, using=TENANT, active=True)
    culprit = enqueue_update(b, using=TENANT, name="forbidden")
    on_c = enqueue_update(c, using=TENANT, active=True)
    queue = django_rq.get_queue("default")
    SimpleWorker([queue], connection=queue.connection).work(burst=True, max_jobs=1)
    assert [log(TENANT).get(pk=r.pk).status for r in (on_b, culprit, on_c)] == ["applied", "rejected", "applied"]
    assert queue.count == 0


class ProfileRouter:
    """Profile on the tenant's database, routed by its model; every other model where Django puts it."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return TENANT if model is Profile else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return TENANT if model is Profile else None


def test_bulk_update_if_newer_writes_where_the_router_sends_its_model(redis):
    """Without using(): the router's database for writes of the model, whose version source checks them."""
    home, away = twins()
    # The tenant's versions ahead of the default database's: its version was never issued there.
    Profile.objects.using(TENANT).filter(pk=away.pk).update(lock_version=last_issued("default") + 10)
    raise_floor(TENANT)
    version = next_version(TENANT)
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ProfileRouter"]):
        result = Profile.objects.bulk_update_if_newer([(away.pk, version, {"active": True})])
    assert (result.applied, result.stale, result.missing) == (1, 0, 0)
    assert Profile.objects.using(TENANT).get(pk=away.pk).active
    assert not Profile.objects.using("default").get(pk=home.pk).active


def test_the_relay_command_delivers_on_the_database_it_is_given(redis):
    _home, away = twins()
    request = enqueue_update(Profile, away.pk, using=TENANT, active=True)
    django_rq.get_queue("default").empty()  # the job was lost
    out = StringIO()
    call_command("safeupdates_relay", "--older-than", "0", "--dry-run", stdout=out)
    assert out.getvalue().strip().endswith("would deliver 0 job(s) for work pending > 0s")  # default: nothing
    out = StringIO()
    call_command("safeupdates_relay", "--older-than", "0", "--database", TENANT, stdout=out)
    assert "1 due (pending > 0s): enqueued 1 job(s)" in out.getvalue()
    run_jobs()
    assert log(TENANT).get(pk=request.pk).status == RequestStatus.APPLIED
    assert Profile.objects.using(TENANT).get(pk=away.pk).active


def test_retry_failed_revives_the_failed_requests_of_the_database_given(redis):
    """--retry-failed --database: the failed request of that database is pending again and delivered;
    a failed request of the same key on ``default`` stays failed."""
    home, away = twins()
    there = enqueue_update(Profile, away.pk, using=TENANT, active=True)
    here = enqueue_update(Profile, home.pk, using="default", active=True)
    django_rq.get_queue("default").empty()
    log(TENANT).filter(pk=there.pk).update(status=RequestStatus.FAILED)
    log("default").filter(pk=here.pk).update(status=RequestStatus.FAILED)
    report = relay(0, using=TENANT, retry_failed=True)
    assert (report.revived, report.enqueued) == (1, 1)
    assert log(TENANT).get(pk=there.pk).status == RequestStatus.PENDING
    assert log("default").get(pk=here.pk).status == RequestStatus.FAILED


def test_the_relay_command_refuses_an_unknown_database():
    with pytest.raises(CommandError, match="--database 'nowhere' is not in DATABASES"):
        call_command("safeupdates_relay", "--database", "nowhere", stdout=StringIO())


def test_the_counter_fallback_counts_on_the_database_given():
    VersionCounter.objects.using("default").update_or_create(pk=1, defaults={"value": 10**6})
    VersionCounter.objects.using(TENANT).update_or_create(pk=1, defaults={"value": 5})
    assert _next_from_counter(TENANT) == 6
    assert _next_from_counter(TENANT) == 7
    assert VersionCounter.objects.using("default").get(pk=1).value == 10**6


def test_idempotent_using_records_its_task_on_that_database():
    @idempotent(key="tenant-task:{name}", using=TENANT)
    def task(name: str) -> str:
        return f"ran {name}"

    assert task("x") == "ran x"
    assert task("x") is SKIPPED
    assert log(TENANT).get(key="tenant-task:x").status == RequestStatus.APPLIED
    assert not log("default").filter(key="tenant-task:x").exists()


def test_idempotent_using_rolls_back_a_failed_body_on_that_database():
    """The body runs in a savepoint on the database given: its writes there are undone when it raises,
    though the task's ``failed`` row commits beside them."""

    @idempotent(key="tenant-fail:{name}", using=TENANT)
    def task(name: str) -> str:
        Document.objects.using(TENANT).create(title=name)
        raise ValueError("gateway down")

    with pytest.raises(ValueError, match="gateway down"):
        task("x")
    assert not Document.objects.using(TENANT).filter(title="x").exists()
    record = log(TENANT).get(key="tenant-fail:x")
    assert (record.status, record.error) == (RequestStatus.FAILED, "ValueError: gateway down")


class RequestLogRouter:
    """The request log alone on the tenant's database: a router that looks at the model."""

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return TENANT if model is ProcessedRequest else None

    db_for_read = db_for_write


def test_idempotent_records_its_task_where_the_router_writes_the_request_log():
    @idempotent(key="routed:{name}")
    def routed(name: str) -> str:
        return f"ran {name}"

    with override_settings(DATABASE_ROUTERS=[f"{__name__}.RequestLogRouter"]):
        assert routed("x") == "ran x"
        assert routed("x") is SKIPPED
    assert log(TENANT).get(key="routed:x").status == RequestStatus.APPLIED
    assert not log("default").filter(key="routed:x").exists()


def test_a_foreign_key_is_checked_on_the_database_given():
    document = Document.objects.using(TENANT).create(title="away only")
    assert not Document.objects.using("default").filter(pk=document.pk).exists()
    assert clean_changes(Specimen, {"document": document.pk}, using=TENANT) == {"document": document.pk}
    with pytest.raises(InvalidUpdate, match="is not a valid choice"):
        clean_changes(Specimen, {"document": document.pk}, using="default")
    specimen = Specimen.objects.using(TENANT).create()
    queryset: SafeUpdateQuerySet[Specimen] = SafeUpdateQuerySet(model=Specimen, using=TENANT)
    assert queryset.update_if_newer(specimen.pk, version=next_version(TENANT), document=document.pk).applied
    assert Specimen.objects.using(TENANT).get(pk=specimen.pk).document_id == document.pk
    other = Document.objects.using(TENANT).create(title="away too")
    result = queryset.bulk_update_if_newer([(specimen.pk, next_version(TENANT), {"document": other.pk})])
    assert result.applied == 1


def test_a_tenants_batch_runs_its_items_and_reduce_on_its_database(redis):
    batch = fan_out(add_score, [{"pk": 0, "points": 1}] * 2, then=record_reduce, using=TENANT)
    assert not Batch.objects.using("default").exists()
    run_jobs()  # outside the tenant's context: the jobs carry the database
    batch = Batch.objects.using(TENANT).get(batch_id=batch.batch_id)
    assert (batch.succeeded, batch.failed, batch.reduced_at is not None) == (2, 0, True)
    assert set(log(TENANT).values_list("status", flat=True)) == {RequestStatus.APPLIED}


def test_the_relay_delivers_a_tenants_batch_on_its_database(redis):
    batch = fan_out(add_score, [{"pk": 0, "points": 1}] * 2, then=record_reduce, using=TENANT)
    django_rq.get_queue("default").empty()  # the item jobs were lost
    assert relay(0, using=TENANT).enqueued == 2
    run_jobs()
    batch = Batch.objects.using(TENANT).get(batch_id=batch.batch_id)
    assert batch.succeeded == 2
    assert batch.reduced_at is not None


def test_the_floor_of_a_database_is_read_from_that_databases_tables(redis):
    """``raise_floor(alias)`` moves that database's source above the versions stored in that database's
    rows, not the default database's (``_stored_floor`` 25 read the default's)."""
    _home, away = twins()
    above = max(last_issued(TENANT), last_issued("default")) + 1000
    Profile.objects.using(TENANT).filter(pk=away.pk).update(lock_version=above)
    raise_floor(TENANT)
    assert next_version(TENANT) > above
