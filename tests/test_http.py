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
        assert body["changes"] == [
            {
                "field": "active",
                "now": True,
                "request_id": str(rid),
                "changed_at": body["changes"][0]["changed_at"],
                "version": stored.field_version("active"),
            }
        ]
        assert f"Active is now True (request {rid})" in body["detail"]
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


@pytest.mark.django_db(transaction=True)
def test_a_row_lock_held_across_the_views_read_then_committed_is_412(client, postgres_only):
    """PostgreSQL: another transaction has written the row, uncommitted, when the view reads it (the
    old version, matching If-Match); the view's UPDATE waits on the row lock; the other transaction
    commits; the UPDATE re-checks ``lock_version`` on the new row and matches nothing."""
    from tests.workers import wait_until

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
            wait_until(lambda: _waiting_on_locks() >= 1, timeout=30)
        finally:
            release.set()
            connections.close_all()

    releaser = threading.Thread(target=commit_once_the_view_waits)
    releaser.start()
    response = put(client, f"/profiles/{profile.pk}/", {"name": "b", "active": False}, if_match=seen)
    releaser.join(30)
    thread.join(30)
    assert response.status_code == 412, response.content
    # A full save() writes every field: each is listed, with its value now.
    assert {"field": "active", "now": True} in [
        {"field": change["field"], "now": change["now"]} for change in response.json()["changes"]
    ]
    stored = Profile.objects.get()
    assert (stored.name, stored.active) == ("a", True)


def _waiting_on_locks() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


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
