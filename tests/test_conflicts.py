"""The edit token and the conflict report that every conflict-safe surface builds on."""

from __future__ import annotations

import uuid

import pytest
from django.core import signing
from hypothesis import given, settings
from hypothesis import strategies as st

from safeupdates.conflicts import NOT_SHOWN, edit_token, field_digest, find_conflict, read_edit_token
from safeupdates.exceptions import InvalidUpdate
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.testapp.models import Profile

pytestmark = pytest.mark.django_db


def test_a_row_that_did_not_move_has_no_conflict():
    profile = ProfileFactory(name="a")
    version, seen = read_edit_token(edit_token(profile, ["name", "active"]), profile)
    assert version == profile.lock_version and list(seen) == ["name", "active"]
    assert find_conflict(Profile.objects.get(pk=profile.pk), version, seen) is None


def test_a_conflict_names_each_changed_field_with_its_request():
    profile = ProfileFactory(name="a", score=1)
    token = edit_token(profile, ["name", "active", "score"])
    rid = uuid.uuid4()
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True)
    other = Profile.objects.get(pk=profile.pk)
    other.score = 5
    other.save(update_fields=["score"])  # active keeps the request's version
    current = Profile.objects.get(pk=profile.pk)
    conflict = find_conflict(current, *read_edit_token(token, current))
    assert conflict is not None
    assert conflict.fields == ["active", "score"]
    active, score = conflict.changes
    assert (active.seen, active.now, active.request_id) == (False, True, rid)
    assert active.changed_at is not None
    # The value seen of a field with a few values is told from its digest; of any other, it is not known.
    assert (score.seen, score.now, score.request_id, score.changed_at) == (NOT_SHOWN, 5, None, None)
    message = conflict.message()
    assert f"Active: you saw False, now True (request {rid} at" in message
    assert "Score: now 5 (a direct save)" in message
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
    assert "Active: you saw False, now True" in every and "Score: now 3" in every
    some = conflict.message(["active"])
    assert "Active" not in some and "Score: now 3" in some and "the fields marked below" in some
    none = conflict.message(["active", "score"])
    assert "Active" not in none and "Score" not in none and "see the fields marked below" in none


# -- tokens carry versions and digests, never values (issue 19.5) ------------------------------------------


def _payload(token: str) -> dict:
    return signing.loads(token, salt="safeupdates.edit-token")


def test_a_token_carries_no_value_of_any_field() -> None:
    profile = ProfileFactory(name="Ada Lovelace", note="a private note")
    token = edit_token(profile, ["name", "note", "active"])
    payload = _payload(token)
    assert set(payload) == {"m", "pk", "v", "d"}
    assert payload["v"] == profile.lock_version and set(payload["d"]) == {"name", "note", "active"}
    decoded = str(payload)
    assert "Ada" not in decoded and "private" not in decoded and "False" not in decoded


def test_a_token_names_only_the_fields_it_was_made_for() -> None:
    profile = ProfileFactory(name="a")
    token = edit_token(profile, ["name"])
    Profile.objects.update_if_newer(profile.pk, version=next_version(), note="written since", active=True)
    current = Profile.objects.get(pk=profile.pk)
    conflict = find_conflict(current, *read_edit_token(token, current))
    assert conflict is not None and conflict.fields == []  # note and active were never shown


def test_digests_made_with_a_fallback_key_still_compare(settings) -> None:
    profile = ProfileFactory(name="a", score=1)
    token = edit_token(profile, ["name", "score"])
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "a-new-key", [settings.SECRET_KEY]
    Profile.objects.update_if_newer(profile.pk, version=next_version(), score=2)
    current = Profile.objects.get(pk=profile.pk)
    conflict = find_conflict(current, *read_edit_token(token, current))
    assert conflict is not None and conflict.fields == ["score"]  # name is still what was seen
    settings.SECRET_KEY_FALLBACKS = []
    with pytest.raises(InvalidUpdate, match="not valid"):
        read_edit_token(token, current)


def test_a_token_of_another_model_with_the_same_pk_is_refused() -> None:
    from tests.testapp.models import Document

    profile = ProfileFactory()
    document = Document.objects.create(pk=profile.pk, title="t")
    with pytest.raises(InvalidUpdate, match="another record"):
        read_edit_token(edit_token(profile, ["name"]), document)


def test_a_token_naming_a_field_removed_since_on_a_record_that_moved_on() -> None:
    """An old page's token names a field the model no longer has (issue 19.13): not a server error."""
    profile = ProfileFactory(name="a")
    token = edit_token(profile, ["name"])
    payload = _payload(token)
    payload["d"]["removed_since"] = "AAAAAAAA"
    old = signing.dumps(payload, salt="safeupdates.edit-token", compress=True)
    Profile.objects.update_if_newer(profile.pk, version=next_version(), name="b")
    current = Profile.objects.get(pk=profile.pk)
    conflict = find_conflict(current, *read_edit_token(old, current))
    assert conflict is not None and conflict.fields == ["name"]


def test_a_token_of_an_older_release_asks_for_a_reload() -> None:
    profile = ProfileFactory(name="a")
    old = signing.dumps(
        {"m": "testapp.profile", "pk": str(profile.pk), "v": profile.lock_version, "f": {"name": "a"}},
        salt="safeupdates.edit-token",
        compress=True,
    )
    with pytest.raises(InvalidUpdate, match="older version of this page; reload"):
        read_edit_token(old, profile)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("latin-1")), st.integers(), st.none()))
def test_any_text_is_a_valid_token_or_invalid_update(text) -> None:
    profile = Profile(pk=1, name="a", lock_version=1)
    with pytest.raises(InvalidUpdate):
        read_edit_token(text, profile)


# -- who wrote a field comes from versions (issue 20.4) ----------------------------------------------------


def test_the_writer_of_a_field_is_told_by_its_version_not_by_its_value() -> None:
    profile = ProfileFactory(active=True)
    token = edit_token(profile, ["active"])
    rid = uuid.uuid4()
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=False)
    for value in (True, False):  # two direct saves: the last one sets the value the request had set
        saved = Profile.objects.get(pk=profile.pk)
        saved.active = value
        saved.save()
    current = Profile.objects.get(pk=profile.pk)
    conflict = find_conflict(current, *read_edit_token(token, current))
    assert conflict is not None
    (active,) = conflict.changes
    assert (active.request_id, active.changed_at, active.version) == (None, None, current.field_version("active"))
    assert "(a direct save)" in conflict.message() and str(rid) not in conflict.message()


def test_the_writer_is_the_request_whose_version_the_field_carries() -> None:
    profile = ProfileFactory()
    token = edit_token(profile, ["active", "name"])
    first, second = uuid.uuid4(), uuid.uuid4()
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=first, active=True)
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=second, name="n")
    current = Profile.objects.get(pk=profile.pk)
    conflict = find_conflict(current, *read_edit_token(token, current))
    assert conflict is not None
    assert {change.name: change.request_id for change in conflict.changes} == {"active": first, "name": second}


# -- values that JSON cannot encode (issue 19.8) -----------------------------------------------------------


def test_values_json_cannot_encode_are_compared_and_reported() -> None:
    import json

    from tests.testapp.models import Attachment, Point

    attachment = Attachment.objects.create(title="t", blob=b"\x00\x01", spot=Point(1, 2))
    token = edit_token(attachment, ["title", "file", "blob", "spot"])
    stored = Attachment.objects.get(pk=attachment.pk)
    stored.file.name = "attachments/new.txt"
    stored.blob = b"\xff"
    stored.spot = Point(3, 4)
    stored.save()
    current = Attachment.objects.get(pk=attachment.pk)
    conflict = find_conflict(current, *read_edit_token(token, current))
    assert conflict is not None and conflict.fields == ["file", "blob", "spot"]
    body = json.loads(json.dumps(conflict.as_dict()))
    assert [change["now"] for change in body["changes"]] == ["attachments/new.txt", "/w==", "3,4"]
    assert "Spot: now 3,4 (a direct save)" in conflict.message()


def test_the_value_seen_is_told_for_a_field_of_a_few_choices_only() -> None:
    from tests.testapp.models import Attachment

    attachment = Attachment.objects.create(title="t", kind="note")
    token = edit_token(attachment, ["title", "kind"])
    Attachment.objects.filter(pk=attachment.pk).update(title="u", kind="image", lock_version=next_version())
    current = Attachment.objects.get(pk=attachment.pk)
    conflict = find_conflict(current, *read_edit_token(token, current))
    assert conflict is not None
    kind, title = sorted(conflict.changes, key=lambda change: change.name)
    assert (kind.seen, kind.now) == ("note", "image") and (title.seen, title.now) == (NOT_SHOWN, "u")
    assert "Kind: you saw 'note', now 'image' (a direct save)" in conflict.message()


def test_values_of_every_kind_compare_as_stored_and_report_as_json() -> None:
    """A decimal, datetimes in two zones, a UUID, JSON, bytes, an IP address, a foreign key (issue 19.8)."""
    import datetime as dt
    import decimal
    import json
    import zoneinfo

    from tests.testapp.models import Document, Specimen

    document = Document.objects.create(title="d")
    moment = dt.datetime(2025, 3, 30, 1, 30, tzinfo=dt.UTC)
    specimen = Specimen.objects.create(
        amount=decimal.Decimal("1.5"),
        happened_at=moment,
        token=uuid.UUID(int=1),
        data={"b": [1, 2], "a": None},
        blob=b"\x00",
        address="10.0.0.1",
        document=document,
    )
    names = ["amount", "happened_at", "token", "data", "blob", "address", "document", "day", "took"]
    token = edit_token(Specimen.objects.get(pk=specimen.pk), names)
    # The same instant in another zone, the same JSON in another key order: no change.
    same = Specimen.objects.get(pk=specimen.pk)
    same.happened_at = moment.astimezone(zoneinfo.ZoneInfo("Europe/Paris"))
    same.data = {"a": None, "b": [1, 2]}
    same.save()
    current = Specimen.objects.get(pk=specimen.pk)
    conflict = find_conflict(current, *read_edit_token(token, current))
    assert conflict is not None and conflict.fields == []
    # As held in memory after the save (an ETag made from it) and as read back: one digest.
    assert [field_digest(same, name) for name in names] == [field_digest(current, name) for name in names]

    current.amount, current.data, current.blob, current.token = decimal.Decimal("2.25"), {"x": 1}, b"\x01", None
    current.day, current.took = dt.date(2025, 1, 2), dt.timedelta(seconds=90)
    current.save()
    moved = Specimen.objects.get(pk=specimen.pk)
    conflict = find_conflict(moved, *read_edit_token(token, moved))
    assert conflict is not None
    body = json.loads(json.dumps(conflict.as_dict()))
    assert {change["field"]: change["now"] for change in body["changes"]} == {
        "amount": "2.2500",
        "token": None,
        "data": {"x": 1},
        "blob": "AQ==",
        "day": "2025-01-02",
        "took": "00:01:30",
    }
    assert "Day: now 2025-01-02 (a direct save)" in conflict.message()
