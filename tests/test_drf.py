"""Django REST framework: ``lock_version`` in serializers (409) and ETags on viewsets (304/412/428)."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip(
    "rest_framework", reason="Django REST framework is not installed: pip install 'django-safeupdates[drf]'"
)

from rest_framework.test import APIClient

from safeupdates.http import etag_for
from safeupdates.versions import next_version
from tests import drf_urls
from tests.factories import ProfileFactory
from tests.testapp.models import Profile

pytestmark = [pytest.mark.urls("tests.drf_urls"), pytest.mark.django_db]


@pytest.fixture
def api():
    drf_urls.BETWEEN_READ_AND_WRITE.clear()
    yield APIClient()
    drf_urls.BETWEEN_READ_AND_WRITE.clear()


def another_client_sets_active(profile: Profile) -> uuid.UUID:
    rid = uuid.uuid4()
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True)
    return rid


class TestSerializer:
    def test_the_output_carries_lock_version_and_the_etag(self, api):
        profile = ProfileFactory(name="a")
        response = api.get(f"/profiles/{profile.pk}/")
        assert response.status_code == 200
        assert response.json() == {"id": profile.pk, "name": "a", "active": False, "lock_version": profile.lock_version}
        assert response["ETag"] == etag_for(profile)

    def test_an_update_at_the_current_version_writes_and_answers_the_new_one(self, api):
        profile = ProfileFactory(name="a")
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b", "lock_version": profile.lock_version}, "json")
        stored = Profile.objects.get()
        assert response.status_code == 200 and stored.name == "b"
        assert response.json()["lock_version"] == stored.lock_version > profile.lock_version
        assert response["ETag"] == etag_for(stored)

    def test_a_stale_lock_version_is_409_naming_the_fields_written_since(self, api):
        profile = ProfileFactory(name="a")
        rid = another_client_sets_active(profile)
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b", "lock_version": profile.lock_version}, "json")
        assert response.status_code == 409
        body = response.json()
        assert [(c["field"], c["now"], c["request_id"]) for c in body["changes"]] == [("active", True, str(rid))]
        assert body["seen_version"] == profile.lock_version and isinstance(body["current_version"], int)
        assert "Active is now True" in body["detail"]
        assert Profile.objects.get().name == "a"

    def test_lock_version_is_never_written_from_input(self, api):
        profile = ProfileFactory(name="a")
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b", "lock_version": 10**12}, "json")
        assert response.status_code == 409 and Profile.objects.get().lock_version == profile.lock_version

    def test_a_create_ignores_lock_version(self, api):
        response = api.post("/profiles/", {"name": "new", "lock_version": 10**12}, "json")
        assert response.status_code == 201
        assert Profile.objects.get().lock_version == response.json()["lock_version"] < 10**12

    def test_a_write_between_the_read_and_the_save_is_409(self, api):
        profile = ProfileFactory(name="a")
        drf_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b", "lock_version": profile.lock_version}, "json")
        assert response.status_code == 409
        assert [c["field"] for c in response.json()["changes"]] == ["active"]
        assert Profile.objects.get().name == "a"


class TestViewSet:
    def test_a_create_answers_the_etag_of_the_new_record(self, api):
        """A client that creates a record can send its next write with If-Match at once, no GET between."""
        response = api.post("/profiles/", {"name": "new"}, "json")
        created = Profile.objects.get()
        assert response.status_code == 201 and response["ETag"] == etag_for(created)
        again = api.patch(f"/profiles/{created.pk}/", {"name": "b"}, "json", headers={"if_match": response["ETag"]})
        assert again.status_code == 200 and Profile.objects.get().name == "b"

    def test_if_none_match_gives_304(self, api):
        profile = ProfileFactory()
        response = api.get(f"/profiles/{profile.pk}/", headers={"if_none_match": etag_for(profile)})
        assert response.status_code == 304 and response["ETag"] == etag_for(profile) and not response.content

    def test_if_match_current_writes_old_is_412(self, api):
        profile = ProfileFactory(name="a")
        seen = etag_for(profile)
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b"}, "json", headers={"if_match": seen})
        assert response.status_code == 200 and response["ETag"] == etag_for(Profile.objects.get())
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "c"}, "json", headers={"if_match": seen})
        assert response.status_code == 412
        assert "name" in [c["field"] for c in response.json()["changes"]]
        assert Profile.objects.get().name == "b"

    def test_a_write_between_the_read_and_the_save_with_if_match_is_412(self, api):
        profile = ProfileFactory(name="a")
        drf_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b"}, "json", headers={"if_match": etag_for(profile)})
        assert response.status_code == 412
        assert [c["field"] for c in response.json()["changes"]] == ["active"]
        assert Profile.objects.get().name == "a"

    def test_delete_is_checked(self, api):
        profile = ProfileFactory()
        seen = etag_for(profile)
        another_client_sets_active(profile)
        assert api.delete(f"/profiles/{profile.pk}/", headers={"if_match": seen}).status_code == 412
        drf_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        current = etag_for(Profile.objects.get())
        assert api.delete(f"/profiles/{profile.pk}/", headers={"if_match": current}).status_code == 412
        assert Profile.objects.exists()
        drf_urls.BETWEEN_READ_AND_WRITE.clear()
        current = etag_for(Profile.objects.get())
        assert api.delete(f"/profiles/{profile.pk}/", headers={"if_match": current}).status_code == 204
        assert not Profile.objects.exists()

    def test_required_if_match_is_428(self, api):
        profile = ProfileFactory(name="a")
        assert api.get(f"/strict/{profile.pk}/").status_code == 200
        response = api.patch(f"/strict/{profile.pk}/", {"name": "b", "lock_version": profile.lock_version}, "json")
        assert response.status_code == 428 and "If-Match" in response.json()["detail"]
        assert Profile.objects.get().name == "a"

    @pytest.mark.parametrize("header", ["abc", '"a" "b"', "W/"])
    def test_a_malformed_header_is_400(self, api, header):
        profile = ProfileFactory()
        assert (
            api.patch(f"/profiles/{profile.pk}/", {"name": "b"}, "json", headers={"if_match": header}).status_code
            == 400
        )

    def test_weak_foreign_or_missing_is_412(self, api):
        profile, other = ProfileFactory(name="a"), ProfileFactory()
        url = f"/profiles/{profile.pk}/"
        assert api.patch(url, {"name": "b"}, "json", headers={"if_match": f"W/{etag_for(profile)}"}).status_code == 412
        assert api.patch(url, {"name": "b"}, "json", headers={"if_match": etag_for(other)}).status_code == 412
        assert api.patch("/profiles/999999/", {"name": "b"}, "json", headers={"if_match": "*"}).status_code == 412
        assert Profile.objects.get(pk=profile.pk).name == "a"

    def test_header_and_body_versions_must_agree(self, api):
        profile = ProfileFactory(name="a")
        response = api.patch(
            f"/profiles/{profile.pk}/",
            {"name": "b", "lock_version": profile.lock_version - 1},
            "json",
            headers={"if_match": etag_for(profile)},
        )
        assert response.status_code == 400 and "lock_version" in response.json()
