"""The demo's Profile admin: read-only ``lock_version``, a link to the profile's requests, stale forms refused."""

from __future__ import annotations

from html import unescape
from typing import Any

import pytest
from django.apps import apps

if not apps.is_installed("demo_project.toggles"):
    pytest.skip(
        "the demo app is not installed: add 'demo_project.toggles' to INSTALLED_APPS in tests/settings.py",
        allow_module_level=True,
    )

from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import reverse

from demo_project.toggles.factories import ProfileFactory, UserFactory
from demo_project.toggles.models import Profile
from safeupdates import enqueue_update
from safeupdates.conflicts import read_edit_token
from safeupdates.jobs import apply_update
from safeupdates.models import ProcessedRequest
from tests.htmlforms import form_data

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_user_client(client: Client) -> Client:
    client.force_login(UserFactory.superuser(username="boss"))
    return client


def test_changelist_links_each_profile_to_its_requests(admin_user_client: Client) -> None:
    profile, other = ProfileFactory(), ProfileFactory()
    enqueue_update(profile, active=True)
    enqueue_update(profile, newsletter=True)
    enqueue_update(other, active=True)

    changelist = admin_user_client.get(reverse("admin:toggles_profile_changelist"))
    assert changelist.status_code == 200
    content_type = ContentType.objects.get_for_model(Profile)
    link = (
        f"{reverse('admin:safeupdates_processedrequest_changelist')}"
        f"?content_type__id__exact={content_type.pk}&amp;object_id={profile.pk}"
    )
    html = changelist.content.decode()
    assert f'<a href="{link}">2 requests</a>' in html
    assert "lock version" in html.lower()

    requests = admin_user_client.get(link.replace("&amp;", "&"))
    assert requests.status_code == 200
    listed = list(requests.context["cl"].result_list)
    assert {r.object_id for r in listed} == {str(profile.pk)}
    assert len(listed) == 2


def test_lock_version_is_read_only(admin_user_client: Client) -> None:
    profile = ProfileFactory()
    page = admin_user_client.get(reverse("admin:toggles_profile_change", args=[profile.pk]))
    assert page.status_code == 200
    form = page.context["adminform"].form
    assert "lock_version" not in form.fields
    assert "lock_version" in page.context["adminform"].readonly_fields
    assert read_edit_token(form["safeupdates_token"].value(), profile)[0] == profile.lock_version


def _opened(client: Client, profile: Profile) -> dict[str, Any]:
    return form_data(client.get(reverse("admin:toggles_profile_change", args=[profile.pk])).content, "profile_form")


def test_saving_a_form_opened_before_a_queued_update_is_refused(admin_user_client: Client) -> None:
    profile = ProfileFactory()
    opened = _opened(admin_user_client, profile)
    # A worker applies a request after the admin opened the form.
    request = enqueue_update(profile, active=True)
    apply_update(str(request.request_id))

    url = reverse("admin:toggles_profile_change", args=[profile.pk])
    stale = admin_user_client.post(url, {**opened, "active": "on", "newsletter": "on"})  # active: the same field
    assert stale.status_code == 200
    page = unescape(stale.content.decode())
    assert f"Active: you saw False, now True (request {request.request_id} at" in page
    assert "Newsletter: " not in page  # not written since: no conflict
    profile.refresh_from_db()
    assert (profile.active, profile.newsletter) == (True, False)

    fresh = admin_user_client.post(url, {**_opened(admin_user_client, profile), "newsletter": "on"})
    assert fresh.status_code == 302
    profile.refresh_from_db()
    assert (profile.active, profile.newsletter) == (True, True)


def test_saving_another_field_of_a_form_opened_before_a_queued_update_keeps_both(admin_user_client: Client) -> None:
    profile = ProfileFactory()
    opened = _opened(admin_user_client, profile)
    request = enqueue_update(profile, active=True)
    apply_update(str(request.request_id))

    url = reverse("admin:toggles_profile_change", args=[profile.pk])
    assert admin_user_client.post(url, {**opened, "newsletter": "on"}).status_code == 302
    profile.refresh_from_db()
    assert (profile.active, profile.newsletter) == (True, True)  # the toggle is not undone


def test_request_log_is_filterable_by_status(admin_user_client: Client) -> None:
    profile = ProfileFactory()
    enqueue_update(profile, active=True)
    url = reverse("admin:safeupdates_processedrequest_changelist")
    assert len(admin_user_client.get(url, {"status__exact": "pending"}).context["cl"].result_list) == 1
    assert len(admin_user_client.get(url, {"status__exact": "applied"}).context["cl"].result_list) == 0
    assert ProcessedRequest.objects.count() == 1
