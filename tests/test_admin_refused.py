"""The admin's 400 page (a delete refused as bad input) quotes no value a write refused: a receiver of the
delete may write a field of another record that the person never sees."""

from __future__ import annotations

import logging
from html import unescape
from typing import Any

import pytest
from django.db.models.signals import pre_delete
from django.test import Client
from django.urls import reverse

from tests.factories import ProfileFactory
from tests.htmlforms import form_data
from tests.testapp.models import Document, Profile

pytestmark = pytest.mark.django_db


def _confirmation(html: str) -> dict[str, Any]:
    return form_data(html.split('id="content"', 1)[1])


def _notes_the_deletion(sender: Any, instance: Profile, **kwargs: Any) -> None:
    """Records the deletion in a Document, with a value no column can hold."""
    note = Document.objects.create(title="deleted")
    note.title = f"secret-7f3a {instance.pk}\ud800"
    note.save()


def test_a_value_a_receiver_could_not_store_is_not_on_the_delete_page(admin_client: Client, caplog) -> None:
    profile = ProfileFactory(name="a")
    url = reverse("admin:testapp_profile_delete", args=[profile.pk])
    data = _confirmation(admin_client.get(url).content.decode())
    pre_delete.connect(_notes_the_deletion, sender=Profile, weak=False)
    try:
        with caplog.at_level(logging.WARNING, logger="safeupdates"):
            response = admin_client.post(url, data)
    finally:
        pre_delete.disconnect(_notes_the_deletion, sender=Profile)
    page = unescape(response.content.decode())
    assert response.status_code == 400
    assert "secret-7f3a" not in page and "testapp.Document" not in page
    assert "a write of its deletion was refused" in page and "nothing was deleted" in page
    assert any("secret-7f3a" in r.getMessage() for r in caplog.records if r.name == "safeupdates")
    assert Profile.objects.filter(pk=profile.pk).exists() and not Document.objects.exists()


def test_a_token_of_a_page_that_showed_more_tells_a_delete_only_user_nothing_more(
    admin_client: Client, client: Client
) -> None:
    """A valid token made by another person's page (a superuser's, which shows the note) posted by a user
    who may delete the record but not view it: the conflict names no field, and no value of one."""
    from django.contrib.auth.models import Permission, User

    profile = ProfileFactory(name="a", note="before")
    url = reverse("admin:testapp_profile_delete", args=[profile.pk])
    wider = _confirmation(admin_client.get(url).content.decode())["safeupdates_token"]
    user = User.objects.create_user("deleter", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="delete_profile", content_type__app_label="testapp"))
    client.force_login(user)
    data = _confirmation(client.get(url).content.decode())
    fresh = Profile.objects.get()
    fresh.note = "secret-7f3a now"
    fresh.save()
    response = client.post(url, {**data, "safeupdates_token": wider})
    page = unescape(response.content.decode())
    assert response.status_code == 409
    assert "secret-7f3a" not in page and "Note" not in page
    assert Profile.objects.filter(pk=profile.pk).exists()


def test_an_action_posted_with_tokens_of_a_page_that_showed_more_tells_only_the_lists_fields(
    admin_client: Client,
) -> None:
    """Row tokens naming fields the list does not show (made by the change page, which shows the note):
    the action's conflict page names only the list's fields."""
    import json

    from safeupdates.conflicts import edit_token

    profile = ProfileFactory(name="a", note="before")
    wider = edit_token(profile, ["name", "active", "note"])
    fresh = Profile.objects.get()
    fresh.note, fresh.name = "secret-7f3a now", "b"
    fresh.save()
    response = admin_client.post(
        reverse("admin:testapp_profile_changelist"),
        {
            "action": "delete_selected",
            "_selected_action": [profile.pk],
            "_safeupdates_rows": json.dumps({str(profile.pk): wider}),
        },
    )
    page = unescape(response.content.decode())
    assert response.status_code == 409
    assert "Name" in page  # the list shows it
    assert "secret-7f3a" not in page and "Note" not in page
