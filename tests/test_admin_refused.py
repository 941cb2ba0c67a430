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
