"""SafeUpdateModelAdmin through real HTTP: every way the admin writes refuses a record that moved on."""

from __future__ import annotations

import json
import uuid
import warnings
from html import unescape
from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.factories import DocumentFactory, ProfileFactory
from tests.htmlforms import form_data
from tests.testapp.models import Chapter, Document, Profile
from tests.workers import meanwhile

pytestmark = pytest.mark.django_db


def change_url(profile: Profile) -> str:
    return reverse("admin:testapp_profile_change", args=[profile.pk])


def change_form(client: Client, profile: Profile) -> dict[str, Any]:
    """The change form's fields as a browser posts them when Save is clicked."""
    return {**form_data(client.get(change_url(profile)).content, "profile_form"), "_save": "Save"}


def queued_update(profile: Profile, **changes: Any) -> uuid.UUID:
    """What a worker does after the page was shown: apply a recorded request."""
    rid = uuid.uuid4()
    assert Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, **changes).applied
    return rid


def row(profile: Profile) -> tuple[Any, ...]:
    fresh = Profile.objects.get(pk=profile.pk)
    return fresh.name, fresh.active, fresh.newsletter, fresh.score, fresh.lock_version


def text(response: Any) -> str:
    return unescape(response.content.decode())


# -- the change form ---------------------------------------------------------------------------------------


def test_a_stale_change_form_is_refused_and_shown_again_with_what_changed(admin_client: Client) -> None:
    profile = ProfileFactory(name="ann")
    page = admin_client.get(change_url(profile))
    data = {**form_data(page.content, "profile_form"), "_save": "Save"}  # as a browser posts it
    assert data["safeupdates_token"]
    rid = queued_update(profile, active=True, score=3)  # lands while the form is open
    before = row(profile)

    # The person's edit: active and score, which the request changed since, and name and newsletter.
    data.update(name="anna", newsletter="on", active="on", score="4")
    response = admin_client.post(change_url(profile), data)

    assert response.status_code == 200
    assert row(profile) == before  # nothing written over
    html = text(response)
    message = response.context["adminform"].form.non_field_errors()[0]
    assert message.startswith(f"Profile {profile.pk} was changed by someone else after you opened it")
    # Each change is told once on the page: on its field, not again in the form's summary.
    assert html.count(f"Active: you saw False, now True (request {rid} at") == 1
    assert html.count("Score: now 3 (request") == 1
    assert "Active" not in message and "Score" not in message
    assert "Name: now" not in html and "Newsletter: " not in html  # not written since: no conflict
    assert 'id="safeupdates-conflicts"' in html
    assert reverse("admin:safeupdates_processedrequest_change", args=[ProcessedRequest.objects.get().pk]) in html
    assert 'id="safeupdates-reload"' in html and f'href="{change_url(profile)}"' in html
    assert 'value="anna"' in html  # the person's input is kept
    assert set(response.context["adminform"].form.errors) == {"__all__", "active", "score"}
    assert response.context["original"].lock_version == before[4]  # shown as stored now, not as seen

    # The same form posted again is refused again; the reloaded one saves.
    assert admin_client.post(change_url(profile), data).status_code == 200
    assert row(profile) == before
    fresh = change_form(admin_client, profile)
    fresh.update(name="anna", score="4")
    assert admin_client.post(change_url(profile), fresh).status_code == 302
    assert row(profile)[:4] == ("anna", True, False, 4)


def test_a_write_to_a_field_not_on_the_form_is_kept_beside_the_edit(admin_client: Client) -> None:
    # The save writes only the field the person changed, never the form's old copy of the others.
    profile = ProfileFactory()
    data = change_form(admin_client, profile)
    queued_update(profile, dark_mode=True)  # a field the form does not show
    response = admin_client.post(change_url(profile), {**data, "name": "x"})
    assert response.status_code == 302
    fresh = Profile.objects.get(pk=profile.pk)
    assert (fresh.name, fresh.dark_mode) == ("x", True)


def test_a_full_save_since_the_page_was_shown_refuses_any_edit(admin_client: Client) -> None:
    # A save of the whole row wrote every field: the edit overlaps it, whatever field it changes.
    profile = ProfileFactory(name="a")
    data = change_form(admin_client, profile)
    saved = Profile.objects.get(pk=profile.pk)
    saved.dark_mode = True
    saved.save()
    response = admin_client.post(change_url(profile), {**data, "score": "3"})
    assert response.status_code == 200
    assert response.context["adminform"].form.safeupdates_conflict.fields == ["score"]
    assert "Score: now 0 (a direct save)" in text(response)
    assert Profile.objects.get(pk=profile.pk).score == 0


def test_a_forged_or_missing_token_is_refused(admin_client: Client) -> None:
    profile = ProfileFactory(name="a")
    data = change_form(admin_client, profile)
    for token in ["", data["safeupdates_token"][:-3] + "abc"]:
        response = admin_client.post(change_url(profile), {**data, "name": "b", "safeupdates_token": token})
        assert response.status_code == 200
        assert "cannot be checked against later changes" in text(response)
    assert Profile.objects.get(pk=profile.pk).name == "a"


@pytest.mark.django_db(transaction=True)
def test_a_write_between_the_check_and_the_save_is_refused_by_save(admin_client: Client, postgres_only: None) -> None:
    """The form's check passes; another connection commits a write before the UPDATE: save()'s own
    StaleObjectError refuses it, and the page shows the conflict (no compare-then-write)."""
    profile = ProfileFactory(name="a")
    data = change_form(admin_client, profile)
    rid = uuid.uuid4()
    with meanwhile(Profile, lambda instance: queued_and_closed(instance.pk, rid)) as ran:
        response = admin_client.post(change_url(profile), {**data, "name": "b", "active": "on"})
    assert len(ran) == 1
    assert response.status_code == 200
    assert f"Active: you saw False, now True (request {rid} at" in text(response)
    assert response.context["adminform"].form.safeupdates_conflict.fields == ["active"]  # not the name
    assert row(profile)[:2] == ("a", True)


@pytest.mark.django_db(transaction=True)
def test_a_list_editable_row_written_after_its_check_is_refused_by_save(
    admin_client: Client, postgres_only: None
) -> None:
    profile = ProfileFactory(name="a")
    data = form_data(admin_client.get(reverse(CHANGELIST)).content, "changelist-form")
    rid = uuid.uuid4()
    with meanwhile(Profile, lambda instance: queued_and_closed(instance.pk, rid)) as ran:
        response = admin_client.post(
            reverse(CHANGELIST), {**data, "form-0-score": "4", "form-0-active": "on", "_save": "Save"}
        )
    assert len(ran) == 1
    assert response.status_code == 200
    assert f"Active: you saw False, now True (request {rid} at" in text(response)
    assert "Score: " not in text(response)  # changed, but not written since: not the conflict
    assert row(profile)[1:4] == (True, False, 0)


def queued_and_closed(pk: Any, rid: uuid.UUID) -> None:
    from django.db import connection

    try:
        Profile.objects.update_if_newer(pk, version=next_version(), request_id=rid, active=True)
    finally:
        connection.close()


def test_the_change_page_links_to_the_records_request_timeline(admin_client: Client) -> None:
    profile, other = ProfileFactory(), ProfileFactory()
    queued_update(profile, active=True)
    queued_update(other, active=True)
    page = admin_client.get(change_url(profile)).content.decode()
    link = reverse("admin:safeupdates_processedrequest_changelist")
    assert f"{link}?content_type__id__exact=" in page and f"object_id={profile.pk}" in page
    timeline = admin_client.get(
        link, {"content_type__id__exact": ProcessedRequest.objects.first().content_type_id, "object_id": profile.pk}
    )
    assert [r.object_id for r in timeline.context["cl"].result_list] == [str(profile.pk)]


def test_adding_is_not_checked(admin_client: Client) -> None:
    response = admin_client.post(reverse("admin:testapp_profile_add"), {"name": "new", "score": 1, "note": ""})
    assert response.status_code == 302
    assert Profile.objects.get().name == "new"


# -- inlines -----------------------------------------------------------------------------------------------


def test_a_stale_inline_row_is_refused(admin_client: Client) -> None:
    document = DocumentFactory(title="t")
    chapter = Chapter.objects.create(document=document, title="one")
    url = reverse("admin:testapp_document_change", args=[document.pk])
    data = form_data(admin_client.get(url).content, "document_form")
    assert data["chapters-0-safeupdates_token"]
    other = Chapter.objects.get(pk=chapter.pk)
    other.title = "ONE"
    other.save()  # someone else saved the chapter

    data.update({"title": "t2", "chapters-0-title": "one!"})
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "Title: now 'ONE' (a direct save)" in text(response)
    assert Chapter.objects.get(pk=chapter.pk).title == "ONE"
    assert Document.objects.get(pk=document.pk).title == "t"

    # Deleting the stale inline row is refused too.
    data = {**data, "chapters-0-title": "one", "chapters-0-DELETE": "on"}
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert Chapter.objects.filter(pk=chapter.pk).exists()
    assert Document.objects.get(pk=document.pk).title == "t"


def test_an_unchanged_inline_row_that_moved_on_does_not_block_the_parent(admin_client: Client) -> None:
    document = DocumentFactory(title="t")
    chapter = Chapter.objects.create(document=document, title="one")
    url = reverse("admin:testapp_document_change", args=[document.pk])
    data = form_data(admin_client.get(url).content, "document_form")
    Chapter.objects.filter(pk=chapter.pk).update(lock_version=next_version())  # moved, same values
    assert admin_client.post(url, {**data, "title": "t2"}).status_code == 302
    assert Document.objects.get(pk=document.pk).title == "t2"


# -- the changelist: list_editable and actions -------------------------------------------------------------

CHANGELIST = "admin:testapp_profile_changelist"


def test_a_stale_list_editable_row_is_refused(admin_client: Client) -> None:
    stale, fine = ProfileFactory(name="s"), ProfileFactory(name="f")
    data = form_data(admin_client.get(reverse(CHANGELIST)).content, "changelist-form")
    rid = queued_update(stale, active=True)
    prefix = {str(data[f"form-{i}-id"]): f"form-{i}" for i in range(2)}
    data[f"{prefix[str(stale.pk)]}-score"] = "7"
    data[f"{prefix[str(stale.pk)]}-active"] = "on"  # the field the request changed since
    data[f"{prefix[str(fine.pk)]}-score"] = "8"
    before = row(stale), row(fine)

    response = admin_client.post(reverse(CHANGELIST), {**data, "_save": "Save"})
    assert response.status_code == 200
    assert (row(stale), row(fine)) == before  # one transaction: nothing saved
    html = text(response)
    assert f"Active: you saw False, now True (request {rid} at" in html
    assert 'id="safeupdates-conflicts"' in html


def test_a_row_changed_by_someone_else_but_not_edited_saves_nothing_over_it(admin_client: Client) -> None:
    profile, other = ProfileFactory(name="s"), ProfileFactory(name="f")
    data = form_data(admin_client.get(reverse(CHANGELIST)).content, "changelist-form")
    queued_update(profile, active=True)  # not edited in the list, but its form now differs from the row
    version = row(profile)[4]
    response = admin_client.post(reverse(CHANGELIST), {**data, "_save": "Save"})
    # The plain admin would save active=False (the old value) over it; here the person changed nothing
    # of it (against what they were shown): nothing is written, and it is no conflict.
    assert response.status_code == 302
    assert row(profile)[1:] == (True, False, 0, version)
    assert row(other)[:4] == ("f", False, False, 0)


def test_a_fresh_list_editable_row_saves(admin_client: Client) -> None:
    profile = ProfileFactory(name="s")
    data = form_data(admin_client.get(reverse(CHANGELIST)).content, "changelist-form")
    data["form-0-score"] = "9"
    assert admin_client.post(reverse(CHANGELIST), {**data, "_save": "Save"}).status_code == 302
    assert row(profile)[3] == 9


def action_data(client: Client, action: str, *profiles: Profile) -> dict[str, Any]:
    data = form_data(client.get(reverse(CHANGELIST)).content, "changelist-form")
    return {
        "_safeupdates_rows": data["_safeupdates_rows"],
        "action": action,
        "_selected_action": [str(p.pk) for p in profiles],
        "index": "0",
    }


def test_an_action_on_rows_that_moved_on_is_refused(admin_client: Client) -> None:
    moved, kept = ProfileFactory(score=1), ProfileFactory(score=1)
    data = action_data(admin_client, "add_a_point", moved, kept)
    rid = queued_update(moved, score=5)
    response = admin_client.post(reverse(CHANGELIST), data)
    assert response.status_code == 409
    assert f"Score: now 5 (request {rid} at" in text(response)
    assert (row(moved)[3], row(kept)[3]) == (5, 1)  # the action did not run on either

    fresh = action_data(admin_client, "add_a_point", moved, kept)
    assert admin_client.post(reverse(CHANGELIST), fresh).status_code == 302
    assert (row(moved)[3], row(kept)[3]) == (6, 2)


def test_an_action_without_the_rows_versions_is_refused(admin_client: Client) -> None:
    profile = ProfileFactory(score=1)
    data = action_data(admin_client, "add_a_point", profile)
    del data["_safeupdates_rows"]
    response = admin_client.post(reverse(CHANGELIST), data)
    assert response.status_code == 400
    assert "cannot be checked against later changes" in text(response)
    assert row(profile)[3] == 1


def test_the_admin_uses_the_actions_api_of_this_django_without_deprecation_warnings(admin_client: Client) -> None:
    """Django 6.1 passes ``action_location`` to ``get_actions()`` and gives ``Action`` objects, not tuples."""
    profile = ProfileFactory(score=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert admin_client.get(reverse(CHANGELIST)).status_code == 200
        assert admin_client.get(change_url(profile)).status_code == 200
        assert (
            admin_client.post(reverse(CHANGELIST), action_data(admin_client, "add_a_point", profile)).status_code == 302
        )
    assert [str(w.message) for w in caught if "action" in str(w.message).lower()] == []
    assert row(profile)[3] == 2


@pytest.mark.skipif(not hasattr(admin, "ActionLocation"), reason="actions on the change form are new in Django 6.1")
def test_an_action_on_the_change_form_of_a_record_that_moved_on_is_refused(admin_client: Client) -> None:
    profile = ProfileFactory(score=1)

    def action_on_the_form() -> dict[str, Any]:
        data = form_data(admin_client.get(change_url(profile)).content, "profile_form")
        assert "CHANGE_FORM-action" in data  # offered on the change form
        return {**data, "CHANGE_FORM-action": "add_a_point", "_selected_action": str(profile.pk)}

    stale = action_on_the_form()
    rid = queued_update(profile, score=5)
    response = admin_client.post(change_url(profile), stale)
    assert response.status_code == 409
    assert f"Score: now 5 (request {rid} at" in text(response)
    assert row(profile)[3] == 5
    assert admin_client.post(change_url(profile), action_on_the_form()).status_code == 302
    assert row(profile)[3] == 6


def test_delete_selected_of_rows_that_moved_on_is_refused(admin_client: Client) -> None:
    moved, kept = ProfileFactory(), ProfileFactory()
    confirm = admin_client.post(reverse(CHANGELIST), action_data(admin_client, "delete_selected", moved, kept))
    assert confirm.status_code == 200
    data = _confirmation(confirm.content.decode())
    assert data["post"] == "yes" and data["_safeupdates_rows"]
    queued_update(moved, newsletter=True)
    response = admin_client.post(reverse(CHANGELIST), data)
    assert response.status_code == 409
    assert "Newsletter: you saw False, now True" in text(response)
    assert Profile.objects.count() == 2

    confirm = admin_client.post(reverse(CHANGELIST), action_data(admin_client, "delete_selected", moved, kept))
    assert admin_client.post(reverse(CHANGELIST), _confirmation(confirm.content.decode())).status_code == 302
    assert Profile.objects.count() == 0


def _confirmation(html: str) -> dict[str, Any]:
    """The data of the confirmation page's form (the page's first form is the logout button's)."""
    body = html.split('id="content"', 1)[1]
    return form_data(body)


# -- the delete view ---------------------------------------------------------------------------------------


def test_a_stale_delete_is_refused(admin_client: Client) -> None:
    profile = ProfileFactory(name="a")
    url = reverse("admin:testapp_profile_delete", args=[profile.pk])
    data = _confirmation(admin_client.get(url).content.decode())
    assert data["safeupdates_token"]
    rid = queued_update(profile, name="b")
    response = admin_client.post(url, data)
    assert response.status_code == 409
    assert f"Name: now 'b' (request {rid} at" in text(response)
    assert Profile.objects.filter(pk=profile.pk).exists()

    fresh = _confirmation(admin_client.get(url).content.decode())
    assert admin_client.post(url, fresh).status_code == 302
    assert not Profile.objects.filter(pk=profile.pk).exists()


def test_a_delete_without_a_token_is_refused(admin_client: Client) -> None:
    profile = ProfileFactory()
    response = admin_client.post(reverse("admin:testapp_profile_delete", args=[profile.pk]), {"post": "yes"})
    assert response.status_code == 400  # no version token at all: bad input, not a conflict
    assert Profile.objects.filter(pk=profile.pk).exists()


def _forged(kind: str, token: str, profile: Profile) -> str:
    """A delete token never valid for ``profile``, made from ``token``, the one its delete page carries."""
    from django.core import signing

    from safeupdates.conflicts import edit_token

    payload = _token_payload(token)
    signed, signature = token.rsplit(":", 1)
    if kind == "tampered-signature":
        return f"{signed}:{signature[:-1]}{'A' if signature[-1] != 'A' else 'B'}"
    if kind == "another-records-payload":
        return f"{edit_token(ProfileFactory(), []).rsplit(':', 1)[0]}:{signature}"
    if kind == "another-records-token":
        return edit_token(ProfileFactory(), [])
    if kind == "another-models-token":  # a Document of the same key and version
        document = Document.objects.create(pk=profile.pk, title="t")
        Document.objects.filter(pk=document.pk).update(lock_version=profile.lock_version)
        document.refresh_from_db()
        return edit_token(document, [])
    if kind == "another-key":
        return signing.dumps(payload, key="not-the-secret-key", salt="safeupdates.edit-token", compress=True)
    if kind == "another-salt":
        return signing.dumps(payload, salt="safeupdates.etag", compress=True)
    if kind == "unsigned":
        return json.dumps(payload)
    return "not a token"


@pytest.mark.parametrize(
    "kind",
    [
        "tampered-signature",
        "another-records-payload",
        "another-records-token",
        "another-models-token",
        "another-key",
        "another-salt",
        "unsigned",
        "text",
    ],
)
def test_a_forged_delete_token_is_a_400_and_deletes_nothing(admin_client: Client, kind: str) -> None:
    """A token that was never valid for this record is bad input (19.13: a 400, as a missing one), not a
    conflict: nothing is deleted, whether or not the record moved on, and the page names no change."""
    profile = ProfileFactory(name="a")
    url = reverse("admin:testapp_profile_delete", args=[profile.pk])
    data = _confirmation(admin_client.get(url).content.decode())
    forged = {**data, "safeupdates_token": _forged(kind, data["safeupdates_token"], profile)}
    response = admin_client.post(url, forged)
    assert response.status_code == 400
    assert "reload the page" in text(response)
    queued_update(profile, name="b")
    response = admin_client.post(url, forged)
    assert response.status_code == 400
    assert "reload the page" in text(response) and "Name: now" not in text(response)
    assert Profile.objects.filter(pk=profile.pk).exists()


def test_lock_version_is_read_only_whatever_readonly_fields_says(rf: Any) -> None:
    from django.contrib.admin import site

    from safeupdates.admin import SafeUpdateModelAdmin

    class WithOwn(SafeUpdateModelAdmin):
        readonly_fields = ["note"]

    request = rf.get("/")
    assert WithOwn(Profile, site).get_readonly_fields(request) == ["note", "lock_version"]
    assert SafeUpdateModelAdmin(Profile, site).get_readonly_fields(request) == ["lock_version"]


# -- the delete page's token carries versions, not values (issue 19.5) -------------------------------------


def _token_payload(token: str) -> dict[str, Any]:
    from django.core import signing

    return signing.loads(token, salt="safeupdates.edit-token")


def test_the_delete_pages_token_carries_no_value_and_names_only_fields_the_admin_shows(
    admin_client: Client,
) -> None:
    profile = ProfileFactory(name="Ada Lovelace", note="a private note", dark_mode=True)
    url = reverse("admin:testapp_profile_delete", args=[profile.pk])
    payload = _token_payload(_confirmation(admin_client.get(url).content.decode())["safeupdates_token"])
    text_of_token = str(payload)
    assert "Ada" not in text_of_token and "private" not in text_of_token
    names = set(payload.get("d") or payload.get("f") or {})
    assert names == {"name", "active", "newsletter", "score", "note"}  # dark_mode is not on the change form


def test_a_user_who_may_only_delete_learns_no_field_from_a_conflict(client: Client) -> None:
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("deleter", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="delete_profile", content_type__app_label="testapp"))
    client.force_login(user)
    profile = ProfileFactory(name="a", note="before")
    url = reverse("admin:testapp_profile_delete", args=[profile.pk])
    data = _confirmation(client.get(url).content.decode())
    assert set(_token_payload(data["safeupdates_token"]).get("d", {"x": 1})) == set()
    queued_update(profile, note="a secret now")
    response = client.post(url, data)
    assert response.status_code == 409
    assert "secret" not in text(response) and "Note" not in text(response)
    assert Profile.objects.filter(pk=profile.pk).exists()


# -- values that JSON cannot encode (issue 19.8), an admin site of another name ----------------------------

SURFACES = pytest.mark.urls("tests.admin_urls")


@SURFACES
def test_the_change_and_delete_pages_of_files_bytes_and_custom_types(admin_client: Client) -> None:
    from tests.testapp.models import Attachment, Point

    attachment = Attachment.objects.create(title="t", blob=b"\x00\x01", spot=Point(1, 2))  # no file
    change = f"/surfaces/testapp/attachment/{attachment.pk}/change/"
    page = admin_client.get(change)
    assert page.status_code == 200
    data = {**form_data(page.content, "attachment_form"), "_save": "Save"}
    moved = Attachment.objects.get(pk=attachment.pk)
    moved.spot = Point(3, 4)
    moved.save()
    response = admin_client.post(change, {**data, "title": "u", "spot": "7,8"})
    assert response.status_code == 200
    assert "Spot: now 3,4 (a direct save)" in text(response)
    assert Attachment.objects.get(pk=attachment.pk).title == "t"

    delete = f"/surfaces/testapp/attachment/{attachment.pk}/delete/"
    confirmation = admin_client.get(delete)
    assert confirmation.status_code == 200
    assert admin_client.post(delete, _confirmation(confirmation.content.decode())).status_code == 302
    assert not Attachment.objects.exists()


@SURFACES
def test_the_conflict_page_of_a_site_of_another_name_links_within_it(admin_client: Client) -> None:
    from tests.testapp.models import Attachment

    attachment = Attachment.objects.create(title="t")
    changelist = form_data(admin_client.get("/surfaces/testapp/attachment/").content, "changelist-form")
    data = {
        "_safeupdates_rows": changelist["_safeupdates_rows"],
        "action": "delete_selected",
        "_selected_action": [str(attachment.pk)],
        "index": "0",
    }
    Attachment.objects.filter(pk=attachment.pk).update(lock_version=next_version())
    response = admin_client.post("/surfaces/testapp/attachment/", data)
    assert response.status_code == 409
    assert 'href="/surfaces/testapp/attachment/"' in text(response)
    assert Attachment.objects.exists()


# -- "select all N" across pages (issue 19.9) --------------------------------------------------------------


def test_select_all_across_pages_then_delete_selected_deletes_every_row(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.testapp.admin import ProfileAdmin

    monkeypatch.setattr(ProfileAdmin, "list_per_page", 2)
    profiles = [ProfileFactory() for _ in range(3)]
    page = form_data(admin_client.get(reverse(CHANGELIST)).content, "changelist-form")
    shown = list(json.loads(page["_safeupdates_rows"]))
    assert len(shown) == 2 < len(profiles)
    across = {  # the page's rows are ticked, then "Select all 3"
        "_safeupdates_rows": page["_safeupdates_rows"],
        "action": "delete_selected",
        "select_across": "1",
        "_selected_action": shown,
        "index": "0",
    }
    confirm = admin_client.post(reverse(CHANGELIST), across)
    assert confirm.status_code == 200 and "Are you sure" in text(confirm)
    response = admin_client.post(reverse(CHANGELIST), _confirmation(confirm.content.decode()))
    assert response.status_code == 302, text(response)
    assert not Profile.objects.exists()


def test_select_all_across_pages_still_refuses_a_row_shown_that_moved_on(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.testapp.admin import ProfileAdmin

    monkeypatch.setattr(ProfileAdmin, "list_per_page", 2)
    for _ in range(3):
        ProfileFactory()
    page = form_data(admin_client.get(reverse(CHANGELIST)).content, "changelist-form")
    shown = list(json.loads(page["_safeupdates_rows"]))
    data = {
        "_safeupdates_rows": page["_safeupdates_rows"],
        "action": "delete_selected",
        "select_across": "1",
        "_selected_action": shown,
        "index": "0",
    }
    confirm = admin_client.post(reverse(CHANGELIST), data)
    queued_update(Profile.objects.get(pk=shown[0]), newsletter=True)  # shown on the page, then changed
    response = admin_client.post(reverse(CHANGELIST), _confirmation(confirm.content.decode()))
    assert response.status_code == 409
    assert Profile.objects.count() == 3


# -- malformed rows and tokens are refused, never a server error (issue 19.13) -----------------------------


def test_a_token_naming_a_field_removed_since_on_a_record_that_moved_on_is_a_conflict(admin_client: Client) -> None:
    from django.core import signing

    profile = ProfileFactory(score=1)
    data = action_data(admin_client, "add_a_point", profile)
    rows = json.loads(data["_safeupdates_rows"])
    payload = _token_payload(rows[str(profile.pk)])
    payload["d" if "d" in payload else "f"]["removed_since"] = "AAAAAAAA"
    rows[str(profile.pk)] = signing.dumps(payload, salt="safeupdates.edit-token", compress=True)
    queued_update(profile, score=4)
    response = admin_client.post(reverse(CHANGELIST), {**data, "_safeupdates_rows": json.dumps(rows)})
    assert response.status_code == 409
    assert "Score: now 4 (request" in text(response)
    assert row(profile)[3] == 4


NESTED = "[" * 100_000 + "]" * 100_000  # past the JSON parser's depth: RecursionError, not ValueError


@pytest.mark.parametrize(
    "rows",
    ['{"1": 5}', '{"1": ["a"]}', '{"1": null}', '"text"', "[]", "{", "\x00", '{"1": "' + "a" * 5000 + '"}', NESTED],
    ids=["int", "list", "null", "string", "array", "not-json", "nul", "long-token", "nested"],
)
def test_malformed_rows_are_refused(admin_client: Client, rows: str) -> None:
    """Input that was never a valid version token is a 400 (issue 19.13: a form error or a 400), with the
    page that says what to do; 409 is for a record that moved on."""
    profile = ProfileFactory(score=1)
    data = action_data(admin_client, "add_a_point", profile)
    response = admin_client.post(reverse(CHANGELIST), {**data, "_safeupdates_rows": rows.replace("1", str(profile.pk))})
    assert response.status_code == 400
    assert row(profile)[3] == 1
    if not rows.startswith('{"'):  # not rows at all
        assert "cannot be checked against later changes" in text(response)


def test_any_posted_rows_or_token_is_refused_or_checked_never_a_server_error(admin_client: Client) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    profile = ProfileFactory(score=1)
    url = reverse(CHANGELIST)
    delete = reverse("admin:testapp_profile_delete", args=[profile.pk])
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
        max_leaves=10,
    )

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(rows=st.text(max_size=200) | json_values.map(json.dumps), token=st.text(max_size=200))
    def post(rows: str, token: str) -> None:
        action = {"action": "add_a_point", "_selected_action": [str(profile.pk)], "index": "0"}
        # 400: never a version token; 409: a row the page did not show ("{}"), or a token that was once valid.
        assert admin_client.post(url, {**action, "_safeupdates_rows": rows}).status_code in (400, 409)
        # A text never signed for the record is never a version token: 400, never a conflict.
        assert admin_client.post(delete, {"post": "yes", "safeupdates_token": token}).status_code == 400
        assert (
            admin_client.post(
                change_url(profile), {**change_form(admin_client, profile), "name": "x", "safeupdates_token": token}
            ).status_code
            == 200
        )

    post()
    assert row(profile)[0] == profile.name and row(profile)[3] == 1
    assert Profile.objects.filter(pk=profile.pk).exists()


# -- who changed a field comes from versions (issue 20.4) --------------------------------------------------


def test_changed_by_names_a_direct_save_not_an_older_request_with_the_same_value(admin_client: Client) -> None:
    profile = ProfileFactory(active=True)
    data = change_form(admin_client, profile)
    rid = queued_update(profile, active=False)
    for value in (True, False):
        saved = Profile.objects.get(pk=profile.pk)
        saved.active = value
        saved.save()
    response = admin_client.post(change_url(profile), {**{k: v for k, v in data.items() if k != "active"}, "name": "x"})
    assert response.status_code == 200
    html = text(response)
    assert "Active: you saw True, now False (a direct save)" in html
    assert str(rid) not in html
