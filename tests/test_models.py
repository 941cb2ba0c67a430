from __future__ import annotations

import io

import pytest
from django.core import serializers
from django.core.management import call_command
from django.db import models

from safeupdates.exceptions import StaleObjectError
from safeupdates.models import BASE_VERSION_KEY, ProcessedRequest, RequestStatus
from safeupdates.versions import next_version
from tests.factories import DocumentFactory, ProfileFactory
from tests.testapp.models import Document, Logbook, Profile, Specimen

pytestmark = pytest.mark.django_db


def test_create_takes_a_fresh_version_for_every_field():
    before = next_version()
    profile = ProfileFactory()
    assert profile.lock_version > before
    assert profile.field_versions == {BASE_VERSION_KEY: profile.lock_version}
    assert profile.field_version("active") == profile.lock_version


def test_save_bumps_lock_version_strictly():
    profile = ProfileFactory()
    versions = [profile.lock_version]
    for _ in range(3):
        profile.name = f"n{len(versions)}"
        profile.save()
        versions.append(profile.lock_version)
    assert versions == sorted(set(versions))
    field_version = profile.field_version("name")
    profile.refresh_from_db()
    assert profile.lock_version == versions[-1]
    assert profile.field_version("name") == field_version == versions[-1]  # one version per save


def test_stale_save_raises_and_restores_the_instance():
    first = ProfileFactory(name="a")
    second = Profile.objects.get(pk=first.pk)
    first.name = "b"
    first.save()
    second.name = "c"
    loaded_version, loaded_versions = second.lock_version, dict(second.field_versions)
    with pytest.raises(StaleObjectError, match="refresh_from_db"):
        second.save()
    assert (second.lock_version, second.field_versions) == (loaded_version, loaded_versions)
    assert Profile.objects.get(pk=first.pk).name == "b"
    # After a reload the save goes through.
    second.refresh_from_db()
    second.name = "c"
    second.save()
    assert Profile.objects.get(pk=first.pk).name == "c"


def test_update_fields_save_is_checked_and_bumps_only_those_fields():
    profile = ProfileFactory()
    other = Profile.objects.get(pk=profile.pk)
    base = profile.lock_version
    profile.active = True
    profile.save(update_fields=["active"])
    assert profile.lock_version > base
    assert profile.field_versions.keys() == {BASE_VERSION_KEY, "active"}
    assert profile.field_versions == {BASE_VERSION_KEY: base, "active": profile.lock_version}
    # The instance holds what the row holds: the statement returned it.
    assert Profile.objects.get(pk=profile.pk).field_versions == profile.field_versions
    other.active = False
    with pytest.raises(StaleObjectError):  # active was written after `other` read it
        other.save(update_fields=["active"])
    assert Profile.objects.get(pk=profile.pk).active is True
    other.newsletter = True
    other.save(update_fields=["newsletter"])  # newsletter was not: checked per field (issue 53)
    assert Profile.objects.get(pk=profile.pk).newsletter is True


def test_save_supersedes_requests_allocated_before_it():
    profile = ProfileFactory()
    older = next_version()
    profile.active = True
    profile.save()
    result = Profile.objects.update_if_newer(profile.pk, version=older, active=False)
    assert result.outcome == "stale"
    profile.refresh_from_db()
    assert profile.active is True


def test_update_fields_save_leaves_other_fields_open_to_older_requests():
    profile = ProfileFactory()
    older = next_version()
    profile.active = True
    profile.save(update_fields=["active"])
    assert Profile.objects.update_if_newer(profile.pk, version=older, active=False).outcome == "stale"
    assert Profile.objects.update_if_newer(profile.pk, version=older, newsletter=True).outcome == "applied"


def test_save_of_a_row_deleted_since_it_was_loaded_is_stale():
    """As in Rails: the delete is a write the instance never saw; bringing the row back would undo it."""
    document = DocumentFactory()
    Document.objects.filter(pk=document.pk).delete()
    document.title = "edited"
    with pytest.raises(StaleObjectError, match="deleted"):
        document.save()
    assert not Document.objects.filter(pk=document.pk).exists()
    document.save(force_insert=True)  # a deliberate re-insert
    assert Document.objects.get(pk=document.pk).title == "edited"


def test_a_new_instance_with_an_explicit_pk_is_inserted():
    document = Document(pk=10**9, title="new")
    document.save()
    assert Document.objects.get(pk=10**9).title == "new"


def test_lock_version_mixin_alone():
    document = DocumentFactory(title="x")
    stale = Document.objects.get(pk=document.pk)
    document.title = "y"
    document.save()
    stale.title = "z"
    with pytest.raises(StaleObjectError):
        stale.save()


def test_fixture_loading_is_not_checked():
    profile = ProfileFactory(name="fixture")
    data = serializers.serialize("json", [profile])
    profile.name = "moved on"
    profile.save()
    path = io.StringIO(data)
    objects = list(serializers.deserialize("json", path))
    objects[0].save()  # save_base(raw=True): loads over a newer row without StaleObjectError
    assert Profile.objects.get(pk=profile.pk).name == "fixture"


@pytest.mark.parametrize("entry", ["plain", "expression"])
def test_auto_now_add_is_filled_in_on_the_insert_only(entry):
    """As in Django: ``auto_now_add`` set by the INSERT and kept after, ``auto_now`` by every save; also
    where a value is an expression, which Django's own INSERT writes (``base._do_insert`` 35: ``pre_save``
    not told it is an insert wrote NULL)."""
    from django.db.models.functions import Upper

    logbook = Logbook.objects.create(entry="a" if entry == "plain" else Upper(models.Value("a")))
    row = Logbook.objects.get(pk=logbook.pk)
    assert row.opened_at is not None and row.opened_at == logbook.opened_at
    assert row.written_at >= row.opened_at
    row.entry = "b"
    row.save()
    again = Logbook.objects.get(pk=logbook.pk)
    assert (again.opened_at, again.written_at) == (logbook.opened_at, row.written_at)
    assert again.written_at > logbook.written_at


def test_a_fixtures_new_row_is_inserted_as_the_fixture_gives_it():
    """Loading a fixture inserts a new row with the fixture's values, as Django does: no ``pre_save()``, so
    an ``auto_now`` field keeps the fixture's time (``base._do_insert`` 13: Django's INSERT not told it
    is raw)."""
    from datetime import UTC, datetime

    then = datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC)
    data = serializers.serialize("json", [Specimen(pk=10**6, touched_at=then)])
    [loaded] = serializers.deserialize("json", io.StringIO(data))
    loaded.save()
    assert Specimen.objects.get(pk=10**6).touched_at == then


def test_loaddata_command(tmp_path):
    profile = ProfileFactory(name="fixture")
    fixture = tmp_path / "profiles.json"
    fixture.write_text(serializers.serialize("json", [profile]))
    Profile.objects.filter(pk=profile.pk).update(lock_version=profile.lock_version + 100)
    call_command("loaddata", str(fixture), verbosity=0)
    assert Profile.objects.get(pk=profile.pk).lock_version == profile.lock_version


def test_processed_request_str_and_terminal():
    request = ProcessedRequest(version=3, status=RequestStatus.PENDING)
    assert "pending v3" in str(request)
    assert not request.is_terminal
    request.status = RequestStatus.STALE
    assert request.is_terminal


def test_empty_update_fields_saves_nothing():
    profile = ProfileFactory()
    Profile.objects.filter(pk=profile.pk).update(lock_version=profile.lock_version + 1)
    profile.name = "unsaved"
    profile.save(update_fields=[])  # no write, so no StaleObjectError either
    assert Profile.objects.get(pk=profile.pk).name != "unsaved"


def test_changes_keep_microseconds():
    import datetime
    import json

    from safeupdates.models import ChangesEncoder

    moment = datetime.datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=datetime.UTC)
    assert json.dumps({"at": moment, "t": moment.time()}, cls=ChangesEncoder) == (
        '{"at": "2026-11-29T10:00:00.123456Z", "t": "10:00:00.123456"}'
    )
    assert json.dumps({"n": 1.5}, cls=ChangesEncoder) == '{"n": 1.5}'


def test_changes_encode_what_djangos_encoder_does_and_refuse_the_rest():
    """Besides datetimes and times, ChangesEncoder hands every other value to DjangoJSONEncoder (dates,
    decimals, UUIDs), whose refusal names the value's type."""
    import datetime
    import decimal
    import json
    import uuid

    from safeupdates.models import ChangesEncoder

    rid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    values = {"d": datetime.date(2026, 12, 2), "n": decimal.Decimal("1.10"), "u": rid}
    assert json.dumps(values, cls=ChangesEncoder) == (
        '{"d": "2026-12-02", "n": "1.10", "u": "12345678-1234-5678-1234-567812345678"}'
    )
    with pytest.raises(TypeError, match="Object of type frozenset is not JSON serializable"):
        json.dumps({"s": frozenset()}, cls=ChangesEncoder)


def test_a_save_writes_its_own_row_only_when_rows_share_a_lock_version():
    """Rows made by bulk_create() all carry lock_version 0: the checked UPDATE must still name its row."""
    first, second = Document.objects.bulk_create([Document(title="a"), Document(title="b")])
    loaded = Document.objects.get(pk=first.pk)
    assert loaded.lock_version == Document.objects.get(pk=second.pk).lock_version == 0
    loaded.title = "changed"
    loaded.save()
    assert Document.objects.get(pk=second.pk).title == "b"
    assert Document.objects.get(pk=second.pk).lock_version == 0
    stale = Document.objects.get(pk=second.pk)
    Document.objects.get(pk=second.pk).save()
    with pytest.raises(StaleObjectError):
        stale.delete()
    assert Document.objects.filter(pk=first.pk).exists()


def test_the_instances_bulk_create_returns_save_as_loaded_ones():
    """bulk_create() marks its instances saved without loading them (no from_db()): their next save is
    checked against the row they made, as a loaded instance's, and a stale one is refused."""
    first, second = Document.objects.bulk_create([Document(title="a"), Document(title="b")])
    first.title = "changed"
    first.save()
    assert Document.objects.get(pk=first.pk).title == "changed"
    Document.objects.get(pk=second.pk).save()  # the row moves on
    second.title = "lost"
    with pytest.raises(StaleObjectError):
        second.save()
    assert Document.objects.get(pk=second.pk).title == "b"


def test_a_field_never_written_has_version_zero():
    document = Document.objects.bulk_create([Document(title="a")])[0]
    document.refresh_from_db()
    assert document.field_versions == {}
    assert document.field_version("title") == 0


def test_version_counter_str():
    from safeupdates.models import VersionCounter

    assert str(VersionCounter(value=7)) == "7"


def test_the_mixins_fields_come_after_the_models_own():
    """Positional arguments, ``values_list()`` and serializers see a model's own fields first, as they
    would without the mixins (Django orders fields by creation, and the mixins' were created first)."""
    assert [field.name for field in Profile._meta.concrete_fields] == [
        "id",
        "name",
        "active",
        "newsletter",
        "dark_mode",
        "score",
        "note",
        "lock_version",
        "field_versions",
        "last_synced_at",
    ]
    document = Document(None, "positional", "body")
    document.save()
    assert Document.objects.values_list().get(pk=document.pk)[:3] == (document.pk, "positional", "body")
