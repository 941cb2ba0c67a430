from __future__ import annotations

import pytest
from django.contrib.admin import site
from django.contrib.contenttypes.models import ContentType
from django.urls import reverse

from safeupdates.admin import ProcessedRequestAdmin
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.testapp.models import Gadget, Profile

pytestmark = pytest.mark.django_db


@pytest.fixture
def recorded():
    profile = ProfileFactory()
    Profile.objects.update_if_newer(
        profile.pk, version=next_version(), request_id="6f1c1b4e-8a4e-4a55-9f41-6b1f0e1c2d3a", active=True
    )
    return profile, ProcessedRequest.objects.get()


def test_changelist_lists_filters_and_searches(admin_client, recorded):
    profile, request = recorded
    url = reverse("admin:safeupdates_processedrequest_changelist")
    page = admin_client.get(url).content.decode()
    assert str(request.request_id) in page
    assert reverse("admin:testapp_profile_change", args=[profile.pk]) in page  # link to the target
    assert admin_client.get(url, {"status__exact": "applied"}).content.decode().count(str(request.request_id)) >= 1
    assert str(request.request_id) not in admin_client.get(url, {"status__exact": "pending"}).content.decode()
    assert str(request.request_id) in admin_client.get(url, {"q": str(request.request_id)}).content.decode()
    assert (
        str(request.request_id)
        not in admin_client.get(url, {"q": "00000000-0000-0000-0000-000000000000"}).content.decode()
    )


def test_read_only(admin_client, recorded):
    _profile, request = recorded
    assert admin_client.get(reverse("admin:safeupdates_processedrequest_add")).status_code == 403
    change = admin_client.get(reverse("admin:safeupdates_processedrequest_change", args=[request.pk]))
    assert change.status_code == 200
    assert b'name="status"' not in change.content  # shown, not editable
    assert admin_client.post(reverse("admin:safeupdates_processedrequest_delete", args=[request.pk])).status_code == 403
    assert ProcessedRequest.objects.filter(pk=request.pk).exists()


def test_target_without_admin_is_plain_text(admin_client):
    request = ProcessedRequest(content_type=ContentType.objects.get_for_model(Gadget), object_id="7")
    assert ProcessedRequestAdmin(ProcessedRequest, site).target_link(request) == "testapp.gadget 7"
    assert ProcessedRequestAdmin(ProcessedRequest, site).target_link(ProcessedRequest(key="k")) == "k"


def test_request_whose_content_type_was_deleted(admin_client, recorded):
    _profile, request = recorded
    ProcessedRequest.objects.filter(pk=request.pk).update(content_type_id=987654)
    changelist = admin_client.get(reverse("admin:safeupdates_processedrequest_changelist"))
    assert changelist.status_code == 200 and b"content type 987654 (deleted)" in changelist.content
    change = admin_client.get(reverse("admin:safeupdates_processedrequest_change", args=[request.pk]))
    assert change.status_code == 200 and b"content type 987654 (deleted)" in change.content
