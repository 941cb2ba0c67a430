"""``safeupdates_verify`` at size: one query of requests per batch of records (not one per record), the
same result as replaying each record, a progress line, and a pass that resumes after a primary key."""

from __future__ import annotations

import uuid
from io import StringIO
from typing import Any

import pytest
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeupdates import replay
from safeupdates.audit import Drift, find_drift
from safeupdates.management.commands import safeupdates_verify
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.testapp.models import Profile, Restaurant, Tag

FIELDS = ("name", "active", "newsletter", "score")
VALUES: dict[str, Any] = {
    "name": st.sampled_from(["a", "b", "c"]),
    "active": st.booleans(),
    "newsletter": st.booleans(),
    "score": st.integers(0, 3),
}


def applied(obj: Any, version: int | None = None, **changes: Any) -> None:
    """Apply ``changes`` to ``obj``'s row as a recorded request (``update_if_newer(request_id=)``)."""
    manager = type(obj).objects
    manager.update_if_newer(obj.pk, version=version or next_version(), request_id=uuid.uuid4(), **changes)


def verify(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("safeupdates_verify", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def reference_replay(obj: Profile) -> dict[str, Any]:
    """What replay() derived before it read records in batches: the record's applied requests, newest
    first, one field at a time (the oracle of the property below)."""
    requests = ProcessedRequest.objects.filter(
        kind=RequestKind.UPDATE,
        content_type=ContentType.objects.get_for_model(obj),
        object_id=str(obj.pk),
        status=RequestStatus.APPLIED,
    ).order_by("-version")
    left = {name for name in obj.field_versions if name != "*"}
    derived: dict[str, Any] = {}
    for request in requests:
        for name, value in request.changes.items():
            if name in derived or name not in left:
                continue
            if obj.field_version(name) == request.version:
                derived[name] = Profile._meta.get_field(name).to_python(value)
            left.discard(name)
    return derived


@pytest.mark.django_db
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), count=st.integers(1, 4), steps=st.integers(1, 14))
def test_verify_equals_replaying_each_record(data, count, steps):
    """Whatever mix of requests in any version order (some stale), saves and writes behind the app's
    back: replay() and find_drift() read in batches say what replaying each record one by one says."""
    Profile.objects.all().delete()
    profiles = [ProfileFactory() for _ in range(count)]
    held: list[int] = []  # versions handed out and kept back, each for one late request
    for _ in range(steps):
        held.append(next_version())
        profile = data.draw(st.sampled_from(profiles))
        action = data.draw(st.sampled_from(["request", "request", "late request", "save", "bypass"]))
        names = data.draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=2, unique=True))
        changes = {name: data.draw(VALUES[name]) for name in names}
        if action == "request":
            applied(profile, **changes)
        elif action == "late request":  # allocated long ago: stale on fields written since
            applied(profile, version=held.pop(data.draw(st.integers(0, len(held) - 1))), **changes)
        elif action == "save":
            profile.refresh_from_db()
            for name, value in changes.items():
                setattr(profile, name, value)
            profile.save(update_fields=names if data.draw(st.booleans()) else None)
        else:
            Profile.objects.filter(pk=profile.pk).update(**changes)
    rows = list(Profile.objects.order_by("pk"))
    for row in rows:
        assert replay(row) == reference_replay(row)
    expected = [
        Drift("testapp.Profile", row.pk, name, getattr(row, name), value)
        for row in rows
        for name, value in reference_replay(row).items()
        if getattr(row, name) != value
    ]
    found = list(find_drift(Profile, batch_size=data.draw(st.integers(1, 3))))
    assert sorted(found, key=lambda d: (d.pk, d.field)) == sorted(expected, key=lambda d: (d.pk, d.field))


@pytest.mark.django_db
def test_verify_reads_the_requests_of_a_batch_of_records_in_one_query():
    profiles = [ProfileFactory() for _ in range(25)]
    for profile in profiles:
        applied(profile, active=True)
        applied(profile, newsletter=True, score=2)
    log = ProcessedRequest._meta.db_table
    ContentType.objects.get_for_model(Profile)  # cached, as after the first batch
    with CaptureQueriesContext(connection) as queries:
        assert list(find_drift(Profile, batch_size=10)) == []
    reads = [q["sql"] for q in queries.captured_queries if log in q["sql"]]
    assert len(reads) == 3  # 10 + 10 + 5 records: one query of their requests each
    assert len(queries.captured_queries) == 3 + 4  # and one of the records per batch, the last one empty


@pytest.mark.django_db
def test_verify_resumes_after_a_primary_key_and_prints_its_progress(monkeypatch):
    profiles = [ProfileFactory() for _ in range(6)]
    for profile in profiles:
        applied(profile, active=True)
    for drifted in (profiles[1], profiles[4]):
        Profile.objects.filter(pk=drifted.pk).update(active=False)
    monkeypatch.setattr(safeupdates_verify, "PROGRESS_EVERY", 0)

    status, out, err = verify("testapp.Profile", "--batch-size", "2", "--after-pk", str(profiles[2].pk))
    assert status == 1
    assert out.splitlines()[0] == f"testapp.Profile pk={profiles[4].pk} active: stored False, request log says True"
    assert out.splitlines()[1].startswith("testapp.Profile: 1 field(s) drifted (3 record(s) in ")
    assert err.splitlines()[:2] == [
        f"safeupdates verify: testapp.Profile: 2 of 3 record(s) checked (67%), last pk {profiles[4].pk} "
        f"(--after-pk {profiles[4].pk} resumes)",
        f"safeupdates verify: testapp.Profile: 3 of 3 record(s) checked (100%), last pk {profiles[5].pk} "
        f"(--after-pk {profiles[5].pk} resumes)",
    ]
    status, out, _err = verify("testapp.Profile", "--after-pk", str(profiles[4].pk), "-v", "0")
    assert (status, out.splitlines()[-1]) == (0, "no drift")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--after-pk", "3"], "--after-pk resumes the pass of one model: name exactly one app_label.Model."),
        (
            ["testapp.Profile", "testapp.Gadget", "--after-pk", "3"],
            "--after-pk resumes the pass of one model: name exactly one app_label.Model.",
        ),
        (
            ["testapp.Profile", "--after-pk", "abc"],
            "--after-pk 'abc' is not a primary key of testapp.Profile: \u201cabc\u201d value must be an integer.",
        ),
        (["testapp.Profile", "--batch-size", "0"], "--batch-size must be at least 1, not 0."),
        (["--database", "nope"], "--database 'nope' is not in DATABASES."),
    ],
)
def test_verify_refuses_impossible_arguments(args, message):
    with pytest.raises(CommandError) as excinfo:
        call_command("safeupdates_verify", *args)
    assert str(excinfo.value) == message


@pytest.mark.django_db
def test_verify_skips_an_applied_request_whose_changes_are_no_object():
    """A log row written by hand (or by a release with a bug) cannot stop the pass."""
    profile = ProfileFactory()
    applied(profile, active=True)
    ProcessedRequest.objects.create(
        content_type=ContentType.objects.get_for_model(Profile),
        object_id=str(profile.pk),
        version=next_version(),
        changes=["active", False],
        status=RequestStatus.APPLIED,
    )
    profile.refresh_from_db()
    assert replay(profile) == {"active": True}
    assert verify("testapp.Profile")[0] == 0


@pytest.mark.django_db
def test_verify_text_primary_keys_and_multi_table_children():
    tags = [Tag.objects.create(code=code) for code in ("b", "a10", "a9", "\u00e9t\u00e9")]
    for tag in tags:
        applied(tag, label=f"label {tag.code}")
    Tag.objects.filter(code="a9").update(label="bypassed")
    restaurant = Restaurant.objects.create(name="r")
    applied(restaurant, seats=12, name="Chez R")
    Restaurant.objects.filter(pk=restaurant.pk).update(seats=3)

    assert sorted(find_drift(Tag, batch_size=1), key=lambda d: d.pk) == [
        Drift("testapp.Tag", "a9", "label", "bypassed", "label a9")
    ]
    assert list(find_drift(Restaurant)) == [Drift("testapp.Restaurant", restaurant.pk, "seats", 3, 12)]
