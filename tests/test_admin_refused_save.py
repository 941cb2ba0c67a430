"""A value the save refuses (``InvalidUpdate``: a NUL character, an integer out of its column's range) set
by a ``save_model()`` override or an action: the admin re-shows the page with an error, writes nothing,
and names a field, with its problem, only if the page shows it; the value itself goes to the server's log.
A URLconf of its own (``pytest.mark.urls``): an admin site whose ``Profile`` admin spoils what it saves.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from html import unescape
from typing import Any

import pytest
from django.contrib import admin
from django.http import HttpRequest
from django.test import Client
from django.urls import path, reverse

from safeupdates.admin import SafeUpdateModelAdmin
from tests.factories import DocumentFactory, ProfileFactory
from tests.htmlforms import form_data
from tests.testapp.models import Chapter, Document, Profile

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

SECRET = "secret-7f3a"
GENERIC = "could not be stored (the server's log says which)"
OUT_OF_RANGE = "testapp.Profile.score is out of range"

#: What the admin below sets, by the start of the record's name: a value its column cannot hold, in the
#: note (a field no page of this admin shows) or in the score (on the change form and in the list).
SPOILERS: dict[str, Callable[[Profile], None]] = {
    "hide": lambda obj: setattr(obj, "note", f"{SECRET}\x00"),
    "range": lambda obj: setattr(obj, "score", 2**40),
}


def _spoil(obj: Profile) -> None:
    for start, spoil in SPOILERS.items():
        if obj.name.startswith(start):
            spoil(obj)


site = admin.AdminSite(name="admin")


@admin.register(Profile, site=site)
class SpoilingProfileAdmin(SafeUpdateModelAdmin):
    fields = ["name", "active", "score"]
    list_display = ["name", "active", "score"]
    list_editable = ["active", "score"]
    actions = ["activate"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        _spoil(obj)
        super().save_model(request, obj, form, change)

    @admin.action(description="Activate")
    def activate(self, request: HttpRequest, queryset: Any) -> None:
        for profile in queryset:
            profile.active = True
            _spoil(profile)
            profile.save()


class ChapterInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Chapter
    extra = 0


@admin.register(Document, site=site)
class SpoilingDocumentAdmin(SafeUpdateModelAdmin):
    """Its ``save_formset()`` stamps each chapter with a value no column can hold."""

    fields = ["title"]
    inlines = [ChapterInline]

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        for chapter in formset.save(commit=False):
            chapter.title = f"{chapter.title} {SECRET}\x00"
            chapter.save()
        formset.save_m2m()


urlpatterns = [path("admin/", site.urls)]


def _page(response: Any) -> str:
    return unescape(response.content.decode())


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "safeupdates")


def _change(client: Client, profile: Profile, caplog: pytest.LogCaptureFixture, **edits: str) -> Any:
    url = reverse("admin:testapp_profile_change", args=[profile.pk])
    data = {**form_data(client.get(url).content, "profile_form"), **edits, "_save": "Save"}
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        return client.post(url, data)


def test_a_value_of_a_hidden_field_set_by_save_model_is_a_form_error(admin_client: Client, caplog) -> None:
    profile = ProfileFactory(name="hide me", note="before")
    response = _change(admin_client, profile, caplog, name="hide me too", active="on")
    page = _page(response)
    assert response.status_code == 200
    assert GENERIC in page and "nothing was saved" in page
    assert SECRET not in page and "Profile.note" not in page
    assert 'value="hide me too"' in page  # the form is shown again with what was typed
    assert SECRET in _logged(caplog)  # for the operator
    fresh = Profile.objects.get(pk=profile.pk)
    assert (fresh.name, fresh.active, fresh.note, fresh.lock_version) == (
        "hide me",
        False,
        "before",
        profile.lock_version,
    )


def test_a_value_of_a_shown_field_set_by_save_model_names_the_field(admin_client: Client, caplog) -> None:
    profile = ProfileFactory(name="range", score=3)
    response = _change(admin_client, profile, caplog, score="4")
    page = _page(response)
    assert response.status_code == 200
    assert OUT_OF_RANGE in page and str(2**40) not in page
    assert Profile.objects.get(pk=profile.pk).score == 3


def test_the_add_form_creates_nothing(admin_client: Client, caplog) -> None:
    url = reverse("admin:testapp_profile_add")
    data = {**form_data(admin_client.get(url).content, "profile_form"), "name": "hide new", "_save": "Save"}
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        response = admin_client.post(url, data)
    page = _page(response)
    assert response.status_code == 200
    assert GENERIC in page and SECRET not in page
    assert not Profile.objects.exists()


def _list_save(client: Client, caplog: pytest.LogCaptureFixture, **edits: str) -> Any:
    url = reverse("admin:testapp_profile_changelist")
    data = {**form_data(client.get(url).content, "changelist-form"), **edits, "_save": "Save"}
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        return client.post(url, data)


def test_a_list_editable_save_shows_the_refusal_on_its_row(admin_client: Client, caplog) -> None:
    hidden, ranged = ProfileFactory(name="hide me"), ProfileFactory(name="range", score=3)
    plain = ProfileFactory(name="plain")
    rows = {
        form_data(admin_client.get(reverse("admin:testapp_profile_changelist")).content, "changelist-form")[
            f"form-{i}-id"
        ]: i
        for i in range(3)
    }
    edits = {f"form-{rows[str(p.pk)]}-active": "on" for p in (hidden, plain)}
    response = _list_save(admin_client, caplog, **edits)
    page = _page(response)
    assert response.status_code == 200
    assert GENERIC in page and SECRET not in page and "Profile.note" not in page
    assert not Profile.objects.filter(active=True).exists()  # the plain row neither: one transaction
    response = _list_save(admin_client, caplog, **{f"form-{rows[str(ranged.pk)]}-score": "4"})
    page = _page(response)
    assert response.status_code == 200
    assert OUT_OF_RANGE in page and str(2**40) not in page
    assert Profile.objects.get(pk=ranged.pk).score == 3


def test_an_action_that_sets_a_refused_value_says_so_and_writes_nothing(admin_client: Client, caplog) -> None:
    from safeupdates.conflicts import edit_token

    profiles = [ProfileFactory(name="plain"), ProfileFactory(name="hide me")]
    url = reverse("admin:testapp_profile_changelist")
    listed = ["name", "active", "score"]
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        response = admin_client.post(
            url,
            {
                "action": "activate",
                "_selected_action": [p.pk for p in profiles],
                "_safeupdates_rows": json.dumps({str(p.pk): edit_token(p, listed) for p in profiles}),
            },
            follow=True,
        )
    page = _page(response)
    assert response.status_code == 200
    assert GENERIC in page and SECRET not in page
    assert SECRET in _logged(caplog)
    assert not Profile.objects.filter(active=True).exists()


def test_a_value_set_by_save_formset_in_an_inline_is_a_form_error(admin_client: Client, caplog) -> None:
    document = DocumentFactory(title="before")
    chapter = Chapter.objects.create(document=document, title="one")
    url = reverse("admin:testapp_document_change", args=[document.pk])
    data = {**form_data(admin_client.get(url).content, "document_form"), "title": "after", "_save": "Save"}
    data["chapters-0-title"] = "two"
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        response = admin_client.post(url, data)
    page = _page(response)
    assert response.status_code == 200
    assert GENERIC in page and SECRET not in page
    assert Document.objects.get(pk=document.pk).title == "before"
    assert Chapter.objects.get(pk=chapter.pk).title == "one"


def _notes_the_deletion(sender: Any, instance: Profile, **kwargs: Any) -> None:
    """Records the deletion in a Document, with a value no column can hold."""
    note = Document.objects.create(title="deleted")
    note.title = f"{SECRET} {instance.pk}\x00"
    note.save()


def test_delete_selected_whose_receiver_sets_a_refused_value_deletes_nothing(admin_client: Client, caplog) -> None:
    from django.db.models.signals import pre_delete

    from safeupdates.conflicts import edit_token

    profile = ProfileFactory(name="plain")
    url = reverse("admin:testapp_profile_changelist")
    data = {
        "action": "delete_selected",
        "_selected_action": [profile.pk],
        "_safeupdates_rows": json.dumps({str(profile.pk): edit_token(profile, ["name", "active", "score"])}),
        "post": "yes",
    }
    pre_delete.connect(_notes_the_deletion, sender=Profile, weak=False)
    try:
        with caplog.at_level(logging.WARNING, logger="safeupdates"):
            response = admin_client.post(url, data, follow=True)
    finally:
        pre_delete.disconnect(_notes_the_deletion, sender=Profile)
    page = _page(response)
    assert response.status_code == 200
    assert GENERIC in page and SECRET not in page and "testapp.Document" not in page
    assert Profile.objects.filter(pk=profile.pk).exists() and not Document.objects.exists()
