"""The optimistic check of ``LockVersionMixin`` holds on every path around it (issue 11, items 1-7).

``lock_version`` is a change token: every write that changes a field moves it, so an instance loaded
before that write can never save over it; deferred or ``None`` versions never save unchecked; a stale
``delete()`` raises; a save rolled back by the caller leaves no false conflict behind.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.db.models.signals import pre_delete
from django.test.utils import CaptureQueriesContext

from safeupdates.exceptions import InvalidUpdate, StaleObjectError
from safeupdates.models import BASE_VERSION_KEY
from safeupdates.versions import next_version
from tests.factories import DocumentFactory, ProfileFactory
from tests.testapp.models import Chapter, Document, Profile
from tests.workers import assert_a_stale_copy_is_refused

pytestmark = pytest.mark.django_db


def older_request_wins_a_field(profile: Profile, write) -> None:
    """Make a request older than the row's lock_version win field ``active`` through ``write``."""
    older, newer = next_version(), next_version()
    assert Profile.objects.update_if_newer(profile.pk, version=newer, newsletter=True).applied
    write(profile.pk, older)  # active's own version is the row's creation: the older request wins it


WRITERS = {
    "update_if_newer": lambda pk, version: Profile.objects.update_if_newer(pk, version=version, active=True),
    "bulk_update_if_newer": lambda pk, version: Profile.objects.bulk_update_if_newer([(pk, version, {"active": True})]),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_write_by_an_older_request_moves_lock_version(writer):
    profile = ProfileFactory()
    loaded = None

    def write(pk, version):
        nonlocal loaded
        loaded = Profile.objects.get(pk=pk)  # loaded after the newer write, before the older one
        WRITERS[writer](pk, version)

    older_request_wins_a_field(profile, write)
    assert Profile.objects.get(pk=profile.pk).active is True
    assert Profile.objects.get(pk=profile.pk).lock_version > loaded.lock_version
    loaded.name = "edited"
    with pytest.raises(StaleObjectError):
        loaded.save()
    assert Profile.objects.get(pk=profile.pk).active is True  # the older request's write survives


def test_lock_version_is_above_every_version_written():
    profile = ProfileFactory()
    version = next_version()
    Profile.objects.update_if_newer(profile.pk, version=version, active=True)
    profile.refresh_from_db()
    assert profile.lock_version > version
    assert profile.field_version("active") == version


def test_update_fields_save_merges_field_versions_in_the_statement():
    profile = ProfileFactory()
    written = next_version()
    Profile.objects.update_if_newer(profile.pk, version=written, active=True)
    profile.refresh_from_db()
    profile.field_versions = {}  # whatever the instance holds, the row's entries are kept
    profile.name = "renamed"
    profile.save(update_fields=["name"])
    row = Profile.objects.get(pk=profile.pk)
    assert row.field_versions["active"] == written
    assert row.field_versions[BASE_VERSION_KEY] < written < row.field_versions["name"]
    assert Profile.objects.update_if_newer(profile.pk, version=written - 1, active=False).outcome == "stale"


def test_update_fields_save_after_an_older_request_won_a_field_keeps_its_entry():
    profile = ProfileFactory()
    loaded = {}

    def write(pk, version):
        loaded["instance"] = Profile.objects.get(pk=pk)
        Profile.objects.update_if_newer(pk, version=version, active=True)
        loaded["version"] = version

    older_request_wins_a_field(profile, write)
    instance = loaded["instance"]
    instance.name = "renamed"
    instance.save(update_fields=["name"])  # checked per field: name was not written since (issue 53)
    row = Profile.objects.get(pk=profile.pk)
    assert (row.name, row.active) == ("renamed", True)
    assert row.field_version("active") == loaded["version"]
    instance.active = False
    # The request is older than the version the instance read: in version order this save is the newer.
    instance.save(update_fields=["active"])
    assert Profile.objects.get(pk=profile.pk).field_version("active") == instance.lock_version


class TestDeferred:
    def test_a_deferred_lock_version_never_saves_unchecked(self):
        profile = ProfileFactory(name="a")
        deferred = Profile.objects.only("name").get(pk=profile.pk)
        Profile.objects.update_if_newer(profile.pk, version=next_version(), active=True)
        deferred.name = "b"
        with pytest.raises(InvalidUpdate) as raised:
            deferred.save()
        assert str(raised.value) == (
            f"testapp.Profile pk={profile.pk!r} was loaded without lock_version (.only()/.defer()), so its "
            "save cannot be checked; load lock_version too, e.g. .only(..., 'lock_version')."
        )
        row = Profile.objects.get(pk=profile.pk)
        assert (row.name, row.active) == ("a", True)

    def test_deferred_fields_are_not_marked_as_written(self):
        profile = ProfileFactory(name="a")
        pending = next_version()  # a request for `active` allocated before the save
        partial = Profile.objects.only("name", "lock_version").get(pk=profile.pk)
        partial.name = "b"
        partial.save()
        row = Profile.objects.get(pk=profile.pk)
        assert row.name == "b"
        assert row.field_version("name") > pending
        assert row.field_version("active") == profile.lock_version
        assert Profile.objects.update_if_newer(profile.pk, version=pending, active=True).outcome == "applied"

    def test_a_deferred_save_marks_the_fields_it_wrote_and_never_the_version_fields(self):
        """Saved with a field deferred, an instance writes (and marks) each field it loaded, its two
        version fields aside: those are the versions, not fields with a version of their own."""
        profile = ProfileFactory(name="a")
        partial = Profile.objects.defer("active").get(pk=profile.pk)
        partial.name = "b"
        partial.save()
        row = Profile.objects.get(pk=profile.pk)
        loaded = {f.name for f in Profile._meta.concrete_fields if not f.primary_key} - {"active"}
        assert set(row.field_versions) == {"*"} | loaded - {"lock_version", "field_versions"}
        assert all(row.field_versions[name] == row.lock_version for name in row.field_versions if name != "*")

    def test_a_deferred_instance_with_lock_version_is_still_checked(self):
        profile = ProfileFactory(name="a")
        partial = Profile.objects.only("name", "lock_version").get(pk=profile.pk)
        Profile.objects.update_if_newer(profile.pk, version=next_version(), name="moved on")
        partial.name = "b"
        with pytest.raises(StaleObjectError):
            partial.save()
        assert Profile.objects.get(pk=profile.pk).name == "moved on"


def test_lock_version_none_never_saves_unchecked():
    profile = ProfileFactory(name="a")
    instance = Profile.objects.get(pk=profile.pk)
    Profile.objects.update_if_newer(profile.pk, version=next_version(), name="moved on")
    instance.lock_version = None
    instance.name = "b"
    with pytest.raises(StaleObjectError):
        instance.save()
    assert Profile.objects.get(pk=profile.pk).name == "moved on"


class TestDelete:
    def test_a_stale_delete_raises_and_deletes_nothing(self):
        document = DocumentFactory(title="a")
        stale = Document.objects.get(pk=document.pk)
        document.title = "b"
        document.save()
        with pytest.raises(StaleObjectError):
            stale.delete()
        assert Document.objects.filter(pk=document.pk).exists()
        assert stale.pk == document.pk  # the instance is left as it was

    def test_a_delete_without_lock_version_is_refused(self):
        document = DocumentFactory()
        with pytest.raises(InvalidUpdate) as raised:
            Document.objects.only("title").get(pk=document.pk).delete()
        assert str(raised.value) == (
            f"testapp.Document pk={document.pk!r} was loaded without lock_version (.only()/.defer()), so "
            "its delete cannot be checked; load lock_version too, e.g. .only(..., 'lock_version')."
        )
        assert Document.objects.filter(pk=document.pk).exists()

    def test_a_current_delete_deletes(self):
        document = DocumentFactory()
        pk = document.pk
        document.delete()
        assert not Document.objects.filter(pk=pk).exists()

    def test_a_stale_delete_inside_a_transaction_leaves_it_usable(self):
        profile = ProfileFactory()
        stale = Profile.objects.get(pk=profile.pk)
        Profile.objects.update_if_newer(profile.pk, version=next_version(), active=True)
        with transaction.atomic():
            with pytest.raises(StaleObjectError):
                stale.delete()
            assert Profile.objects.filter(pk=profile.pk).count() == 1


class TestRollback:
    def test_a_rolled_back_save_is_no_false_conflict(self):
        profile = ProfileFactory(name="a")
        with pytest.raises(RuntimeError), transaction.atomic():
            profile.name = "b"
            profile.save()
            raise RuntimeError("the caller fails")
        profile.name = "c"
        profile.save()
        assert Profile.objects.get(pk=profile.pk).name == "c"

    def test_a_rolled_back_savepoint_is_no_false_conflict(self):
        profile = ProfileFactory(name="a")
        with transaction.atomic():
            with pytest.raises(RuntimeError), transaction.atomic():
                profile.name = "b"
                profile.save(update_fields=["name"])
                raise RuntimeError("the inner block fails")
            profile.name = "c"
            profile.save(update_fields=["name"])
        row = Profile.objects.get(pk=profile.pk)
        assert row.name == "c"
        assert row.field_version("name") > profile.field_version("active")  # written by the last save

    @pytest.mark.django_db(transaction=True)
    def test_the_versions_kept_for_a_rollback_are_forgotten_when_it_commits(self):
        """Inside the transaction the instance also accepts the version before its save (a rollback would
        leave the row at it); once the save commits, only the new one (``_track_commit`` 11, 12: never
        forgotten)."""
        profile = ProfileFactory(name="a")
        before = profile.lock_version
        with transaction.atomic():
            profile.name = "b"
            profile.save()
            assert before in profile._safeupdates_uncommitted
        assert profile._safeupdates_uncommitted == ()
        assert profile.lock_version != before

    def test_after_a_rollback_a_real_conflict_still_raises(self):
        profile = ProfileFactory(name="a")
        with pytest.raises(RuntimeError), transaction.atomic():
            profile.name = "b"
            profile.save()
            raise RuntimeError("the caller fails")
        Profile.objects.update_if_newer(profile.pk, version=next_version(), name="other")
        profile.name = "c"
        with pytest.raises(StaleObjectError):
            profile.save()
        assert Profile.objects.get(pk=profile.pk).name == "other"

    def test_committed_saves_chain(self):
        profile = ProfileFactory(name="a")
        with transaction.atomic():
            profile.name = "b"
            profile.save()
        assert_a_stale_copy_is_refused(profile)


class TestDeleteStatements:
    """A row that nothing cascades from is deleted by one checked statement, as Django deletes it."""

    def test_a_row_without_cascades_is_deleted_in_one_statement(self):
        profile = ProfileFactory()
        pk = profile.pk
        with CaptureQueriesContext(connection) as queries:
            assert profile.delete() == (1, {"testapp.Profile": 1})
        statements = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
        assert len(statements) == 1 and statements[0].startswith("DELETE")
        assert profile.pk is None and not Profile.objects.filter(pk=pk).exists()

    def test_a_row_deleted_already_is_no_error(self):
        profile = ProfileFactory()
        Profile.objects.filter(pk=profile.pk).delete()
        assert profile.delete() == (0, {"testapp.Profile": 0})

    def test_a_receiver_of_delete_signals_gets_them(self):
        seen = []

        def receiver(sender, instance, **kwargs):
            seen.append((sender, instance.pk))

        profile = ProfileFactory()
        pk = profile.pk
        pre_delete.connect(receiver, sender=Profile)
        try:
            profile.delete()
        finally:
            pre_delete.disconnect(receiver, sender=Profile)
        assert seen == [(Profile, pk)] and not Profile.objects.filter(pk=pk).exists()

    def test_cascades_still_run_and_a_stale_parent_deletes_nothing(self):
        document = DocumentFactory()
        Chapter.objects.create(document=document, title="c")
        stale = Document.objects.get(pk=document.pk)
        document.title = "moved on"
        document.save()
        with pytest.raises(StaleObjectError):
            stale.delete()
        assert Chapter.objects.filter(document=document).count() == 1
        assert document.delete() == (2, {"testapp.Chapter": 1, "testapp.Document": 1})
