"""Django REST framework: ``lock_version`` in serializers (409) and ETags on viewsets (304/412/428)."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip(
    "rest_framework", reason="Django REST framework is not installed: pip install 'django-safeupdates[drf]'"
)

from rest_framework.test import APIClient

from safeupdates.http import etag_for, version_from_etag
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


def etag(profile: Profile) -> str:
    """The ETag the API answers: a digest of each of the serializer's fields (name, active)."""
    return etag_for(profile, ["name", "active"])


#: DRF's answers to a client its permission classes refuse.
OBJECT_REFUSED = "You do not have permission to perform this action."
NOT_AUTHENTICATED = "Authentication credentials were not provided."


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
        assert response["ETag"] == etag(profile)

    def test_an_update_at_the_current_version_writes_and_answers_the_new_one(self, api):
        profile = ProfileFactory(name="a")
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b", "lock_version": profile.lock_version}, "json")
        stored = Profile.objects.get()
        assert response.status_code == 200 and stored.name == "b"
        assert response.json()["lock_version"] == stored.lock_version > profile.lock_version
        assert response["ETag"] == etag(stored)

    def test_a_stale_lock_version_is_409_naming_the_fields_written_since(self, api):
        """A PATCH is checked per field (tests/test_drf_fields.py): of a field written since, 409."""
        profile = ProfileFactory(name="a")
        rid = another_client_sets_active(profile)
        data = {"name": "b", "active": False, "lock_version": profile.lock_version}
        response = api.patch(f"/profiles/{profile.pk}/", data, "json")
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
        data = {"name": "b", "active": True, "lock_version": profile.lock_version}
        response = api.patch(f"/profiles/{profile.pk}/", data, "json")
        assert response.status_code == 409
        assert [c["field"] for c in response.json()["changes"]] == ["active"]
        assert Profile.objects.get().name == "a"


class TestViewSet:
    def test_a_create_answers_the_etag_of_the_new_record(self, api):
        """A client that creates a record can send its next write with If-Match at once, no GET between."""
        response = api.post("/profiles/", {"name": "new"}, "json")
        created = Profile.objects.get()
        assert response.status_code == 201 and response["ETag"] == etag(created)
        again = api.patch(f"/profiles/{created.pk}/", {"name": "b"}, "json", headers={"if_match": response["ETag"]})
        assert again.status_code == 200 and Profile.objects.get().name == "b"

    def test_if_none_match_gives_304(self, api):
        profile = ProfileFactory()
        response = api.get(f"/profiles/{profile.pk}/", headers={"if_none_match": etag(profile)})
        assert response.status_code == 304 and response["ETag"] == etag(profile) and not response.content

    def test_if_match_current_writes_old_is_412(self, api):
        profile = ProfileFactory(name="a")
        seen = etag(profile)
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b"}, "json", headers={"if_match": seen})
        assert response.status_code == 200 and response["ETag"] == etag(Profile.objects.get())
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "c"}, "json", headers={"if_match": seen})
        assert response.status_code == 412
        assert "name" in [c["field"] for c in response.json()["changes"]]
        assert Profile.objects.get().name == "b"

    def test_a_write_between_the_read_and_the_save_with_if_match_is_412(self, api):
        profile = ProfileFactory(name="a")
        drf_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b"}, "json", headers={"if_match": etag(profile)})
        assert response.status_code == 412
        assert [c["field"] for c in response.json()["changes"]] == ["active"]
        assert Profile.objects.get().name == "a"

    def test_delete_is_checked(self, api):
        profile = ProfileFactory()
        seen = etag(profile)
        another_client_sets_active(profile)
        assert api.delete(f"/profiles/{profile.pk}/", headers={"if_match": seen}).status_code == 412
        drf_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        current = etag(Profile.objects.get())
        assert api.delete(f"/profiles/{profile.pk}/", headers={"if_match": current}).status_code == 412
        assert Profile.objects.exists()
        drf_urls.BETWEEN_READ_AND_WRITE.clear()
        current = etag(Profile.objects.get())
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
        assert api.patch(url, {"name": "b"}, "json", headers={"if_match": f"W/{etag(profile)}"}).status_code == 412
        assert api.patch(url, {"name": "b"}, "json", headers={"if_match": etag(other)}).status_code == 412
        assert api.patch("/profiles/999999/", {"name": "b"}, "json", headers={"if_match": "*"}).status_code == 412
        assert Profile.objects.get(pk=profile.pk).name == "a"

    def test_header_and_body_versions_must_agree(self, api):
        profile = ProfileFactory(name="a")
        response = api.patch(
            f"/profiles/{profile.pk}/",
            {"name": "b", "lock_version": profile.lock_version - 1},
            "json",
            headers={"if_match": etag(profile)},
        )
        assert response.status_code == 400 and "lock_version" in response.json()


class TestLockVersionInput:
    @pytest.mark.parametrize("value", [2**63, 10**30, -1, "abc", True, False, 1.5, None, [], {}, "9" * 30])
    def test_a_lock_version_out_of_range_or_of_another_type_is_400(self, api, value):
        """Never a 500 (19.11): ``2**63`` does not fit the column, and a bool is not a version."""
        profile = ProfileFactory(name="a")
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b", "lock_version": value}, "json")
        assert response.status_code == 400, response.content
        assert list(response.json()) == ["lock_version"]
        assert Profile.objects.get().name == "a"

    def test_the_largest_version_is_a_stale_one_not_an_error(self, api):
        profile = ProfileFactory(name="a")
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b", "lock_version": 2**63 - 1}, "json")
        assert response.status_code == 409 and Profile.objects.get().name == "a"


class TestWhatAConflictDiscloses:
    def test_a_409_names_only_the_serializers_fields(self, api):
        profile = ProfileFactory(name="a")
        Profile.objects.update_if_newer(profile.pk, version=next_version(), note="a secret", score=3, active=True)
        response = api.put(f"/profiles/{profile.pk}/", {"name": "b", "lock_version": profile.lock_version}, "json")
        assert response.status_code == 409
        assert [c["field"] for c in response.json()["changes"]] == ["active"]
        assert "secret" not in response.content.decode() and "Score" not in response.content.decode()

    def test_a_full_save_lists_only_the_fields_whose_values_differ(self, api):
        profile = ProfileFactory(name="a")
        seen = api.get(f"/profiles/{profile.pk}/")["ETag"]
        other = Profile.objects.get(pk=profile.pk)
        other.name = "b"
        other.score = 9
        other.save()
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "c"}, "json", headers={"if_match": seen})
        assert response.status_code == 412
        assert [(c["field"], c["now"]) for c in response.json()["changes"]] == [("name", "b")]

    def test_a_write_while_the_request_ran_lists_only_the_fields_whose_values_differ(self, api):
        profile = ProfileFactory(name="a")

        def full_save() -> None:
            other = Profile.objects.get(pk=profile.pk)
            other.active = True
            other.save()

        drf_urls.BETWEEN_READ_AND_WRITE.append(full_save)
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b"}, "json")
        assert response.status_code == 409
        assert [(c["field"], c["now"], c["seen"]) for c in response.json()["changes"]] == [("active", True, False)]

    def test_the_writer_is_told_by_versions_not_by_values(self, api):
        profile = ProfileFactory(active=True)
        seen = api.get(f"/profiles/{profile.pk}/")["ETag"]
        rid = another_client_sets_active(profile)  # True: no change of value, but a write of the request
        for value in (False, True):
            saved = Profile.objects.get(pk=profile.pk)
            saved.active = value
            saved.save()
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "c"}, "json", headers={"if_match": seen})
        assert response.status_code == 412 and response.json()["changes"] == []  # active is True, as seen
        assert str(rid) not in response.content.decode()

    def test_files_bytes_and_custom_types_in_a_conflict(self, api):
        from tests.testapp.models import Attachment, Point

        attachment = Attachment.objects.create(title="t", blob=b"\x00", spot=Point(1, 2))
        url = f"/attachments/{attachment.pk}/"
        seen = api.get(url)
        assert seen.status_code == 200, seen.content

        def move() -> None:
            moved = Attachment.objects.get(pk=attachment.pk)
            moved.file.name, moved.spot = "attachments/a.txt", Point(3, 4)
            moved.save()

        drf_urls.BETWEEN_READ_AND_WRITE.append(move)
        # A PATCH is checked per field: it names the fields it writes that were written since.
        response = api.patch(url, {"title": "u", "spot": "5,6", "lock_version": attachment.lock_version}, "json")
        assert response.status_code == 409, response.content
        assert [(c["field"], c["now"]) for c in response.json()["changes"]] == [("title", "t"), ("spot", "3,4")]
        drf_urls.BETWEEN_READ_AND_WRITE.clear()
        response = api.patch(url, {"title": "u"}, "json", headers={"if_match": seen["ETag"]})
        assert response.status_code == 412
        assert [(c["field"], c["now"]) for c in response.json()["changes"]] == [
            ("file", "attachments/a.txt"),
            ("spot", "3,4"),
        ]


class TestPermissionsFirst:
    """DRF's permission checks answer before any precondition is looked at (19.5): a client refused the
    record gets DRF's answer, the same with a stale If-Match or ``lock_version`` as without, never a
    412/409 naming a field (nor a 304, nor a 400 about its header, which would tell the record exists)."""

    def test_an_object_permission_refusal_is_drfs_403_whatever_precondition_is_sent(self, api):
        profile = ProfileFactory(name="ann")
        seen = etag(profile)
        Profile.objects.update_if_newer(profile.pk, version=next_version(), note="changed", active=True)
        url, as_bob = f"/owned/{profile.pk}/", {"x_owner": "bob"}
        refused = api.patch(url, {"name": "b"}, "json", headers=as_bob)
        assert (refused.status_code, refused.json()) == (403, {"detail": OBJECT_REFUSED})
        for response in (
            api.patch(url, {"name": "b"}, "json", headers={**as_bob, "if_match": seen}),
            api.patch(url, {"name": "b", "lock_version": profile.lock_version}, "json", headers=as_bob),
            api.patch(url, {"name": "b"}, "json", headers={**as_bob, "if_match": "junk"}),
            api.put(url, {"name": "b"}, "json", headers={**as_bob, "if_match": "*"}),
            api.delete(url, headers={**as_bob, "if_match": seen}),
            api.get(url, headers={**as_bob, "if_none_match": etag(Profile.objects.get())}),
        ):
            assert (response.status_code, response.json()) == (403, {"detail": OBJECT_REFUSED})
            assert not response.has_header("ETag")
        # The owner, with the same stale If-Match, is told what changed: the refusal above was the permission's.
        as_ann = api.patch(url, {"name": "b"}, "json", headers={"x_owner": "ann", "if_match": seen})
        assert as_ann.status_code == 412 and [c["field"] for c in as_ann.json()["changes"]] == ["active"]
        assert Profile.objects.get().name == "ann"

    def test_an_anonymous_client_is_refused_before_any_precondition(self, api, django_user_model):
        profile = ProfileFactory(name="a")
        seen = etag(profile)
        another_client_sets_active(profile)
        url = f"/logged-in/{profile.pk}/"
        for response in (
            api.patch(url, {"name": "b"}, "json", headers={"if_match": seen}),
            api.patch(url, {"name": "b", "lock_version": profile.lock_version}, "json"),
            api.patch(url, {"name": "b"}, "json", headers={"if_match": "junk"}),
            api.patch("/logged-in/999999/", {"name": "b"}, "json", headers={"if_match": seen}),
            api.delete(url, headers={"if_match": seen}),
            api.get(url, headers={"if_none_match": etag(Profile.objects.get())}),
        ):
            assert (response.status_code, response.json()) == (403, {"detail": NOT_AUTHENTICATED})
            assert not response.has_header("ETag")
        # Logged in, the same stale If-Match is told what changed: the refusal above was the permission's.
        api.force_authenticate(django_user_model.objects.create_user("ann"))
        logged_in = api.patch(url, {"name": "b"}, "json", headers={"if_match": seen})
        assert logged_in.status_code == 412 and [c["field"] for c in logged_in.json()["changes"]] == ["active"]
        assert Profile.objects.get().name == "a"

    def test_a_record_outside_the_clients_queryset_is_answered_as_one_that_does_not_exist(self, api):
        """As the HTTP layer's ``permission``: 404, or with If-Match the 412 of a missing record, the same
        answer for a record of another client as for no record at all."""
        profile = ProfileFactory(name="ann")
        seen = etag(profile)
        Profile.objects.update_if_newer(profile.pk, version=next_version(), note="changed", active=True)
        stale_body = {"active": False, "lock_version": profile.lock_version}
        for data, headers, status in (
            ({"name": "b"}, {"if_match": seen}, 412),
            ({"name": "b"}, {"if_match": "*"}, 412),
            (stale_body, {}, 404),
            ({"name": "b"}, {}, 404),
        ):
            theirs = api.patch(f"/mine/{profile.pk}/", data, "json", headers={"x_owner": "bob", **headers})
            missing = api.patch("/mine/999999/", data, "json", headers={"x_owner": "bob", **headers})
            assert (theirs.status_code, theirs.json()) == (missing.status_code, missing.json())
            assert theirs.status_code == status and "changes" not in theirs.json()
        as_ann = api.patch(f"/mine/{profile.pk}/", stale_body, "json", headers={"x_owner": "ann"})
        assert as_ann.status_code == 409 and [c["field"] for c in as_ann.json()["changes"]] == ["active"]
        assert Profile.objects.get().name == "ann"


class TestWhoseConflict:
    """Only the record's own lost write is a 409/412 (19.6), as in the HTTP layer
    (``tests/test_http.py::TestWhoseConflict``): a ``StaleObjectError`` of another record the view saves
    after its own is the view's, and propagates. A 412/409 would say "nothing was written" of a record
    that was written (or deleted)."""

    @pytest.mark.parametrize(
        "route",
        ["writes-another", "then-writes-another"],
        ids=["within-the-checked-write", "in-perform-update"],
    )
    @pytest.mark.parametrize("sent", ["if_match", "lock_version", "nothing"])
    def test_a_stale_save_of_another_record_after_the_update_is_the_views_own(self, api, monkeypatch, route, sent):
        """Under ``ATOMIC_REQUESTS`` the request's transaction rolls back with it; without, the update
        the view made stays written."""
        from django.db import connection

        from safeupdates.exceptions import StaleObjectError
        from tests.testapp.models import Document

        Document.objects.create(title="t")
        for atomic_requests, name in ((False, "written"), (True, "a")):
            monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", atomic_requests)
            profile = ProfileFactory(name="a")
            data, headers = {"name": "written"}, {}
            if sent == "if_match":
                headers["if_match"] = etag(profile)
            elif sent == "lock_version":
                data["lock_version"] = profile.lock_version
            with pytest.raises(StaleObjectError, match=r"testapp\.Document"):
                api.patch(f"/{route}/{profile.pk}/", data, "json", headers=headers)
            assert Profile.objects.get(pk=profile.pk).name == name

    @pytest.mark.parametrize("if_match", [True, False], ids=["if_match", "nothing"])
    def test_a_stale_save_of_another_record_after_the_delete_is_the_views_own(self, api, monkeypatch, if_match):
        """Not a 412 (or 404) saying the record "was deleted while the request ran": the view deleted it."""
        from django.db import connection

        from safeupdates.exceptions import StaleObjectError
        from tests.testapp.models import Document

        Document.objects.create(title="t")
        for atomic_requests, kept in ((False, False), (True, True)):
            monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", atomic_requests)
            profile = ProfileFactory(name="a")
            headers = {"if_match": etag(profile)} if if_match else {}
            with pytest.raises(StaleObjectError, match=r"testapp\.Document"):
                api.delete(f"/writes-another/{profile.pk}/", headers=headers)
            assert Profile.objects.filter(pk=profile.pk).exists() is kept


class TestStatuses:
    def test_without_if_match_a_row_deleted_while_the_request_ran_is_404(self, api):
        """No precondition sent, no 412 (19.7); as a moment later, the record is not found."""
        profile = ProfileFactory(name="a")
        drf_urls.BETWEEN_READ_AND_WRITE.append(lambda: Profile.objects.filter(pk=profile.pk).delete())
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b"}, "json")
        assert response.status_code == 404
        assert "was deleted while the request ran" in response.json()["detail"]
        response = api.delete(f"/profiles/{ProfileFactory().pk}/")
        assert response.status_code in (204, 404)

    def test_with_if_match_a_row_deleted_while_the_request_ran_is_412(self, api):
        profile = ProfileFactory(name="a")
        drf_urls.BETWEEN_READ_AND_WRITE.append(lambda: Profile.objects.filter(pk=profile.pk).delete())
        response = api.patch(f"/profiles/{profile.pk}/", {"name": "b"}, "json", headers={"if_match": etag(profile)})
        assert response.status_code == 412

    def test_the_201_carries_the_etag_of_the_saved_record_whatever_perform_create_does(self, api):
        """A viewset that saves the new record in its own ``perform_create`` (20.3)."""
        response = api.post("/noted/", {"name": "new"}, "json")
        created = Profile.objects.get()
        assert response.status_code == 201 and created.note == "set by the view"
        assert version_from_etag(response["ETag"].strip('"'), created) == created.lock_version
        again = api.patch(f"/noted/{created.pk}/", {"name": "b"}, "json", headers={"if_match": response["ETag"]})
        assert again.status_code == 200
