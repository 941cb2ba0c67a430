"""Django REST framework: a PATCH with ``lock_version`` in its body is checked per field (issue 53).

Two clients that read the record at one version and PATCH different fields both land; a PATCH of a
field written since that version is 409, naming only the fields both wrote, and writes nothing. PUT
and If-Match stay row-level (RFC 9110: an old ETag is 412 whatever fields differ).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip(
    "rest_framework", reason="Django REST framework is not installed: pip install 'django-safeupdates[drf]'"
)

from django.db.models.signals import post_save, pre_save
from rest_framework.test import APIClient

from safeupdates.http import etag_for
from safeupdates.versions import next_version
from tests import drf_urls
from tests.factories import ProfileFactory
from tests.testapp.models import Profile

pytestmark = [pytest.mark.urls("tests.drf_urls"), pytest.mark.django_db]


@pytest.fixture
def api() -> Iterator[APIClient]:
    drf_urls.BETWEEN_READ_AND_WRITE.clear()
    drf_urls.VIEW_SETS.clear()
    yield APIClient()
    drf_urls.BETWEEN_READ_AND_WRITE.clear()
    drf_urls.VIEW_SETS.clear()


@pytest.fixture
def saves() -> Iterator[list[tuple[str, frozenset[str] | None]]]:
    """Every pre_save and post_save of a Profile: ``(signal, update_fields)``."""
    got: list[tuple[str, frozenset[str] | None]] = []

    def before(sender: Any, update_fields: Any = None, **kwargs: Any) -> None:
        got.append(("pre_save", update_fields))

    def after(sender: Any, update_fields: Any = None, **kwargs: Any) -> None:
        got.append(("post_save", update_fields))

    pre_save.connect(before, sender=Profile, weak=False, dispatch_uid="tests.drf_fields.pre")
    post_save.connect(after, sender=Profile, weak=False, dispatch_uid="tests.drf_fields.post")
    yield got
    pre_save.disconnect(sender=Profile, dispatch_uid="tests.drf_fields.pre")
    post_save.disconnect(sender=Profile, dispatch_uid="tests.drf_fields.post")


def etag(profile: Profile) -> str:
    return etag_for(profile, ["name", "active"])


def patch(api: APIClient, profile: Profile, data: dict[str, Any], route: str = "profiles", **headers: str) -> Any:
    return api.patch(f"/{route}/{profile.pk}/", data, "json", headers=headers)


def another_client_writes(profile: Profile, **changes: Any) -> uuid.UUID:
    rid = uuid.uuid4()
    assert Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, **changes).applied
    return rid


class TestPatchPerField:
    def test_two_patches_of_different_fields_at_one_version_both_land(self, api):
        profile = ProfileFactory(name="a")
        seen = profile.lock_version
        first = patch(api, profile, {"name": "b", "lock_version": seen})
        second = patch(api, profile, {"active": True, "lock_version": seen})
        assert (first.status_code, second.status_code) == (200, 200), second.content
        stored = Profile.objects.get()
        assert (stored.name, stored.active) == ("b", True)
        assert second.json() == {"id": profile.pk, "name": "b", "active": True, "lock_version": stored.lock_version}
        assert second["ETag"] == etag(stored)

    def test_a_patch_of_the_same_field_is_409_naming_only_the_fields_both_wrote(self, api, saves):
        profile = ProfileFactory(name="a")
        seen = profile.lock_version
        assert patch(api, profile, {"name": "b", "lock_version": seen}).status_code == 200
        written = Profile.objects.get()
        saves.clear()
        response = patch(api, profile, {"name": "c", "active": True, "lock_version": seen})
        assert response.status_code == 409, response.content
        body = response.json()
        assert [(c["field"], c["now"]) for c in body["changes"]] == [("name", "b")]
        assert (body["seen_version"], body["current_version"]) == (seen, written.lock_version)
        assert "Name is now 'b'" in body["detail"] and "Active" not in body["detail"]
        stored = Profile.objects.get()  # nothing written: not the disjoint field either
        assert (stored.name, stored.active, stored.lock_version) == ("b", False, written.lock_version)
        assert saves == []  # refused before the save: no pre_save for a write that never happens

    def test_a_request_that_wrote_the_field_is_named(self, api):
        profile = ProfileFactory(name="a")
        rid = another_client_writes(profile, active=True)
        response = patch(api, profile, {"active": False, "lock_version": profile.lock_version})
        assert response.status_code == 409
        assert [(c["field"], c["now"], c["request_id"]) for c in response.json()["changes"]] == [
            ("active", True, str(rid))
        ]
        assert Profile.objects.get().active is True

    def test_a_field_the_view_sets_is_checked_and_not_named(self, api):
        """perform_update() writes ``note`` (not shown): another writer's note since is a conflict that
        names no field, and nothing is written."""
        profile = ProfileFactory(name="a")
        assert Profile.objects.update_if_newer(profile.pk, version=next_version(), note="theirs").applied
        drf_urls.VIEW_SETS["note"] = "the view's"
        response = patch(api, profile, {"name": "b", "lock_version": profile.lock_version}, route="noting")
        assert response.status_code == 409, response.content
        assert response.json()["changes"] == [] and "theirs" not in response.content.decode()
        stored = Profile.objects.get()
        assert (stored.name, stored.note) == ("a", "theirs")

    def test_the_refusal_is_signalled_once_naming_the_fields_it_would_write(self, api, refused):
        profile = ProfileFactory(name="a")
        another_client_writes(profile, active=True)
        assert patch(api, profile, {"active": False, "lock_version": profile.lock_version}).status_code == 409
        assert [(r["surface"], r["fields"], r["version"]) for r in refused] == [
            ("drf", ("active",), profile.lock_version)
        ]


class TestWhatIsWritten:
    def test_fields_the_view_passes_to_save_are_written(self, api, saves):
        profile = ProfileFactory(name="a")
        another_client_writes(profile, active=True)
        drf_urls.VIEW_SETS["note"] = "by the view"
        saves.clear()
        response = patch(api, profile, {"name": "b", "lock_version": profile.lock_version}, route="noting")
        assert response.status_code == 200, response.content
        stored = Profile.objects.get()
        assert (stored.name, stored.note, stored.active) == ("b", "by the view", True)
        assert saves == [("pre_save", frozenset({"name", "note"})), ("post_save", frozenset({"name", "note"}))]

    def test_fields_the_view_sets_on_the_record_are_written(self, api, saves):
        profile = ProfileFactory(name="a")
        another_client_writes(profile, active=True)
        drf_urls.VIEW_SETS["score"] = 7
        saves.clear()
        response = patch(api, profile, {"name": "b", "lock_version": profile.lock_version}, route="setting")
        assert response.status_code == 200, response.content
        stored = Profile.objects.get()
        assert (stored.name, stored.score, stored.active) == ("b", 7, True)
        assert saves == [("pre_save", frozenset({"name", "score"})), ("post_save", frozenset({"name", "score"}))]

    def test_the_save_signals_get_the_fields_written(self, api, saves):
        profile = ProfileFactory(name="a")
        saves.clear()
        assert patch(api, profile, {"name": "b", "lock_version": profile.lock_version}).status_code == 200
        assert saves == [("pre_save", frozenset({"name"})), ("post_save", frozenset({"name"}))]

    @pytest.mark.parametrize("data", [{}, {"name": "a"}, {"name": "a", "active": False}], ids=["none", "same", "both"])
    def test_a_patch_that_changes_nothing_writes_nothing(self, api, saves, data):
        profile = ProfileFactory(name="a")
        another_client_writes(profile, newsletter=True)  # a field the PATCH does not send: no conflict
        before = Profile.objects.get()
        saves.clear()
        response = patch(api, profile, {**data, "lock_version": profile.lock_version})
        assert response.status_code == 200, response.content
        assert response.json()["lock_version"] == before.lock_version
        after = Profile.objects.get()
        assert (after.lock_version, after.field_versions) == (before.lock_version, before.field_versions)
        assert saves == []


class TestWhileTheRequestRuns:
    def test_a_write_of_another_field_between_read_and_save_is_kept_and_shown(self, api):
        profile = ProfileFactory(name="a")
        drf_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_writes(profile, active=True))
        response = patch(api, profile, {"name": "b", "lock_version": profile.lock_version})
        assert response.status_code == 200, response.content
        stored = Profile.objects.get()
        assert (stored.name, stored.active) == ("b", True)
        # The answer shows the record as stored, the other client's write included, and its ETag.
        assert response.json() == {"id": profile.pk, "name": "b", "active": True, "lock_version": stored.lock_version}
        assert response["ETag"] == etag(stored)

    def test_a_write_of_the_same_field_between_read_and_save_is_409_naming_only_it(self, api):
        profile = ProfileFactory(name="a")
        drf_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_writes(profile, name="z", active=True))
        response = patch(api, profile, {"name": "b", "lock_version": profile.lock_version})
        assert response.status_code == 409, response.content
        assert [(c["field"], c["now"]) for c in response.json()["changes"]] == [("name", "z")]
        stored = Profile.objects.get()
        assert (stored.name, stored.active) == ("z", True)


class TestRowLevel:
    def test_a_put_with_a_version_older_than_a_write_of_another_field_is_409(self, api):
        profile = ProfileFactory(name="a")
        another_client_writes(profile, active=True)
        response = api.put(f"/profiles/{profile.pk}/", {"name": "b", "lock_version": profile.lock_version}, "json")
        assert response.status_code == 409, response.content
        assert [c["field"] for c in response.json()["changes"]] == ["active"]
        assert Profile.objects.get().name == "a"

    def test_a_patch_with_an_old_if_match_is_412_whatever_field_it_changes(self, api):
        profile = ProfileFactory(name="a")
        seen = etag(profile)
        assert patch(api, profile, {"active": True, "lock_version": profile.lock_version}).status_code == 200
        response = patch(api, profile, {"name": "b"}, if_match=seen)
        assert response.status_code == 412, response.content
        assert [c["field"] for c in response.json()["changes"]] == ["active"]
        assert Profile.objects.get().name == "a"

    def test_a_patch_with_if_match_and_a_write_of_another_field_while_it_runs_is_412(self, api):
        profile = ProfileFactory(name="a")
        drf_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_writes(profile, active=True))
        body = {"name": "b", "lock_version": profile.lock_version}
        response = patch(api, profile, body, if_match=etag(profile))
        assert response.status_code == 412, response.content
        assert Profile.objects.get().name == "a"

    def test_if_match_star_keeps_the_lock_version_row_level(self, api):
        profile = ProfileFactory(name="a")
        another_client_writes(profile, active=True)
        response = patch(api, profile, {"name": "b", "lock_version": profile.lock_version}, if_match="*")
        assert response.status_code == 409, response.content
        assert Profile.objects.get().name == "a"
