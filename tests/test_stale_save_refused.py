"""``stale_save_refused``: one signal per refused write, from every place that refuses one.

``save()`` and ``delete()`` signal every refusal of theirs (``StaleObjectError``, ``NeverLoadedError``);
a surface signals the refusals it decides before any save (an old edit token, an If-Match naming an
older version). Within a surface's request a record's refusal is signalled once, under the surface's
name, also when a write that landed after the surface's check makes the save refuse it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from html import unescape
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.signals import post_delete
from django.test import Client
from django.urls import reverse

from safeupdates import signals
from safeupdates.exceptions import NeverLoadedError, StaleObjectError
from safeupdates.http import etag_for
from safeupdates.versions import next_version
from tests import drf_urls, http_urls
from tests.factories import DocumentFactory, ProfileFactory
from tests.htmlforms import form_data
from tests.testapp.models import Chapter, Document, Profile, Restaurant
from tests.workers import meanwhile

#: The fields a full save of a Profile writes (the versions aside).
PROFILE_FIELDS = ("active", "dark_mode", "last_synced_at", "name", "newsletter", "note", "score")


@pytest.fixture
def raising_receiver(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A receiver of ``stale_save_refused`` that raises: logged (``django.dispatch``), nothing else."""

    def raises(**kwargs: Any) -> None:
        raise RuntimeError("a receiver that raises")

    signals.stale_save_refused.connect(raises, weak=False, dispatch_uid="tests.raises")
    with caplog.at_level(logging.ERROR, logger="django.dispatch"):
        yield
    signals.stale_save_refused.disconnect(dispatch_uid="tests.raises")
    logged = [r for r in caplog.get_records("call") if r.exc_info and "a receiver that raises" in str(r.exc_info[1])]
    assert logged, "the receiver's error was not logged"


def sent(model: Any, pk: Any, version: int | None, fields: tuple[str, ...], surface: str) -> dict[str, Any]:
    return {"sender": model, "pk": pk, "version": version, "fields": fields, "surface": surface, "using": "default"}


def moved_on(profile: Profile) -> uuid.UUID:
    """Another writer's request applied to the row after ``profile`` was loaded or shown."""
    rid = uuid.uuid4()
    assert Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True).applied
    return rid


# -- save() and delete() ------------------------------------------------------------------------------------


@pytest.mark.django_db
class TestSaveAndDelete:
    def test_a_stale_save(self, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory(name="a")
        stale = Profile.objects.get(pk=profile.pk)
        moved_on(profile)
        stale.name = "b"
        with pytest.raises(StaleObjectError):
            stale.save()
        assert refused == [sent(Profile, profile.pk, profile.lock_version, PROFILE_FIELDS, "save")]
        stale.active = False
        with pytest.raises(StaleObjectError):
            stale.save(update_fields=["active"])  # the field the request wrote (checked per field)
        assert refused[1:] == [sent(Profile, profile.pk, profile.lock_version, ("active",), "save")]

    def test_a_save_of_a_row_deleted_since(self, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory()
        Profile.objects.filter(pk=profile.pk).delete()
        with pytest.raises(StaleObjectError) as raised:
            profile.save()
        assert str(raised.value) == (
            f"testapp.Profile pk={profile.pk!r} was deleted after it was loaded; save(force_insert=True) "
            "creates it again, if that is what you mean."
        )
        assert refused == [sent(Profile, profile.pk, profile.lock_version, PROFILE_FIELDS, "save")]

    def test_a_new_instance_over_a_row_it_never_loaded(self, refused: list[dict[str, Any]]) -> None:
        """It had no version: ``version`` is None."""
        profile = ProfileFactory()
        with pytest.raises(NeverLoadedError):
            Profile(pk=profile.pk, name="x").save()
        with pytest.raises(NeverLoadedError):
            Profile(pk=profile.pk, name="x").save(force_update=True)
        assert refused == 2 * [sent(Profile, profile.pk, None, PROFILE_FIELDS, "save")]

    def test_a_stale_save_of_a_childs_fields(self, refused: list[dict[str, Any]]) -> None:
        restaurant = Restaurant.objects.create(name="a")
        stale = Restaurant.objects.get(pk=restaurant.pk)
        restaurant.save()
        stale.seats = 3
        with pytest.raises(StaleObjectError):
            stale.save(update_fields=["seats"])
        assert refused == [sent(Restaurant, restaurant.pk, stale.lock_version, ("seats",), "save")]

    def test_a_stale_delete_alone_with_cascades_and_watched(self, refused: list[dict[str, Any]]) -> None:
        """The three ways a delete is checked: its one DELETE, in the collector's, after a lock."""
        seen: list[Any] = []
        for cascades, watched in ((False, False), (True, False), (True, True)):
            document = DocumentFactory()
            if cascades:
                Chapter.objects.create(document=document, title="c")
            stale = Document.objects.get(pk=document.pk)
            document.save()
            if watched:
                post_delete.connect(seen.append, sender=Chapter, weak=False, dispatch_uid="tests.watched")
            try:
                with pytest.raises(StaleObjectError):
                    stale.delete()
            finally:
                post_delete.disconnect(sender=Chapter, dispatch_uid="tests.watched")
            assert refused[-1] == sent(Document, document.pk, stale.lock_version, (), "delete")
        assert len(refused) == 3 and seen == []

    def test_accepted_writes_send_nothing(self, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory()
        profile.name = "b"
        profile.save()
        profile.save(update_fields=["name"])
        Profile(pk=10**9, name="new").save()
        profile.delete()
        assert refused == []

    def test_in_a_transaction_at_once_and_the_transaction_stays_usable(self, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory()
        stale = Profile.objects.get(pk=profile.pk)
        with transaction.atomic():
            profile.save()
            with pytest.raises(StaleObjectError):
                stale.save()
            assert len(refused) == 1  # sent at once: a refusal writes nothing to commit
            ProfileFactory(name="after")
        assert Profile.objects.filter(name="after").exists()

    def test_a_receiver_that_raises_changes_nothing(
        self, refused: list[dict[str, Any]], raising_receiver: None
    ) -> None:
        profile = ProfileFactory(name="a")
        stale = Profile.objects.get(pk=profile.pk)
        moved_on(profile)
        stale.name = "b"
        with pytest.raises(StaleObjectError):
            stale.save()
        with pytest.raises(StaleObjectError):
            stale.delete()
        assert len(refused) == 2  # the other receivers still ran
        assert (stale.name, stale.lock_version) == ("b", profile.lock_version)  # as before the save
        assert Profile.objects.get(pk=profile.pk).name == "a"


# -- the model form and its view ----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls("tests.forms_views")
class TestForm:
    FIELDS = ("active", "name", "score")  # ProfileForm's

    def test_a_stale_form(self, client: Client, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory(name="a")
        data = form_data(client.get(f"/profiles/{profile.pk}/").content, "profile")
        moved_on(profile)
        assert client.post(f"/profiles/{profile.pk}/", {**data, "name": "b", "active": "on"}).status_code == 200
        assert refused == [sent(Profile, profile.pk, profile.lock_version, self.FIELDS, "form")]

    def test_a_write_between_the_check_and_the_save_is_one_refusal(
        self, client: Client, refused: list[dict[str, Any]]
    ) -> None:
        """The save refuses it, and the form checked again says why: one signal."""
        profile = ProfileFactory(name="a")
        data = form_data(client.get(f"/raced/{profile.pk}/").content, "profile")
        response = client.post(f"/raced/{profile.pk}/", {**data, "name": "b", "active": "on"})
        assert response.status_code == 200 and "Active" in unescape(response.content.decode())
        # The save's refusal: it wrote only the fields the person changed.
        assert refused == [sent(Profile, profile.pk, profile.lock_version, ("active", "name"), "form")]

    def test_a_receiver_that_raises_changes_nothing(self, client: Client, raising_receiver: None) -> None:
        profile = ProfileFactory(name="a")
        data = form_data(client.get(f"/profiles/{profile.pk}/").content, "profile")
        moved_on(profile)
        response = client.post(f"/profiles/{profile.pk}/", {**data, "name": "b", "active": "on"})
        assert response.status_code == 200 and "Active" in unescape(response.content.decode())
        assert Profile.objects.get(pk=profile.pk).name == "a"

    def test_a_fresh_form_and_a_forged_token_send_nothing(self, client: Client, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory(name="a")
        data = form_data(client.get(f"/profiles/{profile.pk}/").content, "profile")
        assert client.post(f"/profiles/{profile.pk}/", {**data, "safeupdates_token": "forged"}).status_code == 200
        assert client.post(f"/profiles/{profile.pk}/", {**data, "name": "b"}).status_code == 302
        assert refused == []


# -- the admin ----------------------------------------------------------------------------------------------

CHANGELIST = "admin:testapp_profile_changelist"


def change_url(profile: Profile) -> str:
    return reverse("admin:testapp_profile_change", args=[profile.pk])


#: The fields of ProfileAdmin's change form.
ADMIN_FIELDS = ("active", "name", "newsletter", "note", "score")


@pytest.mark.django_db
class TestAdmin:
    def test_a_stale_change_form(self, admin_client: Client, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory(name="a")
        data = {**form_data(admin_client.get(change_url(profile)).content, "profile_form"), "_save": "Save"}
        moved_on(profile)
        assert admin_client.post(change_url(profile), {**data, "name": "b", "active": "on"}).status_code == 200
        assert refused == [sent(Profile, profile.pk, profile.lock_version, ADMIN_FIELDS, "admin")]

    def test_a_stale_inline_row(self, admin_client: Client, refused: list[dict[str, Any]]) -> None:
        document = DocumentFactory(title="t")
        chapter = Chapter.objects.create(document=document, title="one")
        url = reverse("admin:testapp_document_change", args=[document.pk])
        data = form_data(admin_client.get(url).content, "document_form")
        Chapter.objects.get(pk=chapter.pk).save()
        assert admin_client.post(url, {**data, "chapters-0-title": "one!"}).status_code == 200
        assert refused == [sent(Chapter, chapter.pk, chapter.lock_version, ("document", "title"), "admin")]

    def test_stale_list_editable_rows_one_each(self, admin_client: Client, refused: list[dict[str, Any]]) -> None:
        first, second, fine = ProfileFactory(name="1"), ProfileFactory(name="2"), ProfileFactory(name="3")
        data = form_data(admin_client.get(reverse(CHANGELIST)).content, "changelist-form")
        moved_on(first)
        moved_on(second)
        prefix = {data[f"form-{i}-id"]: f"form-{i}" for i in range(3)}
        for profile in (first, second, fine):
            data[f"{prefix[str(profile.pk)]}-score"] = "7"
            data[f"{prefix[str(profile.pk)]}-active"] = "on"  # the field moved_on() wrote
        assert admin_client.post(reverse(CHANGELIST), {**data, "_save": "Save"}).status_code == 200
        assert sorted(refused, key=lambda kwargs: kwargs["pk"]) == [
            sent(Profile, profile.pk, profile.lock_version, ("active", "score"), "admin") for profile in (first, second)
        ]

    def test_an_action_on_a_row_that_moved_on(self, admin_client: Client, refused: list[dict[str, Any]]) -> None:
        moved, kept = ProfileFactory(), ProfileFactory()
        data = form_data(admin_client.get(reverse(CHANGELIST)).content, "changelist-form")
        action = {
            "_safeupdates_rows": data["_safeupdates_rows"],
            "action": "add_a_point",
            "_selected_action": [str(moved.pk), str(kept.pk)],
            "index": "0",
        }
        moved_on(moved)
        assert admin_client.post(reverse(CHANGELIST), action).status_code == 409
        assert refused == [sent(Profile, moved.pk, moved.lock_version, (), "admin")]

    def test_a_stale_delete_page(self, admin_client: Client, refused: list[dict[str, Any]]) -> None:
        """The page's delete() refuses it: one signal, under the admin's name."""
        profile = ProfileFactory()
        url = reverse("admin:testapp_profile_delete", args=[profile.pk])
        data = form_data(admin_client.get(url).content.decode().split('id="content"', 1)[1])
        moved_on(profile)
        assert admin_client.post(url, data).status_code == 409
        assert refused == [sent(Profile, profile.pk, profile.lock_version, (), "admin")]

    def test_a_receiver_that_raises_changes_nothing(self, admin_client: Client, raising_receiver: None) -> None:
        profile = ProfileFactory(name="a")
        data = {**form_data(admin_client.get(change_url(profile)).content, "profile_form"), "_save": "Save"}
        moved_on(profile)
        response = admin_client.post(change_url(profile), {**data, "name": "b", "active": "on"})
        assert response.status_code == 200 and 'id="safeupdates-conflicts"' in response.content.decode()
        assert Profile.objects.get(pk=profile.pk).name == "a"

    def test_accepted_edits_send_nothing(self, admin_client: Client, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory(name="a")
        data = {**form_data(admin_client.get(change_url(profile)).content, "profile_form"), "_save": "Save"}
        assert admin_client.post(change_url(profile), {**data, "name": "b"}).status_code == 302
        data = form_data(admin_client.get(reverse(CHANGELIST)).content, "changelist-form")
        assert admin_client.post(reverse(CHANGELIST), {**data, "form-0-score": "3", "_save": "Save"}).status_code == 302
        assert refused == []


@pytest.mark.django_db(transaction=True)
def test_an_admin_save_refused_after_the_forms_check_is_one_refusal(
    admin_client: Client, refused: list[dict[str, Any]], postgres_only: None
) -> None:
    """Another connection commits a write between the form's check and the save: the save refuses it,
    the admin shows the form again and its check says why. One signal, the admin's."""
    profile = ProfileFactory(name="a")
    data = {**form_data(admin_client.get(change_url(profile)).content, "profile_form"), "_save": "Save"}
    with meanwhile(Profile, lambda _instance: (moved_on(profile), connection.close())) as ran:
        assert admin_client.post(change_url(profile), {**data, "name": "b", "active": "on"}).status_code == 200
    assert len(ran) == 1
    # The save's refusal (it writes the fields the person changed), named after the admin; the form's
    # second look is silent.
    assert refused == [sent(Profile, profile.pk, profile.lock_version, ("active", "name"), "admin")]


@pytest.mark.django_db(transaction=True)
def test_a_stale_delete_with_cascades_in_autocommit_is_one_refusal(refused: list[dict[str, Any]]) -> None:
    """Outside a transaction the check rides in the collector's DELETE of the row: the refusal names
    the row, and is signalled once, after the transaction that deleted its chapters rolled back."""
    document = DocumentFactory()
    Chapter.objects.create(document=document, title="c")
    stale = Document.objects.get(pk=document.pk)
    document.save()
    with pytest.raises(StaleObjectError) as raised:
        stale.delete()
    assert str(raised.value) == (
        f"testapp.Document pk={document.pk!r} was changed after it was loaded (lock_version "
        f"{stale.lock_version}); reload it and decide again before deleting it."
    )
    assert refused == [sent(Document, document.pk, stale.lock_version, (), "delete")]
    assert Chapter.objects.filter(document=document).count() == 1


# -- HTTP: If-Match ----------------------------------------------------------------------------------------


def put(client: Client, url: str, data: dict[str, Any], **headers: Any) -> Any:
    return client.put(url, json.dumps(data), content_type="application/json", headers=headers)


@pytest.mark.django_db
@pytest.mark.urls("tests.http_urls")
class TestHTTP:
    @pytest.fixture(autouse=True)
    def no_hooks(self) -> Iterator[None]:
        http_urls.BETWEEN_READ_AND_WRITE.clear()
        yield
        http_urls.BETWEEN_READ_AND_WRITE.clear()

    @pytest.mark.parametrize("url", ["/profiles/{}/", "/cbv/{}/"])
    def test_an_if_match_of_an_older_version(self, client: Client, refused: list[dict[str, Any]], url: str) -> None:
        profile = ProfileFactory(name="a")
        old = etag_for(profile)
        moved_on(profile)
        assert put(client, url.format(profile.pk), {"name": "b"}, if_match=old).status_code == 412
        assert client.delete(url.format(profile.pk), headers={"if_match": old}).status_code == 412
        assert refused == 2 * [sent(Profile, profile.pk, profile.lock_version, (), "http")]

    @pytest.mark.parametrize("if_match", [True, False], ids=["412", "409"])
    def test_a_write_lost_between_the_views_read_and_its_write(
        self, client: Client, refused: list[dict[str, Any]], if_match: bool
    ) -> None:
        """The save refuses it: one signal, under the name of the surface that ran it."""
        profile = ProfileFactory(name="a")
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: moved_on(profile))
        headers = {"if_match": etag_for(profile)} if if_match else {}
        response = put(client, f"/profiles/{profile.pk}/", {"name": "b"}, **headers)
        assert response.status_code == (412 if if_match else 409)
        assert refused == [sent(Profile, profile.pk, profile.lock_version, PROFILE_FIELDS, "http")]

    def test_a_receiver_that_raises_changes_nothing(self, client: Client, raising_receiver: None) -> None:
        profile = ProfileFactory(name="a")
        old = etag_for(profile)
        moved_on(profile)
        response = put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match=old)
        assert response.status_code == 412 and [c["field"] for c in response.json()["changes"]] == ["active"]
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: moved_on(profile))
        assert put(client, f"/profiles/{profile.pk}/", {"name": "b"}).status_code == 409
        assert Profile.objects.get(pk=profile.pk).name == "a"

    def test_accepted_and_other_412s_send_nothing(self, client: Client, refused: list[dict[str, Any]]) -> None:
        profile, other = ProfileFactory(name="a"), ProfileFactory(name="o")
        assert put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match=etag_for(other)).status_code == 412
        assert put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match='W/"1.x"').status_code == 412
        assert put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match=etag_for(profile)).status_code == 200
        assert refused == []


# -- Django REST framework ---------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls("tests.drf_urls")
class TestDRF:
    @pytest.fixture(autouse=True)
    def api(self) -> Iterator[Any]:
        pytest.importorskip("rest_framework", reason="Django REST framework is not installed")
        from rest_framework.test import APIClient

        drf_urls.BETWEEN_READ_AND_WRITE.clear()
        yield APIClient()
        drf_urls.BETWEEN_READ_AND_WRITE.clear()

    def test_an_if_match_of_an_older_version(self, api: Any, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory(name="a")
        old = etag_for(profile, ["name", "active"])
        moved_on(profile)
        assert (
            api.patch(f"/profiles/{profile.pk}/", {"name": "b"}, "json", headers={"if_match": old}).status_code == 412
        )
        assert refused == [sent(Profile, profile.pk, profile.lock_version, (), "drf")]

    def test_a_stale_lock_version_in_the_body(self, api: Any, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory(name="a")
        moved_on(profile)
        body = {"name": "b", "lock_version": profile.lock_version}
        assert api.put(f"/profiles/{profile.pk}/", body, "json").status_code == 409
        assert refused == [sent(Profile, profile.pk, profile.lock_version, PROFILE_FIELDS, "drf")]

    def test_a_patch_of_a_field_written_since(self, api: Any, refused: list[dict[str, Any]]) -> None:
        """Checked per field, refused before any save: the fields the PATCH would write."""
        profile = ProfileFactory(name="a")
        moved_on(profile)
        body = {"name": "b", "active": False, "lock_version": profile.lock_version}
        assert api.patch(f"/profiles/{profile.pk}/", body, "json").status_code == 409
        assert refused == [sent(Profile, profile.pk, profile.lock_version, ("active", "name"), "drf")]

    def test_a_receiver_that_raises_changes_nothing(self, api: Any, raising_receiver: None) -> None:
        profile = ProfileFactory(name="a")
        moved_on(profile)
        body = {"name": "b", "active": False, "lock_version": profile.lock_version}
        assert api.patch(f"/profiles/{profile.pk}/", body, "json").status_code == 409
        assert Profile.objects.get(pk=profile.pk).name == "a"

    def test_accepted_writes_send_nothing(self, api: Any, refused: list[dict[str, Any]]) -> None:
        profile = ProfileFactory(name="a")
        body = {"name": "b", "lock_version": profile.lock_version}
        assert api.patch(f"/profiles/{profile.pk}/", body, "json").status_code == 200
        assert refused == []
