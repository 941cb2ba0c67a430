"""SafeUpdateModelForm in a class-based UpdateView, through the test client."""

from __future__ import annotations

import uuid
from html import unescape

import pytest
from django.test import Client

from safeupdates.forms import SafeUpdateModelForm
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.forms_views import ProfileForm
from tests.htmlforms import form_data
from tests.testapp.models import Profile

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.forms_views")]


def url(profile: Profile) -> str:
    return f"/profiles/{profile.pk}/"


def test_a_fresh_form_saves(client: Client) -> None:
    profile = ProfileFactory(name="a")
    data = form_data(client.get(url(profile)).content, "profile")
    assert data["safeupdates_token"]
    assert client.post(url(profile), {**data, "name": "b"}).status_code == 302
    assert Profile.objects.get(pk=profile.pk).name == "b"


def test_a_stale_form_is_a_form_error_not_an_overwrite(client: Client) -> None:
    profile = ProfileFactory(name="a", score=1)
    data = form_data(client.get(url(profile)).content, "profile")
    rid = uuid.uuid4()
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True, newsletter=True)

    # The person's edit: active too, which the request changed since (name and score it did not).
    response = client.post(url(profile), {**data, "name": "b", "score": "2", "active": "on"})
    assert response.status_code == 200
    form = response.context["form"]
    assert form.safeupdates_conflict.fields == ["active"]
    assert f"Active: you saw False, now True (request {rid} at" in form.errors["active"][0]
    assert [e.code for e in form.errors.as_data()["active"]] == ["stale"]
    assert "marked below" in form.non_field_errors()[0]  # the summary does not repeat the field's error
    assert "score" not in form.errors and "name" not in form.errors
    assert "you saw False, now True" in unescape(response.content.decode())
    fresh = Profile.objects.get(pk=profile.pk)
    assert (fresh.name, fresh.score, fresh.active, fresh.newsletter) == ("a", 1, True, True)


def test_a_forged_token_is_a_form_error(client: Client) -> None:
    profile, other = ProfileFactory(name="a"), ProfileFactory(name="o")
    data = form_data(client.get(url(profile)).content, "profile")
    theirs = form_data(client.get(url(other)).content, "profile")["safeupdates_token"]
    for token in [data["safeupdates_token"][:-2] + "zz", theirs, "", "not a token"]:
        response = client.post(url(profile), {**data, "name": "b", "safeupdates_token": token})
        assert response.status_code == 200
        assert [e.code for e in response.context["form"].errors.as_data()["__all__"]] == ["invalid_token"]
    assert Profile.objects.get(pk=profile.pk).name == "a"


def test_a_deleted_record_is_a_form_error() -> None:
    profile = ProfileFactory()
    form = ProfileForm(instance=profile)
    data = {"name": "x", "score": 0, "safeupdates_token": form.initial["safeupdates_token"]}
    Profile.objects.filter(pk=profile.pk).delete()
    bound = ProfileForm(data, instance=profile)
    assert not bound.is_valid()
    assert "deleted after you opened it" in bound.non_field_errors()[0]


def test_the_form_saves_at_the_version_it_was_shown_with() -> None:
    """A write after the check still fails the save: the database decides (StaleObjectError)."""
    from safeupdates.exceptions import StaleObjectError

    profile = ProfileFactory(name="a")
    token = ProfileForm(instance=profile).initial["safeupdates_token"]
    bound = ProfileForm(
        {"name": "b", "score": 0, "safeupdates_token": token}, instance=Profile.objects.get(pk=profile.pk)
    )
    assert bound.is_valid()
    Profile.objects.update_if_newer(profile.pk, version=next_version(), name="c")  # after the check
    with pytest.raises(StaleObjectError):
        bound.save()
    assert Profile.objects.get(pk=profile.pk).name == "c"


def test_a_new_instance_given_its_row_by_refresh_from_db_is_checked_as_a_loaded_one() -> None:
    """Django's ``refresh_from_db()`` leaves ``_state.adding`` set; save() checks such an instance as a
    loaded one, and so does the form: it carries a token, and a write since it was shown is a form error,
    not an overwrite."""
    profile = ProfileFactory(name="a")
    shown = Profile(pk=profile.pk)
    shown.refresh_from_db()
    token = ProfileForm(instance=shown).initial.get("safeupdates_token")
    assert token
    Profile.objects.update_if_newer(profile.pk, version=next_version(), name="c")
    posted = Profile(pk=profile.pk)
    posted.refresh_from_db()
    bound = ProfileForm({"name": "b", "score": 0, "safeupdates_token": token}, instance=posted)
    assert not bound.is_valid()
    assert "was changed by someone else" in bound.non_field_errors()[0]
    assert Profile.objects.get(pk=profile.pk).name == "c"


def test_a_copy_of_a_loaded_instance_under_a_new_key_is_a_new_object() -> None:
    """Django's way to copy a row (key cleared, ``_state.adding`` set), given a key of its own: a create
    form, never "deleted after you opened it"."""
    copy = Profile.objects.get(pk=ProfileFactory(name="a").pk)
    copy.pk = None
    copy._state.adding = True
    copy.pk = Profile.objects.order_by("-pk").values_list("pk", flat=True)[0] + 1000
    form = ProfileForm({"name": "copy", "score": 0}, instance=copy)
    assert "safeupdates_token" not in form.initial
    assert form.is_valid(), form.errors
    assert Profile.objects.get(pk=form.save().pk).name == "copy"


def test_new_objects_are_not_checked() -> None:
    form = ProfileForm({"name": "n", "score": 0})
    assert form.is_valid()
    assert form.save().pk is not None


def test_the_mixin_is_a_declared_field_of_any_model_form() -> None:
    class Form(SafeUpdateModelForm):
        class Meta:
            model = Profile
            fields = ["name"]

    assert set(Form.base_fields) == {"safeupdates_token", "name"}


def test_a_write_between_the_check_and_the_save_is_a_form_error_too(client: Client) -> None:
    profile = ProfileFactory(name="a")
    data = form_data(client.get(url(profile)).content, "profile")
    response = client.post(f"/raced/{profile.pk}/", {**data, "name": "b", "active": "on"})
    assert response.status_code == 200
    form = response.context["form"]
    assert "Active: you saw False, now True" in form.errors["active"][0]
    assert "was changed by someone else" in form.non_field_errors()[0]
    fresh = Profile.objects.get(pk=profile.pk)
    assert (fresh.name, fresh.active) == ("a", True)


def test_a_write_of_another_field_between_the_check_and_the_save_lands_beside_the_edit(client: Client) -> None:
    profile = ProfileFactory(name="a")
    data = form_data(client.get(url(profile)).content, "profile")
    assert client.post(f"/raced/{profile.pk}/", {**data, "name": "b"}).status_code == 302
    fresh = Profile.objects.get(pk=profile.pk)
    assert (fresh.name, fresh.active) == ("b", True)


def test_a_form_of_values_json_cannot_encode_renders_and_is_checked() -> None:
    """A file, bytes and a custom type on the form (issue 19.8): the token is made and compared."""
    from django import forms

    from tests.testapp.models import Attachment, Point

    class AttachmentForm(SafeUpdateModelForm):
        spot = forms.CharField()

        class Meta:
            model = Attachment
            fields = ["title", "file", "blob", "spot"]

    attachment = Attachment.objects.create(title="t", blob=b"\x00", spot=Point(1, 2))
    form = AttachmentForm(instance=attachment)
    assert 'name="safeupdates_token"' in form.as_div()
    data = {"title": "u", "spot": "1,2", "safeupdates_token": form.initial["safeupdates_token"]}
    assert AttachmentForm(data, instance=Attachment.objects.get(pk=attachment.pk)).is_valid()

    moved = Attachment.objects.get(pk=attachment.pk)
    moved.spot = Point(5, 6)
    moved.save()
    stale = AttachmentForm({**data, "spot": "7,8"}, instance=Attachment.objects.get(pk=attachment.pk))
    assert not stale.is_valid()
    assert "spot" in stale.safeupdates_conflict.fields  # a full save wrote every field, the title too
    assert stale.errors["spot"] == ["Spot: now 5,6 (a direct save)"]


def test_the_token_records_the_forms_fields_only() -> None:
    from safeupdates.conflicts import read_edit_token

    profile = ProfileFactory(note="private")
    _version, seen = read_edit_token(ProfileForm(instance=profile).initial["safeupdates_token"], profile)
    assert list(seen) == ["name", "active", "score"]


def test_a_value_the_view_set_in_a_field_not_on_the_form_is_not_quoted_on_the_page(client: Client, caplog) -> None:
    """The view's own value (a note the form does not show) that the save refuses: the form is shown again
    with an error that names neither the field nor the value; the server's log has both."""
    import logging

    profile = ProfileFactory(name="a")
    data = form_data(client.get(url(profile)).content, "profile")
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        response = client.post(f"/noting/{profile.pk}/", {**data, "name": "b"})
    page = unescape(response.content.decode())
    assert response.status_code == 200
    assert "could not be stored" in page
    assert "secret-7f3a" not in page and "note" not in page
    assert any("secret-7f3a" in r.getMessage() for r in caplog.records if r.name == "safeupdates")
    assert Profile.objects.get().name == "a"


def test_a_token_of_a_surface_that_shows_more_fields_tells_no_more_than_this_form_shows(client: Client) -> None:
    """A token made by another surface of the model (a staff form that shows the note) posted to this form:
    the conflict names only the fields this form shows, never the note's value now."""
    from safeupdates.conflicts import edit_token

    profile = ProfileFactory(name="a", note="old")
    data = form_data(client.get(url(profile)).content, "profile")
    wider = edit_token(profile, ["name", "active", "score", "note"])
    fresh = Profile.objects.get()
    fresh.note, fresh.score = "secret-7f3a", 5
    fresh.save()
    response = client.post(url(profile), {**data, "name": "b", "safeupdates_token": wider})
    page = unescape(response.content.decode())
    assert response.status_code == 200 and "changed by someone else" in page
    assert "Score" in page  # a field this form shows
    assert "secret-7f3a" not in page and "Note" not in page
    assert Profile.objects.get().name == "a"


# -- issue 53: edits of different fields never conflict ----------------------------------------------------


def opened(profile: Profile) -> dict[str, str]:
    """The form as a browser of its own (another person) posts it when Save is clicked."""
    return form_data(Client().get(url(profile)).content, "profile")


def test_two_people_editing_different_fields_both_save() -> None:
    profile = ProfileFactory(name="first", score=1)
    seen_by_ann, seen_by_bob = opened(profile), opened(profile)
    assert Client().post(url(profile), {**seen_by_ann, "name": "renamed"}).status_code == 302

    response = Client().post(url(profile), {**seen_by_bob, "score": "5"})

    assert response.status_code == 302, response.content.decode()
    fresh = Profile.objects.get(pk=profile.pk)
    assert (fresh.name, fresh.score) == ("renamed", 5)


def test_an_edit_of_a_field_someone_else_changed_is_a_form_error_naming_only_that_field() -> None:
    profile = ProfileFactory(name="first", score=1)
    seen_by_ann, seen_by_bob = opened(profile), opened(profile)
    assert Client().post(url(profile), {**seen_by_ann, "name": "renamed", "score": "5"}).status_code == 302
    before = Profile.objects.get(pk=profile.pk)

    response = Client().post(url(profile), {**seen_by_bob, "score": "7", "active": "on"})

    assert response.status_code == 200
    form = response.context["form"]
    assert form.safeupdates_conflict.fields == ["score"]
    assert set(form.errors) == {"__all__", "score"}
    assert form.errors["score"] == ["Score: now 5 (a direct save)"]
    assert "Name: now" not in unescape(response.content.decode())
    fresh = Profile.objects.get(pk=profile.pk)
    assert (fresh.name, fresh.score, fresh.active, fresh.lock_version) == ("renamed", 5, False, before.lock_version)


def test_a_form_that_changes_nothing_writes_nothing_and_is_no_conflict() -> None:
    profile = ProfileFactory(name="first")
    seen_by_ann, seen_by_bob = opened(profile), opened(profile)
    assert Client().post(url(profile), {**seen_by_ann, "name": "renamed"}).status_code == 302
    version = Profile.objects.get(pk=profile.pk).lock_version

    response = Client().post(url(profile), seen_by_bob)  # Bob's page still shows "first"

    assert response.status_code == 302, response.content.decode()
    fresh = Profile.objects.get(pk=profile.pk)
    assert (fresh.name, fresh.lock_version) == ("renamed", version)


def test_a_form_writes_only_the_fields_changed_and_the_save_signals_say_so() -> None:
    from django.db.models.signals import post_save, pre_save

    profile = ProfileFactory(name="first")
    seen = opened(profile)
    sent: list[tuple[str, object]] = []

    def pre(sender: object, update_fields: object, **kwargs: object) -> None:
        sent.append(("pre_save", update_fields))

    def post(sender: object, update_fields: object, **kwargs: object) -> None:
        sent.append(("post_save", update_fields))

    pre_save.connect(pre, sender=Profile)
    post_save.connect(post, sender=Profile)
    try:
        assert Client().post(url(profile), {**seen, "score": "3"}).status_code == 302
    finally:
        pre_save.disconnect(pre, sender=Profile)
        post_save.disconnect(post, sender=Profile)
    assert sent == [("pre_save", frozenset({"score"})), ("post_save", frozenset({"score"}))]


def test_a_field_the_view_sets_before_the_save_is_written_too() -> None:
    profile = ProfileFactory(name="first", note="")
    seen_by_ann, seen_by_bob = opened(profile), opened(profile)
    assert Client().post(f"/stamping/{profile.pk}/", {**seen_by_ann, "name": "renamed"}).status_code == 302
    assert Profile.objects.get(pk=profile.pk).note == "stamped 0"

    response = Client().post(f"/stamping/{profile.pk}/", {**seen_by_bob, "score": "4"})

    assert response.status_code == 302, response.content.decode()
    fresh = Profile.objects.get(pk=profile.pk)
    assert (fresh.name, fresh.score, fresh.note) == ("renamed", 4, "stamped 4")


def test_a_write_of_a_changed_field_between_the_check_and_the_save_is_a_form_error(client: Client) -> None:
    profile = ProfileFactory(name="a", score=1)
    data = form_data(client.get(url(profile)).content, "profile")
    response = client.post(f"/raced-name/{profile.pk}/", {**data, "name": "b", "score": "2"})
    assert response.status_code == 200
    form = response.context["form"]
    assert form.safeupdates_conflict.fields == ["name"]
    assert form.errors["name"] == ["Name: now 'theirs' (a direct save)"]
    fresh = Profile.objects.get(pk=profile.pk)
    assert (fresh.name, fresh.score) == ("theirs", 1)
