"""Issue 22: reads go to a streaming replica, writes to the primary, and every read that decides a write
goes to the primary. The replica is real (``pg_basebackup`` of a primary of the test's own) and its
replay is paused, so that it lags: a decision read there would see the past, and each test first checks
that the replica does not show what the primary holds, so that a wrong route would fail it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import django_rq
import environ
import pytest
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connections
from django.db.models.functions import Now
from django.test import override_settings

from safeupdates import enqueue_update, versions
from safeupdates.exceptions import InvalidUpdate
from safeupdates.jobs import apply_update, relay
from safeupdates.managers import SafeUpdateQuerySet
from safeupdates.models import ProcessedRequest, RequestStatus
from safeupdates.versions import last_issued, next_version
from tests.servers import OwnPostgres, OwnPostgresReplica
from tests.testapp.models import Document, Profile, Restaurant, Specimen
from tests.workers import ROOT, subprocess_env

pytestmark = [pytest.mark.faults]


class PrimaryReplicaRouter:
    """Django's primary/replica router: every read to the replica, every write to the primary."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "replica"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True


def _missing() -> str | None:
    initdb = Path(OwnPostgres().initdb)
    if not initdb.exists():
        return f"PostgreSQL's initdb not found (looked for {initdb})"
    if not initdb.resolve().with_name("pg_basebackup").exists():
        return f"pg_basebackup not found beside {initdb.resolve()}"
    return None


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[OwnPostgres, OwnPostgresReplica]]:
    """A primary of the test's own, migrated, and its streaming replica."""
    if connections["default"].vendor != "postgresql":
        pytest.skip("the replica scenarios run in the PostgreSQL pass (DATABASE_URL is not PostgreSQL)")
    missing = _missing()
    if missing:
        pytest.skip(missing)
    primary = OwnPostgres()
    replica = OwnPostgresReplica(primary)
    try:
        primary.init()
        migrate = [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"]
        subprocess.run(migrate, env=subprocess_env(DATABASE_URL=primary.url), cwd=ROOT, check=True, timeout=180)
        replica.init()
        yield primary, replica
    finally:
        replica.destroy()
        primary.destroy()


@pytest.fixture
def lagging(cluster: tuple[OwnPostgres, OwnPostgresReplica], django_db_blocker: Any, redis: Any) -> Iterator[Any]:
    """This process on the cluster: ``default`` is the primary, ``replica`` the replica, and the router
    sends reads there. Yields the replica; a test pauses its replay when the primary should move on."""
    primary, replica = cluster
    default = connections["default"]
    saved = default.settings_dict
    default.close()
    default.settings_dict = {**saved, **environ.Env.db_url_config(primary.url), "CONN_MAX_AGE": 0}
    connections.settings["replica"] = {**default.settings_dict, **environ.Env.db_url_config(replica.url)}
    ContentType.objects.clear_cache()  # the ids of another database
    versions._issued.clear()  # what this process saw of another database's sequence
    try:
        with django_db_blocker.unblock(), override_settings(DATABASE_ROUTERS=[f"{__name__}.PrimaryReplicaRouter"]):
            yield replica
    finally:
        replica.resume_replay()
        with contextlib.suppress(AttributeError):
            connections["replica"].close()
            del connections["replica"]
        del connections.settings["replica"]
        default.close()
        default.settings_dict = saved
        ContentType.objects.clear_cache()
        versions._issued.clear()


def on_replica(model: Any) -> Any:
    return model._default_manager.using("replica")


def test_the_apply_job_reads_the_pending_requests_on_the_primary(lagging):
    profile = Profile.objects.create(name="apply")
    lagging.pause_replay()
    request = enqueue_update(profile, active=True)
    assert not on_replica(ProcessedRequest).filter(pk=request.pk).exists()
    assert apply_update(str(request.request_id)) == "1 applied"
    assert Profile.objects.using("default").get(pk=profile.pk).active


def test_field_versions_are_read_on_the_primary(lagging):
    """A child of multi-table inheritance: its versions are read (and locked) before its tables are written."""
    restaurant = Restaurant.objects.create(name="versions")
    older, newer = next_version(), next_version()
    lagging.pause_replay()
    assert Restaurant.objects.update_if_newer(restaurant.pk, version=newer, seats=5).applied
    assert on_replica(Restaurant).get(pk=restaurant.pk).seats == 0
    result = Restaurant.objects.update_if_newer(restaurant.pk, version=older, seats=9)
    assert result.outcome == "stale"
    assert Restaurant.objects.using("default").get(pk=restaurant.pk).seats == 5


def test_the_relay_scans_the_primary(lagging):
    profiles = [Profile.objects.create(name=f"relay {n}") for n in range(2)]
    lagging.pause_replay()
    requests = [enqueue_update(profile, newsletter=True) for profile in profiles]
    assert not on_replica(ProcessedRequest).filter(pk__in=[r.pk for r in requests]).exists()
    django_rq.get_queue("default").empty()  # their jobs were lost
    report = relay(0)
    assert (report.due, report.enqueued) == (2, 2)


def test_ensure_issued_reads_the_primarys_sequence(lagging):
    profile = Profile.objects.create(name="issued")
    lagging.pause_replay()
    # Past what the replica knows: a standby sees a sequence as its primary WAL-logs it, 32 values ahead.
    version = max(next_version() for _ in range(40))
    versions._issued.clear()  # so that the version source is asked
    assert last_issued("replica") < version
    assert Profile.objects.update_if_newer(profile.pk, version=version, active=True).applied


def test_enqueue_updates_checks_read_the_primary(lagging):
    first, second = (Profile.objects.create(name=f"check {n}") for n in range(2))
    lagging.pause_replay()
    request_id = uuid.uuid4()
    recorded = enqueue_update(first, request_id=request_id, active=True)
    assert not on_replica(ProcessedRequest).filter(request_id=request_id).exists()
    assert enqueue_update(first, request_id=request_id, active=True).pk == recorded.pk
    with pytest.raises(InvalidUpdate, match=f"request_id {request_id} was already used for another object"):
        enqueue_update(second, request_id=request_id, active=True)


def test_a_foreign_key_is_checked_on_the_primary(lagging):
    specimen = Specimen.objects.create()
    lagging.pause_replay()
    document = Document.objects.create(title="new")
    assert not on_replica(Document).filter(pk=document.pk).exists()
    queryset: SafeUpdateQuerySet[Specimen] = SafeUpdateQuerySet(model=Specimen)
    assert queryset.update_if_newer(specimen.pk, version=next_version(), document=document.pk).applied


def test_verify_reads_the_primary(lagging):
    profile = Profile.objects.create(name="verify")
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=True)
    lagging.pause_replay()
    Profile.objects.filter(pk=profile.pk).update(active=False)  # behind the app's back, on the primary
    assert on_replica(Profile).get(pk=profile.pk).active
    out = StringIO()
    with pytest.raises(SystemExit):
        call_command("safeupdates_verify", "testapp.Profile", stdout=out, stderr=StringIO())
    assert f"testapp.Profile pk={profile.pk} active: stored False, request log says True" in out.getvalue()


def test_purge_reads_the_primary(lagging):
    profile = Profile.objects.create(name="purge")
    requests = [enqueue_update(profile, active=value) for value in (True, False)]
    ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests]).update(created_at=Now() - timedelta(days=3))
    lagging.pause_replay()
    apply_update(str(requests[0].request_id))  # terminal on the primary, pending on the replica
    assert set(
        on_replica(ProcessedRequest).filter(pk__in=[r.pk for r in requests]).values_list("status", flat=True)
    ) == {RequestStatus.PENDING}
    out = StringIO()
    call_command("safeupdates_purge", "--older-than", "1", stdout=out)
    assert out.getvalue().startswith("deleted 2 request(s)")
    assert not ProcessedRequest.objects.using("default").filter(pk__in=[r.pk for r in requests]).exists()
