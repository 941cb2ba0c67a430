"""ETag, If-None-Match and If-Match on the views of one record (``safeupdates.http``)."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from django.db import connections

from safeupdates.http import ANY, MalformedHeader, etag_for, parse_etags, version_from_etag
from safeupdates.versions import next_version
from tests import http_urls
from tests.factories import ProfileFactory
from tests.testapp.models import Profile

pytestmark = [pytest.mark.urls("tests.http_urls")]


@pytest.fixture(autouse=True)
def no_hooks():
    http_urls.BETWEEN_READ_AND_WRITE.clear()
    yield
    http_urls.BETWEEN_READ_AND_WRITE.clear()


def put(client, url, data, **headers):
    return client.put(url, json.dumps(data), content_type="application/json", headers=headers)


def another_client_sets_active(profile: Profile) -> None:
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=True)


class TestParse:
    def test_lists_star_weak_and_empty_elements(self):
        assert parse_etags("*") == ANY
        assert parse_etags(' "a" , W/"b",, "c,d"') == [(False, "a"), (True, "b"), (False, "c,d")]

    @pytest.mark.parametrize("value", ["abc", '"a" "b"', '"a', ",", "", 'W/ "a"', '"a", *', '"a\x01"', "'a'"])
    def test_anything_else_is_malformed(self, value):
        with pytest.raises(MalformedHeader):
            parse_etags(value)


@pytest.mark.django_db
class TestETag:
    def test_is_strong_quoted_and_names_the_version(self, client):
        profile = ProfileFactory()
        response = client.get(f"/profiles/{profile.pk}/")
        etag = response["ETag"]
        assert response.status_code == 200 and etag == etag_for(profile)
        assert etag.startswith(f'"{profile.lock_version}.') and etag.endswith('"') and not etag.startswith("W/")
        assert version_from_etag(etag.strip('"'), profile) == profile.lock_version

    def test_one_records_etag_is_not_valid_for_another_with_the_same_version(self, client):
        first, second = ProfileFactory(), ProfileFactory()
        Profile.objects.update(lock_version=0)  # as rows migrated in: every row at 0
        first.refresh_from_db()
        second.refresh_from_db()
        assert etag_for(first) != etag_for(second)
        assert version_from_etag(etag_for(first).strip('"'), second) is None
        response = put(client, f"/profiles/{second.pk}/", {"name": "x"}, if_match=etag_for(first))
        assert response.status_code == 412
        assert "no current ETag" in response.json()["detail"]

    def test_a_forged_or_other_keys_etag_is_refused_fallback_keys_accepted(self, client, settings):
        profile = ProfileFactory()
        forged = f'"{profile.lock_version}.AAAA"'
        assert put(client, f"/profiles/{profile.pk}/", {"name": "x"}, if_match=forged).status_code == 412
        old = etag_for(profile)
        settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "a-new-key", [settings.SECRET_KEY]
        assert put(client, f"/profiles/{profile.pk}/", {"name": "x"}, if_match=old).status_code == 200
        settings.SECRET_KEY_FALLBACKS = []
        response = client.get(f"/profiles/{profile.pk}/", headers={"if_none_match": etag_for(Profile.objects.get())})
        assert response.status_code == 304


@pytest.mark.django_db
class TestIfNoneMatch:
    @pytest.mark.parametrize("method", ["get", "head"])
    def test_the_current_etag_gives_304_with_the_etag(self, client, method):
        profile = ProfileFactory()
        etag = etag_for(profile)
        for header in (etag, f"W/{etag}", "*", f'"other", {etag}'):
            response = getattr(client, method)(f"/profiles/{profile.pk}/", headers={"if_none_match": header})
            assert response.status_code == 304, header
            assert response["ETag"] == etag and response.content == b""

    def test_an_old_etag_gives_the_record(self, client):
        profile = ProfileFactory()
        old = etag_for(profile)
        another_client_sets_active(profile)
        response = client.get(f"/profiles/{profile.pk}/", headers={"if_none_match": old})
        assert response.status_code == 200 and response.json()["active"] is True
        assert response["ETag"] != old

    def test_on_a_write_a_match_is_412_and_writes_nothing(self, client):
        profile = ProfileFactory(name="a")
        response = put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_none_match="*")
        assert response.status_code == 412
        assert Profile.objects.get().name == "a"


@pytest.mark.django_db
class TestIfMatch:
    def test_the_current_etag_writes_and_answers_the_new_etag(self, client):
        profile = ProfileFactory(name="a")
        response = put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match=etag_for(profile))
        stored = Profile.objects.get()
        assert response.status_code == 200 and stored.name == "b"
        assert response["ETag"] == etag_for(stored) != etag_for(profile)

    def test_an_old_etag_is_412_naming_the_fields_written_since(self, client):
        profile = ProfileFactory(name="a")
        seen = etag_for(profile)
        rid = uuid.uuid4()
        Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True)
        response = put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match=seen)
        assert response.status_code == 412
        body = response.json()
        stored = Profile.objects.get()
        assert stored.name == "a"
        assert (body["seen_version"], body["current_version"]) == (profile.lock_version, stored.lock_version)
        # The view declares no conflict_fields: the fields are named, without their values.
        assert body["changes"] == [
            {
                "field": "active",
                "request_id": str(rid),
                "changed_at": body["changes"][0]["changed_at"],
                "version": stored.field_version("active"),
            }
        ]
        assert f"Active changed (request {rid})" in body["detail"]
        assert "GET it again" in body["detail"]

    def test_one_of_several_etags_matching_is_enough(self, client):
        profile = ProfileFactory()
        header = f'"junk", W/{etag_for(profile)}, {etag_for(profile)}'
        assert put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match=header).status_code == 200

    def test_a_weak_etag_never_matches_for_a_write(self, client):
        profile = ProfileFactory(name="a")
        response = put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match=f"W/{etag_for(profile)}")
        assert response.status_code == 412 and Profile.objects.get().name == "a"

    def test_star_writes_if_the_record_exists(self, client):
        profile = ProfileFactory(name="a")
        assert put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match="*").status_code == 200
        assert put(client, "/profiles/999999/", {"name": "b"}, if_match="*").status_code == 412
        assert put(client, "/profiles/999999/", {"name": "b"}).status_code == 404

    @pytest.mark.parametrize(
        "header", ["abc", '"unterminated', '"a" "b"', ",", "W/", '"a", *', "\u00e9", '"' + "9" * 30 + '.x"', '"-1.x"']
    )
    def test_a_malformed_or_absurd_header_is_400_or_412_never_500(self, client, header):
        profile = ProfileFactory(name="a")
        write = put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match=header)
        read = client.get(f"/profiles/{profile.pk}/", headers={"if_none_match": header})
        assert write.status_code in (400, 412) and read.status_code in (200, 400)
        assert "detail" in write.json()
        assert Profile.objects.get().name == "a"

    def test_delete_is_checked_too(self, client):
        profile = ProfileFactory()
        seen = etag_for(profile)
        another_client_sets_active(profile)
        assert client.delete(f"/profiles/{profile.pk}/", headers={"if_match": seen}).status_code == 412
        assert Profile.objects.exists()
        current = etag_for(Profile.objects.get())
        assert client.delete(f"/profiles/{profile.pk}/", headers={"if_match": current}).status_code == 204
        assert not Profile.objects.exists()

    def test_required_if_match_is_428_for_writes_only(self, client):
        profile = ProfileFactory(name="a")
        assert client.get(f"/strict/{profile.pk}/").status_code == 200
        response = put(client, f"/strict/{profile.pk}/", {"name": "b"})
        assert response.status_code == 428 and "If-Match" in response.json()["detail"]
        assert client.delete(f"/strict/{profile.pk}/").status_code == 428
        assert Profile.objects.get().name == "a"
        assert put(client, f"/strict/{profile.pk}/", {"name": "b"}, if_match=etag_for(profile)).status_code == 200

    def test_the_queryset_callable_limits_the_records(self, client):
        hidden = ProfileFactory(name="hidden")
        assert client.get(f"/strict/{hidden.pk}/").status_code == 404


@pytest.mark.django_db
class TestTheCheckIsTheWrite:
    """The row changes after the view read it (and found the client's ETag current), before it writes."""

    @pytest.mark.parametrize("url", ["/profiles/{}/", "/cbv/{}/"])
    def test_a_write_between_the_views_read_and_its_write_is_412(self, client, url):
        profile = ProfileFactory(name="a")
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        response = put(client, url.format(profile.pk), {"name": "b", "active": False}, if_match=etag_for(profile))
        assert response.status_code == 412
        assert [change["field"] for change in response.json()["changes"]] == ["active"]
        stored = Profile.objects.get()
        assert (stored.name, stored.active) == ("a", True)  # the other client's write survived

    def test_djangos_condition_compares_first_and_overwrites(self, client):
        """The baseline the test above would catch: the write in between is lost."""
        profile = ProfileFactory(name="a")
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        response = put(client, f"/naive/{profile.pk}/", {"name": "b", "active": False}, if_match=etag_for(profile))
        assert response.status_code == 200
        assert Profile.objects.get().active is False  # the other client's True was overwritten

    def test_star_or_no_if_match_with_a_write_in_between_is_409(self, client):
        profile = ProfileFactory(name="a")
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        assert put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match="*").status_code == 409
        assert put(client, f"/profiles/{profile.pk}/", {"name": "b"}).status_code == 409
        assert Profile.objects.get().name == "a"

    def test_a_delete_between_read_and_write_is_412(self, client):
        profile = ProfileFactory(name="a")
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: Profile.objects.filter(pk=profile.pk).delete())
        response = client.delete(f"/profiles/{profile.pk}/", headers={"if_match": etag_for(profile)})
        assert response.status_code in (204, 412)  # nothing left to delete either way; never a 500


def patch(client, url, data, **headers):
    return client.patch(url, json.dumps(data), content_type="application/json", headers=headers)


@pytest.mark.django_db
class TestIfMatchIsStrictWhateverTheFields:
    """An old ETag is 412 however the view writes, also when the fields it writes were not written since
    (RFC 9110, 13.1.1: If-Match compares the whole representation). Per field is for ``lock_version``
    in a DRF PATCH body, and for a view's own ``save(update_fields=...)`` without If-Match (issue 53)."""

    @pytest.mark.parametrize("route", ["profiles", "fields"], ids=["full-save", "update-fields"])
    def test_an_old_etag_on_a_patch_of_another_field_is_412(self, client, route):
        profile = ProfileFactory(name="a")
        seen = etag_for(profile, ["name", "active"] if route == "fields" else ())
        another_client_sets_active(profile)
        response = patch(client, f"/{route}/{profile.pk}/", {"name": "b"}, if_match=seen)
        assert response.status_code == 412, response.content
        assert [change["field"] for change in response.json()["changes"]] == ["active"]
        assert Profile.objects.get().name == "a"

    @pytest.mark.parametrize(
        "route",
        [
            "profiles",
            "fields",
        ],
        ids=["full-save", "update-fields"],
    )
    def test_a_write_of_another_field_between_the_views_read_and_its_write_is_412(self, client, route):
        profile = ProfileFactory(name="a")
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        response = patch(client, f"/{route}/{profile.pk}/", {"name": "b"}, if_match=etag_for(profile))
        assert response.status_code == 412, response.content
        stored = Profile.objects.get()
        assert (stored.name, stored.active) == ("a", True)

    def test_without_if_match_a_save_of_update_fields_is_checked_per_field(self, client):
        profile = ProfileFactory(name="a")
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        assert patch(client, f"/fields/{profile.pk}/", {"name": "b"}).status_code == 200
        stored = Profile.objects.get()
        assert (stored.name, stored.active) == ("b", True)


@pytest.mark.django_db
class TestWhatAConflictDiscloses:
    """A 409/412 names only the fields the view shows, with values only where it declares them (19.5)."""

    def test_by_default_the_fields_are_named_without_their_values(self, client):
        profile = ProfileFactory(name="a")
        seen = etag_for(profile)
        Profile.objects.update_if_newer(profile.pk, version=next_version(), note="a secret", active=True)
        response = put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match=seen)
        assert response.status_code == 412
        body = response.json()
        assert [change["field"] for change in body["changes"]] == ["active", "note"]
        assert all("now" not in change and "seen" not in change for change in body["changes"])
        assert "secret" not in response.content.decode()
        assert "Active changed (a direct save); Note changed (a direct save)" in body["detail"]

    def test_declared_fields_are_listed_with_their_values_and_no_other(self, client):
        profile = ProfileFactory(name="a")
        seen = client.get(f"/declared/{profile.pk}/")["ETag"]
        rid = uuid.uuid4()
        Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, note="n", active=True)
        response = put(client, f"/declared/{profile.pk}/", {"name": "b"}, if_match=seen)
        assert response.status_code == 412
        body = response.json()
        assert [(c["field"], c["now"], c["seen"], c["request_id"]) for c in body["changes"]] == [
            ("active", True, False, str(rid))
        ]
        assert f"Active is now True (request {rid})" in body["detail"] and "Note" not in body["detail"]

    def test_a_full_save_lists_only_the_fields_whose_values_differ(self, client):
        """A full save makes every field's version newer (20.9): only a changed value is listed."""
        profile = ProfileFactory(name="a")
        seen = client.get(f"/declared/{profile.pk}/")["ETag"]
        other = Profile.objects.get(pk=profile.pk)
        other.name = "b"
        other.save()
        response = put(client, f"/declared/{profile.pk}/", {"name": "c"}, if_match=seen)
        assert response.status_code == 412
        assert [change["field"] for change in response.json()["changes"]] == ["name"]
        assert "Name is now 'b' (a direct save). Nothing was written" in response.json()["detail"]

    def test_the_writer_is_told_by_versions_not_by_values(self, client):
        """A request set False, a save True, a save False (20.4): the last write is a direct save."""
        profile = ProfileFactory(active=True)
        seen = client.get(f"/declared/{profile.pk}/")["ETag"]
        rid = uuid.uuid4()
        Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=False)
        for value in (True, False):
            saved = Profile.objects.get(pk=profile.pk)
            saved.active = value
            saved.save()
        response = put(client, f"/declared/{profile.pk}/", {"name": "c"}, if_match=seen)
        assert response.status_code == 412
        (change,) = response.json()["changes"]
        assert (change["field"], change["now"], change["request_id"]) == ("active", False, None)
        assert "Active is now False (a direct save)" in response.json()["detail"]
        assert str(rid) not in response.content.decode()

    @pytest.mark.parametrize("url", ["/owned/{}/", "/cbv-owned/{}/"])
    def test_a_client_who_may_not_read_the_record_learns_nothing_from_a_stale_if_match(self, client, url):
        profile = ProfileFactory(name="ann")
        seen = etag_for(profile)
        Profile.objects.update_if_newer(profile.pk, version=next_version(), note="changed")
        as_bob = put(client, url.format(profile.pk), {"name": "b"}, if_match=seen, x_owner="bob")
        missing = put(client, url.format(999999), {"name": "b"}, if_match=seen, x_owner="bob")
        assert (
            (as_bob.status_code, as_bob.json())
            == (missing.status_code, missing.json())
            == (
                412,
                {"detail": "If-Match: the record does not exist (any more); nothing was written."},
            )
        )
        assert put(client, url.format(profile.pk), {"name": "b"}, x_owner="bob").status_code == 404
        assert put(client, url.format(profile.pk), {"name": "b"}, if_match=seen, x_owner="ann").status_code == 412
        assert Profile.objects.get().name == "ann"

    def test_a_login_check_after_the_mixin_in_the_bases_runs_before_any_precondition(self, client):
        profile = ProfileFactory(name="a")
        seen = etag_for(profile)
        another_client_sets_active(profile)
        assert put(client, f"/logged-in/{profile.pk}/", {"name": "b"}, if_match=seen).status_code == 403
        assert put(client, f"/logged-in/{profile.pk}/", {"name": "b"}, if_match="junk").status_code == 403

    def test_an_anonymous_user_of_a_per_user_queryset_is_a_404_not_a_500(self, client):
        """``filter(user=request.user)`` cannot be built for an anonymous user (20.6)."""
        profile = ProfileFactory()
        assert client.get(f"/per-user/{profile.pk}/").status_code == 404
        assert put(client, f"/per-user/{profile.pk}/", {}, if_match=etag_for(profile)).status_code == 412


@pytest.mark.django_db
class TestWhoseConflict:
    def test_a_stale_save_of_another_record_is_the_views_own(self, monkeypatch):
        """The view wrote its record, then another record's save went stale (19.6): not a 412 about ours
        ("nothing was written" would be false), but the view's own error; under ATOMIC_REQUESTS the
        request's transaction rolls back with it."""
        from django.db import connection
        from django.test import Client

        from safeupdates.exceptions import StaleObjectError
        from tests.testapp.models import Document

        Document.objects.create(title="t")
        client = Client(raise_request_exception=True)
        for atomic_requests, name in ((False, "written"), (True, "a")):
            monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", atomic_requests)
            profile = ProfileFactory(name="a")
            with pytest.raises(StaleObjectError, match=r"testapp\.Document"):
                put(client, f"/writes-another/{profile.pk}/", {}, if_match=etag_for(profile))
            assert Profile.objects.get(pk=profile.pk).name == name

    def test_under_atomic_requests_a_412_keeps_nothing_the_view_wrote(self, client, monkeypatch):
        from django.db import connection

        from tests.testapp.models import Document

        monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
        document = Document.objects.create(title="t")
        profile = ProfileFactory(name="a")
        # The view writes the document, then its profile, which another client changed meanwhile.
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: another_client_sets_active(profile))
        response = put(client, f"/writes-another-first/{profile.pk}/", {"name": "b"}, if_match=etag_for(profile))
        assert response.status_code == 412 and "Nothing was written" in response.json()["detail"]
        assert Document.objects.get(pk=document.pk).title == "t"

    def test_without_if_match_a_row_deleted_while_the_view_ran_is_404_never_412(self, client):
        """No precondition sent, no 412 (19.7): as a moment later, the record is not found."""
        profile = ProfileFactory(name="a")
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: Profile.objects.filter(pk=profile.pk).delete())
        response = put(client, f"/profiles/{profile.pk}/", {"name": "b"})
        assert response.status_code == 404
        assert response.json() == {
            "detail": f"Profile {profile.pk} was deleted while the request ran; nothing was written."
        }
        assert not Profile.objects.exists()

    def test_with_if_match_a_row_deleted_while_the_view_ran_is_412(self, client):
        profile = ProfileFactory(name="a")
        http_urls.BETWEEN_READ_AND_WRITE.append(lambda: Profile.objects.filter(pk=profile.pk).delete())
        response = put(client, f"/profiles/{profile.pk}/", {"name": "b"}, if_match=etag_for(profile))
        assert response.status_code == 412 and "was deleted while the request ran" in response.json()["detail"]
        assert not Profile.objects.exists()


@pytest.mark.django_db
def test_the_class_based_views_require_if_match_is_428(client):
    """``ConditionalMixin.require_if_match = True`` (mutation probe: only the decorator was tested)."""
    profile = ProfileFactory(name="a")
    response = put(client, f"/cbv/{profile.pk}/", {"name": "b"})
    assert response.status_code == 428 and "If-Match" in response.json()["detail"]
    assert client.delete(f"/cbv/{profile.pk}/").status_code == 428
    assert client.get(f"/cbv/{profile.pk}/").status_code == 200
    assert Profile.objects.get().name == "a"
    assert put(client, f"/cbv/{profile.pk}/", {"name": "b"}, if_match=etag_for(profile)).status_code == 200


@pytest.mark.django_db
def test_a_conflict_about_files_bytes_and_custom_types_is_json_never_a_500(client):
    """Values JSON cannot encode (19.8), in a 412 and in a 409."""
    from tests.testapp.models import Attachment, Point

    attachment = Attachment.objects.create(title="t", blob=b"\x00", spot=Point(1, 2))
    url = f"/attachments/{attachment.pk}/"
    seen = client.get(url)["ETag"]

    def move(spot: Point) -> None:
        moved = Attachment.objects.get(pk=attachment.pk)
        moved.file.name, moved.blob, moved.spot = "attachments/a.txt", b"\xff", spot
        moved.save()

    move(Point(3, 4))
    response = put(client, url, {"title": "u"}, if_match=seen)
    assert response.status_code == 412
    assert [(c["field"], c["now"]) for c in response.json()["changes"]] == [
        ("file", "attachments/a.txt"),
        ("blob", "/w=="),
        ("spot", "3,4"),
    ]
    http_urls.BETWEEN_READ_AND_WRITE.append(lambda: move(Point(5, 6)))
    response = put(client, url, {"title": "u"})
    assert response.status_code == 409
    # A full save wrote file and blob again, with the values the view had loaded: only spot differs.
    assert [(c["field"], c["now"]) for c in response.json()["changes"]] == [("spot", "5,6")]


@pytest.mark.django_db(transaction=True)
def test_a_row_lock_held_across_the_views_read_then_committed_is_412(client, postgres_only):
    """PostgreSQL: another transaction has written the row, uncommitted, when the view reads it (the
    old version, matching If-Match); the view's UPDATE waits on the row lock; the other transaction
    commits; the UPDATE re-checks ``lock_version`` on the new row and matches nothing."""
    from tests.workers import lock_waiters, wait_until

    profile = ProfileFactory(name="a")
    seen = etag_for(profile)
    written, release, done = threading.Event(), threading.Event(), threading.Event()

    def other_transaction():
        try:
            with Profile.objects.with_lock(profile.pk) as locked:
                locked.active = True
                locked.save()
                written.set()
                release.wait(30)
        finally:
            connections.close_all()
            done.set()

    thread = threading.Thread(target=other_transaction)
    thread.start()
    assert written.wait(30)

    def commit_once_the_view_waits():
        try:
            wait_until(lambda: lock_waiters(), timeout=30)
        finally:
            release.set()
            connections.close_all()

    releaser = threading.Thread(target=commit_once_the_view_waits)
    releaser.start()
    response = put(client, f"/profiles/{profile.pk}/", {"name": "b", "active": False}, if_match=seen)
    releaser.join(30)
    thread.join(30)
    assert response.status_code == 412, response.content
    # A full save() writes every field, but only active differs from what the view loaded.
    assert [change["field"] for change in response.json()["changes"]] == ["active"]
    stored = Profile.objects.get()
    assert (stored.name, stored.active) == ("a", True)


def test_the_core_never_imports_rest_framework():
    """DRF is an optional extra: importing the app, its HTTP module and its models must not need it."""
    import subprocess
    import sys

    from tests.workers import ROOT, subprocess_env

    code = (
        "import sys, django; django.setup(); import safeupdates.http, safeupdates.ids, safeupdates.models, "
        "safeupdates.jobs; sys.exit('rest_framework' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
