"""The edit token and the conflict report that every conflict-safe surface builds on."""

from __future__ import annotations

import uuid

import pytest
from django.core import signing

from safeupdates.conflicts import edit_token, find_conflict, read_edit_token
from safeupdates.exceptions import InvalidUpdate
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.testapp.models import Profile

pytestmark = pytest.mark.django_db


def test_a_row_that_did_not_move_has_no_conflict():
    profile = ProfileFactory(name="a")
    version, seen = read_edit_token(edit_token(profile, ["name", "active"]), profile)
    assert (version, seen) == (profile.lock_version, {"name": "a", "active": False})
    assert find_conflict(Profile.objects.get(pk=profile.pk), version, seen) is None


def test_a_conflict_names_each_changed_field_with_its_request():
    profile = ProfileFactory(name="a", score=1)
    token = edit_token(profile, ["name", "active", "score"])
    rid = uuid.uuid4()
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True)
    other = Profile.objects.get(pk=profile.pk)
    other.score = 5
    other.save()
    current = Profile.objects.get(pk=profile.pk)
    conflict = find_conflict(current, *read_edit_token(token, current))
    assert conflict is not None
    assert conflict.fields == ["active", "score"]
    active, score = conflict.changes
    assert (active.seen, active.now, active.request_id) == (False, True, rid)
    assert active.changed_at is not None
    assert (score.seen, score.now, score.request_id, score.changed_at) == (1, 5, None, None)
    message = conflict.message()
    assert f"Active: you saw False, now True (request {rid} at" in message
    assert "Score: you saw 1, now 5 (a direct save)" in message
    body = conflict.as_dict()
    assert body["changes"][0] == {
        "field": "active",
        "seen": False,
        "now": True,
        "request_id": str(rid),
        "changed_at": active.changed_at.isoformat(),
        "version": active.version,
    }
    assert body["current_version"] == current.lock_version > body["seen_version"]


def test_a_write_to_a_field_not_shown_is_a_conflict_without_changes():
    profile = ProfileFactory(name="a")
    token = edit_token(profile, ["name"])
    Profile.objects.update_if_newer(profile.pk, version=next_version(), active=True)
    current = Profile.objects.get(pk=profile.pk)
    conflict = find_conflict(current, *read_edit_token(token, current))
    assert conflict is not None and conflict.changes == ()
    assert "no field you saw differs" in conflict.message()


def test_a_forged_or_foreign_token_is_refused():
    profile, other = ProfileFactory(), ProfileFactory()
    token = edit_token(profile, ["name"])
    with pytest.raises(InvalidUpdate, match="another record"):
        read_edit_token(token, other)
    forged = signing.dumps({"m": "testapp.profile", "pk": str(profile.pk), "v": 10**12, "f": {}}, salt="other")
    with pytest.raises(InvalidUpdate, match="not valid"):
        read_edit_token(forged, profile)
    with pytest.raises(InvalidUpdate, match="not valid"):
        read_edit_token(token[:-2] + "xx", profile)
    with pytest.raises(InvalidUpdate, match="not valid"):
        read_edit_token("", profile)


def test_the_message_leaves_out_the_changes_a_form_marks_on_its_fields() -> None:
    profile = Profile.objects.create(name="a")
    seen_version, seen = read_edit_token(edit_token(profile, ["name", "active", "score"]), profile)
    Profile.objects.update_if_newer(profile.pk, version=next_version(), active=True, score=3)
    conflict = find_conflict(Profile.objects.get(pk=profile.pk), seen_version, seen)
    assert conflict is not None and conflict.fields == ["active", "score"]
    every = conflict.message()
    assert "Active: you saw False, now True" in every and "Score: you saw 0, now 3" in every
    some = conflict.message(["active"])
    assert "Active" not in some and "Score: you saw 0, now 3" in some and "the fields marked below" in some
    none = conflict.message(["active", "score"])
    assert "Active" not in none and "Score" not in none and "see the fields marked below" in none
