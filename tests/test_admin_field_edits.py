"""Issue 53 in the admin: two staff users who edit different fields of one record both save; an edit of a
field someone else changed since it was shown is refused, naming only that field, and writes nothing."""

from __future__ import annotations

from html import unescape
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.db.models.signals import post_save, pre_save
from django.test import Client
from django.urls import reverse

from tests.factories import ProfileFactory
from tests.htmlforms import form_data
from tests.testapp.models import Profile

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:testapp_profile_changelist"


def staff(username: str) -> Client:
    """A browser of its own, logged in as a staff user of that name."""
    client = Client()
    client.force_login(User.objects.create_superuser(username, f"{username}@example.com", "x"))
    return client


@pytest.fixture
def ann() -> Client:
    return staff("ann")


@pytest.fixture
def bob() -> Client:
    return staff("bob")


def change_url(profile: Profile) -> str:
    return reverse("admin:testapp_profile_change", args=[profile.pk])


def opened(client: Client, profile: Profile) -> dict[str, Any]:
    """The change form as that person's browser posts it when Save is clicked."""
    return {**form_data(client.get(change_url(profile)).content, "profile_form"), "_save": "Save"}


def listed(client: Client) -> dict[str, Any]:
    """The change list's form (list_editable: active and score) as that person's browser posts it."""
    return {**form_data(client.get(reverse(CHANGELIST)).content, "changelist-form"), "_save": "Save"}


def prefix(data: dict[str, Any], profile: Profile) -> str:
    """The formset prefix of ``profile``'s row in a posted change list."""
    total = int(data["form-TOTAL_FORMS"])
    return next(f"form-{i}" for i in range(total) if str(data[f"form-{i}-id"]) == str(profile.pk))


def stored(profile: Profile) -> Profile:
    return Profile.objects.get(pk=profile.pk)


def text(response: Any) -> str:
    return unescape(response.content.decode())


# -- the change form ---------------------------------------------------------------------------------------


def test_two_staff_users_editing_different_fields_both_save(ann: Client, bob: Client) -> None:
    profile = ProfileFactory(name="first", active=False, score=1)
    seen_by_ann, seen_by_bob = opened(ann, profile), opened(bob, profile)

    assert ann.post(change_url(profile), {**seen_by_ann, "name": "renamed"}).status_code == 302
    response = bob.post(change_url(profile), {**seen_by_bob, "active": "on"})

    assert response.status_code == 302, text(response)
    row = stored(profile)
    assert (row.name, row.active, row.score) == ("renamed", True, 1)  # both edits landed, nothing undone


def test_the_admin_log_names_only_the_field_each_person_changed(ann: Client, bob: Client) -> None:
    profile = ProfileFactory(name="first")
    seen_by_ann, seen_by_bob = opened(ann, profile), opened(bob, profile)
    ann.post(change_url(profile), {**seen_by_ann, "name": "renamed"})
    assert bob.post(change_url(profile), {**seen_by_bob, "score": "4"}).status_code == 302
    entry = LogEntry.objects.filter(user__username="bob").get()
    assert entry.get_change_message() == "Changed Score."  # not Ann's name, which Bob's page still showed
    assert entry.object_repr == "renamed"  # the record as saved


def test_an_edit_of_the_same_field_is_refused_naming_only_that_field(ann: Client, bob: Client) -> None:
    profile = ProfileFactory(name="first", score=1)
    seen_by_ann, seen_by_bob = opened(ann, profile), opened(bob, profile)
    assert ann.post(change_url(profile), {**seen_by_ann, "name": "renamed", "score": "5"}).status_code == 302
    before = stored(profile)

    response = bob.post(change_url(profile), {**seen_by_bob, "score": "7", "active": "on"})

    assert response.status_code == 200  # the change form shown again, with the conflict (as before issue 53)
    form = response.context["adminform"].form
    assert form.safeupdates_conflict.fields == ["score"]  # Ann's name is no conflict: Bob did not change it
    assert set(form.errors) == {"__all__", "score"}
    html = text(response)
    assert 'id="safeupdates-conflicts"' in html
    assert "Score: now 5 (a direct save)" in html
    assert 'data-field="name"' not in html and "Name: now" not in html
    after = stored(profile)
    assert (after.name, after.score, after.active, after.lock_version) == ("renamed", 5, False, before.lock_version)


def test_a_submit_that_changes_nothing_writes_nothing_and_is_no_conflict(ann: Client, bob: Client) -> None:
    profile = ProfileFactory(name="first")
    seen_by_ann, seen_by_bob = opened(ann, profile), opened(bob, profile)
    assert bob.post(change_url(profile), seen_by_bob).status_code == 302  # nobody else wrote: still nothing
    assert stored(profile).lock_version == profile.lock_version

    assert ann.post(change_url(profile), {**seen_by_ann, "name": "renamed"}).status_code == 302
    version = stored(profile).lock_version
    response = bob.post(change_url(profile), seen_by_bob)  # Bob's page still shows "first"

    assert response.status_code == 302, text(response)
    assert (stored(profile).name, stored(profile).lock_version) == ("renamed", version)


def test_a_field_a_save_model_override_sets_is_written_too(
    ann: Client, bob: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.testapp.admin import ProfileAdmin

    def save_model(self: Any, request: Any, obj: Profile, form: Any, change: bool) -> None:
        obj.note = f"last edited by {request.user.username}"
        obj.save()

    monkeypatch.setattr(ProfileAdmin, "save_model", save_model)
    profile = ProfileFactory(name="first")
    seen_by_ann, seen_by_bob = opened(ann, profile), opened(bob, profile)
    assert bob.post(change_url(profile), {**seen_by_bob, "active": "on"}).status_code == 302
    row = stored(profile)
    assert (row.active, row.note) == (True, "last edited by bob")

    # Ann's page was opened before Bob's save: her edit of another field lands, and so does her note.
    assert ann.post(change_url(profile), {**seen_by_ann, "name": "renamed"}).status_code == 302
    row = stored(profile)
    assert (row.name, row.active, row.note) == ("renamed", True, "last edited by ann")


def test_save_signals_get_the_fields_written(ann: Client, bob: Client) -> None:
    profile = ProfileFactory(name="first")
    seen_by_ann, seen_by_bob = opened(ann, profile), opened(bob, profile)
    ann.post(change_url(profile), {**seen_by_ann, "name": "renamed"})
    sent: list[tuple[str, Any]] = []

    def pre(sender: Any, instance: Any, update_fields: Any, **kwargs: Any) -> None:
        sent.append(("pre_save", update_fields))

    def post(sender: Any, instance: Any, update_fields: Any, **kwargs: Any) -> None:
        sent.append(("post_save", update_fields))

    pre_save.connect(pre, sender=Profile)
    post_save.connect(post, sender=Profile)
    try:
        assert bob.post(change_url(profile), {**seen_by_bob, "active": "on"}).status_code == 302
    finally:
        pre_save.disconnect(pre, sender=Profile)
        post_save.disconnect(post, sender=Profile)
    assert sent == [("pre_save", frozenset({"active"})), ("post_save", frozenset({"active"}))]


# -- list_editable -----------------------------------------------------------------------------------------


def test_list_editable_edits_of_different_fields_both_save(ann: Client, bob: Client) -> None:
    profile, other = ProfileFactory(name="p", score=1), ProfileFactory(name="o", score=1)
    seen_by_ann, seen_by_bob = listed(ann), listed(bob)
    assert (
        ann.post(reverse(CHANGELIST), {**seen_by_ann, f"{prefix(seen_by_ann, profile)}-score": "5"}).status_code == 302
    )

    response = bob.post(
        reverse(CHANGELIST),
        {**seen_by_bob, f"{prefix(seen_by_bob, profile)}-active": "on", f"{prefix(seen_by_bob, other)}-score": "9"},
    )

    assert response.status_code == 302, text(response)
    row = stored(profile)
    assert (row.active, row.score) == (True, 5)
    assert stored(other).score == 9


def test_list_editable_edit_of_the_same_field_is_refused_naming_only_that_field(ann: Client, bob: Client) -> None:
    profile, other = ProfileFactory(name="p", score=1), ProfileFactory(name="o", score=1)
    seen_by_ann, seen_by_bob = listed(ann), listed(bob)
    ann_row = prefix(seen_by_ann, profile)
    ann_edit = {**seen_by_ann, f"{ann_row}-score": "5", f"{ann_row}-active": "on"}
    assert ann.post(reverse(CHANGELIST), ann_edit).status_code == 302
    before = stored(profile), stored(other)

    bob_row = prefix(seen_by_bob, profile)
    response = bob.post(
        reverse(CHANGELIST), {**seen_by_bob, f"{bob_row}-score": "7", f"{prefix(seen_by_bob, other)}-score": "9"}
    )

    assert response.status_code == 200  # the list shown again, with the conflict (as before issue 53)
    conflicts = [f.safeupdates_conflict for f in response.context["cl"].formset.forms if f.safeupdates_conflict]
    assert [c.fields for c in conflicts] == [["score"]]  # Ann's "active" is no conflict: Bob did not change it
    html = text(response)
    assert "Score: now 5 (a direct save)" in html
    assert "Active: " not in html
    after = stored(profile), stored(other)
    assert [(p.score, p.active, p.lock_version) for p in after] == [(p.score, p.active, p.lock_version) for p in before]


def test_a_list_editable_row_someone_else_changed_but_this_person_did_not_is_not_saved(
    ann: Client, bob: Client
) -> None:
    profile, other = ProfileFactory(name="p"), ProfileFactory(name="o")
    seen_by_ann, seen_by_bob = listed(ann), listed(bob)
    assert (
        ann.post(reverse(CHANGELIST), {**seen_by_ann, f"{prefix(seen_by_ann, profile)}-active": "on"}).status_code
        == 302
    )
    version = stored(profile).lock_version

    response = bob.post(reverse(CHANGELIST), {**seen_by_bob, f"{prefix(seen_by_bob, other)}-score": "3"})

    assert response.status_code == 302, text(response)
    assert (stored(profile).active, stored(profile).lock_version) == (True, version)  # Ann's edit stands
    assert stored(other).score == 3
    assert [e.object_id for e in LogEntry.objects.filter(user__username="bob")] == [str(other.pk)]
