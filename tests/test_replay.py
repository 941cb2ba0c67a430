"""The request log as an event log: replay, verify (drift), purge; and the async entry points."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from io import StringIO

import pytest
from asgiref.sync import sync_to_async
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import override_settings

from safeupdates import aenqueue_update, enqueue_update, replay
from safeupdates.jobs import apply_update
from safeupdates.models import ProcessedRequest, RequestStatus
from safeupdates.versions import next_version
from tests.factories import DocumentFactory, ProfileFactory
from tests.testapp.models import Gadget, Profile

pytestmark = pytest.mark.django_db(transaction=True)


def apply_all() -> None:
    for request_id in ProcessedRequest.objects.filter(status="pending").values_list("request_id", flat=True):
        apply_update(str(request_id))


def test_replay_derives_fields_from_the_newest_applied_requests(redis):
    profile = ProfileFactory(name="start")
    enqueue_update(profile, active=True)
    apply_all()
    enqueue_update(profile, active=False, name="second")
    enqueue_update(profile, newsletter=True)
    apply_all()
    profile.refresh_from_db()
    assert replay(profile) == {"active": False, "name": "second", "newsletter": True}


def test_fields_last_written_by_save_are_not_replayed(redis):
    profile = ProfileFactory()
    enqueue_update(profile, active=True, score=3)
    apply_all()
    profile.refresh_from_db()
    profile.score = 10
    profile.save(update_fields=["score"])
    assert replay(profile) == {"active": True}
    profile.name = "edited"
    profile.save()
    assert replay(profile) == {}


def test_replay_needs_a_versioned_model():
    with pytest.raises(TypeError, match="LockVersionMixin"):
        replay(ProcessedRequest())  # type: ignore[arg-type]


def test_verify_finds_a_write_that_bypassed_the_app(redis):
    clean, drifted = ProfileFactory(), ProfileFactory()
    for profile in (clean, drifted):
        enqueue_update(profile, active=True)
    apply_all()
    out = StringIO()
    call_command("safeupdates_verify", "testapp.Profile", stdout=out)
    assert "testapp.Profile: 0 field(s) drifted" in out.getvalue()
    assert "no drift" in out.getvalue()

    Profile.objects.filter(pk=drifted.pk).update(active=False)  # bypasses the version bookkeeping
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("safeupdates_verify", stdout=out, stderr=err)
    assert exit_info.value.code == 1
    assert f"testapp.Profile pk={drifted.pk} active: stored False, request log says True" in out.getvalue()
    assert f"pk={clean.pk}" not in out.getvalue()
    assert "ActiveOnlyProfile" not in out.getvalue()  # a proxy's rows are its concrete model's
    assert "drift found in 1 field(s)" in err.getvalue()


def test_verify_bad_arguments():
    with pytest.raises(CommandError, match=r"app_label\.Model"):
        call_command("safeupdates_verify", "nope.Nope")
    with pytest.raises(CommandError, match="not a LockVersionMixin model"):
        call_command("safeupdates_verify", "auth.User")


def test_purge_keeps_pending_and_versions_stay_monotonic(redis):
    profile = ProfileFactory()
    done = enqueue_update(profile, active=True)
    apply_all()
    waiting = enqueue_update(profile, active=False)
    newest = waiting.version
    out = StringIO()
    call_command("safeupdates_purge", "--older-than", "0", "--dry-run", stdout=out)
    assert "would delete 1 request(s)" in out.getvalue()
    call_command("safeupdates_purge", "--older-than", "1", stdout=out)
    assert "deleted 0 request(s)" in out.getvalue()  # not a day old yet
    call_command("safeupdates_purge", "--older-than", "0", "--batch-size", "1", stdout=out)
    assert "deleted 1 request(s)" in out.getvalue()
    assert list(ProcessedRequest.objects.values_list("pk", "status")) == [(waiting.pk, RequestStatus.PENDING)]
    assert not ProcessedRequest.objects.filter(pk=done.pk).exists()
    assert next_version() > newest
    apply_all()
    profile.refresh_from_db()
    assert profile.active is False
    with pytest.raises(CommandError):
        call_command("safeupdates_purge", "--older-than", "-1")
    with pytest.raises(CommandError):
        call_command("safeupdates_purge", "--batch-size", "0")


@pytest.mark.parametrize("by", ["instance", "model and key"])
def test_aenqueue_update(redis, by):
    profile, other = ProfileFactory(), ProfileFactory()
    target = (profile,) if by == "instance" else (Profile, profile.pk)

    async def view() -> ProcessedRequest:
        try:
            return await aenqueue_update(*target, newsletter=True)
        finally:
            await sync_to_async(connections.close_all)()

    request = asyncio.run(view())
    assert ProcessedRequest.objects.get(pk=request.pk).status == "pending"
    assert request.object_id == str(profile.pk)
    apply_all()
    profile.refresh_from_db()
    other.refresh_from_db()
    assert (profile.newsletter, other.newsletter) == (True, False)


def test_document_without_requests_has_nothing_to_replay():
    document = DocumentFactory()
    assert replay(document) == {}


# ---------------------------------------------------------------------------------------------------------
# Verify compares values as the database stores them: what it made of a request is not drift.


def write_seen_at(gadget: Gadget, value: datetime.datetime, path: str) -> None:
    if path == "enqueue_update":
        apply_update(str(enqueue_update(gadget, seen_at=value).request_id))
    else:
        Gadget.objects.update_if_newer(gadget.pk, version=next_version(), request_id=uuid.uuid4(), seen_at=value)
    assert ProcessedRequest.objects.filter(status="applied").count() == 1


def verify_output() -> str:
    out = StringIO()
    call_command("safeupdates_verify", "testapp.Gadget", stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("path", ["enqueue_update", "update_if_newer"])
def test_verify_after_a_naive_datetime_the_database_moved(redis, path):
    """USE_TZ=False: PostgreSQL reads a naive datetime in the session's time zone, so a local time in the
    spring-forward gap (02:30 on 8 March 2026 in New York) is stored as 03:30. Not drift."""
    with override_settings(USE_TZ=False, TIME_ZONE="America/New_York"):
        gadget = Gadget.objects.create()
        write_seen_at(gadget, datetime.datetime(2026, 3, 8, 2, 30), path)
        assert "no drift" in verify_output()
        # A write that bypassed safeupdates is still found.
        Gadget.objects.filter(pk=gadget.pk).update(seen_at=datetime.datetime(2026, 3, 8, 5, 0))
        with pytest.raises(SystemExit):
            verify_output()


def log_as_requested_before(gadget: Gadget, requested: str) -> None:
    """Make the gadget's applied request say ``requested``, as releases before validation refused naive
    datetimes under USE_TZ (and aware ones without it) logged it: such rows stay in the log."""
    assert ProcessedRequest.objects.filter(object_id=str(gadget.pk)).update(changes={"seen_at": requested}) == 1


def test_verify_after_a_naive_datetime_logged_under_use_tz(redis):
    """USE_TZ=True: Django stored a naive datetime as aware (in TIME_ZONE) and the log kept it naive."""
    gadget = Gadget.objects.create()
    write_seen_at(gadget, datetime.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=datetime.UTC), "update_if_newer")
    log_as_requested_before(gadget, "2026-01-02T03:04:05.123456")
    with pytest.warns(RuntimeWarning, match="naive datetime"):
        assert "no drift" in verify_output()


def test_verify_after_an_aware_datetime_logged_without_use_tz(redis, postgres_only):
    """USE_TZ=False: PostgreSQL stored an aware datetime in the session's time zone (SQLite refused it)."""
    with override_settings(USE_TZ=False):
        gadget = Gadget.objects.create()
        write_seen_at(gadget, datetime.datetime(2026, 1, 2, 1, 4, 5, 123456), "update_if_newer")
        log_as_requested_before(gadget, "2026-01-02T03:04:05.123456+02:00")
        assert "no drift" in verify_output()


# ---------------------------------------------------------------------------------------------------------
# Purge arguments


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "nan"], "--older-than must be a number of days from 0 to 365000, not nan."),
        (["--older-than", "inf"], "--older-than must be a number of days from 0 to 365000, not inf."),
        (["--older-than", "1e400"], "--older-than must be a number of days from 0 to 365000, not inf."),
        (["--older-than=-inf"], "--older-than must be a number of days from 0 to 365000, not -inf."),
        (["--older-than", "-1"], "--older-than must be a number of days from 0 to 365000, not -1."),
        (["--older-than", "1e9"], "--older-than must be a number of days from 0 to 365000, not 1e+09."),
        (["--older-than", "0", "--batch-size", "0"], "--batch-size must be at least 1, not 0."),
        (["--older-than", "0", "--batch-size", "-3"], "--batch-size must be at least 1, not -3."),
    ],
)
def test_purge_refuses_impossible_arguments(redis, args, message):
    enqueue_update(ProfileFactory(), active=True)
    apply_all()
    with pytest.raises(CommandError) as excinfo:
        call_command("safeupdates_purge", *args)
    assert str(excinfo.value) == message
    assert ProcessedRequest.objects.count() == 1


@pytest.mark.parametrize("retention", [float("nan"), -2, "soon"])
def test_purge_refuses_an_impossible_retention_setting(retention):
    with override_settings(SAFEUPDATES_RETENTION=retention), pytest.raises(CommandError, match="SAFEUPDATES_RETENTION"):
        call_command("safeupdates_purge")
