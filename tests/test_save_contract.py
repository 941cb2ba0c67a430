"""``LockVersionMixin.save()``, ``create()`` and ``delete()`` keep Django's own contract wherever the check
allows it (issues 19 and 24).

A save marks only the fields it wrote; an instance keeps the version its row was committed with; a new
instance never writes over a row it did not load, yet inserts, changes its primary key and creates a
multi-table child for a loaded parent as Django does; receivers see the caller's ``update_fields``;
no statement runs that Django's save would not run, but the check; errors that are not the check's
leave the caller's transaction as Django leaves it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import django
import pytest
from django.db import DatabaseError, IntegrityError, connection, connections, models, transaction
from django.db.models import Value
from django.db.models.functions import Lower
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import deprecation

from safeupdates.exceptions import NeverLoadedError, StaleObjectError
from safeupdates.jobs import apply_update, enqueue_update
from safeupdates.models import BASE_VERSION_KEY, ProcessedRequest
from safeupdates.versions import next_version
from tests.conftest import _create_profile_trigger, _drop_profile_trigger
from tests.django_contract.models import Avatar, ItalianRestaurant, User
from tests.factories import ProfileFactory
from tests.htmlforms import form_data
from tests.testapp.models import (
    ActiveOnlyProfile,
    Bakery,
    Chapter,
    Document,
    Florist,
    Gadget,
    Kennel,
    Place,
    PlainSpecimen,
    Profile,
    Restaurant,
    Review,
    Shelter,
    Specimen,
    Stamp,
    Tag,
    Truck,
    Van,
    Vehicle,
    Vendor,
    Visit,
)
from tests.workers import assert_a_stale_copy_is_refused, locked_elsewhere

pytestmark = pytest.mark.django_db

#: save()'s arguments by position: deprecated in Django 5.1, removed in 6.0.
DJANGO_TAKES_POSITIONS = django.VERSION < (6, 0)
RemovedInDjango60Warning = getattr(deprecation, "RemovedInDjango60Warning", DeprecationWarning)


def statements(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries]


def verbs(queries: CaptureQueriesContext) -> list[str]:
    """The first word of each statement (``WITH`` for the save's own UPDATE or INSERT)."""
    return [sql.split()[0] for sql in statements(queries)]


@pytest.fixture
def receiver() -> Iterator[Any]:
    """Connect a receiver to a model signal for the test: ``receiver(signal, sender, function)``."""
    connected: list[tuple[Any, Any, Any]] = []

    def connect(signal: Any, sender: Any, function: Any) -> None:
        signal.connect(function, sender=sender, weak=False)
        connected.append((signal, sender, function))

    yield connect
    for signal, sender, function in connected:
        signal.disconnect(function, sender=sender)


def fail(**kwargs: Any) -> None:
    raise RuntimeError("the receiver fails")


# --- 19.1: a full save marks only the fields it wrote ----------------------------------------------------


class TestAFullSaveMarksOnlyItsFields:
    def test_a_parents_save_keeps_a_queued_request_for_a_childs_field(self, redis: Any) -> None:
        restaurant = Restaurant.objects.create(name="Luigi's", seats=10)
        request = enqueue_update(restaurant, seats=50)
        place = Place.objects.get(pk=restaurant.pk)
        place.name = "Luigi"
        place.save()  # writes name, open, last_synced_at: never seats
        assert apply_update(str(request.request_id)) == "1 applied"
        row = Restaurant.objects.get(pk=restaurant.pk)
        assert (row.name, row.seats) == ("Luigi", 50)
        assert ProcessedRequest.objects.get().status == "applied"

    def test_the_parents_fields_are_written_by_name(self) -> None:
        """Also past ``Review``'s foreign key, which comes first among ``Place``'s relations."""
        related = [relation.related_model for relation in Place._meta.related_objects]
        assert related.index(Review) < related.index(Restaurant)
        restaurant = Restaurant.objects.create(name="a", seats=1)
        created = restaurant.lock_version
        place = Place.objects.get(pk=restaurant.pk)
        place.open = True
        place.save()
        saved = place.lock_version
        expected = {BASE_VERSION_KEY: created, "name": saved, "open": saved, "last_synced_at": saved}
        assert place.field_versions == Restaurant.objects.get(pk=restaurant.pk).field_versions == expected

    def test_the_parents_save_through_the_compiler_writes_by_name_too(self) -> None:
        restaurant = Restaurant.objects.create(name="a", seats=1)
        created = restaurant.lock_version
        place = Place.objects.get(pk=restaurant.pk)
        place.name = Lower(Value("B"))  # an expression: the ORM compiles the UPDATE
        place.save()
        row = Restaurant.objects.get(pk=restaurant.pk)
        assert row.name == "b"
        assert row.field_versions == {
            BASE_VERSION_KEY: created,
            "name": row.lock_version,
            "open": row.lock_version,
            "last_synced_at": row.lock_version,
        }

    def test_a_child_that_owns_every_field_writes_the_whole_row(self) -> None:
        restaurant = Restaurant.objects.create(name="a", seats=1)
        restaurant.seats = 2
        restaurant.save()
        assert Restaurant.objects.get(pk=restaurant.pk).field_versions == {BASE_VERSION_KEY: restaurant.lock_version}

    def test_a_model_without_children_writes_the_whole_row(self) -> None:
        profile = Profile.objects.create(name="a")
        profile.name = "b"
        profile.save()
        assert profile.field_versions == {BASE_VERSION_KEY: profile.lock_version}
        assert Profile.objects.get(pk=profile.pk).field_versions == profile.field_versions

    def test_a_parent_whose_child_adds_no_field_writes_the_whole_row(self) -> None:
        """``Kennel`` stores nothing but its parent link, and ``Visit``'s foreign key links no child."""
        kennel = Kennel.objects.create(name="a")
        assert [relation.related_model for relation in Shelter._meta.related_objects] == [Visit, Kennel]
        shelter = Shelter.objects.get(pk=kennel.pk)
        shelter.name = "b"
        shelter.save()
        assert Shelter.objects.get(pk=kennel.pk).field_versions == {BASE_VERSION_KEY: shelter.lock_version}
        kennel.refresh_from_db()
        kennel.name = "c"
        kennel.save()
        assert Kennel.objects.get(pk=kennel.pk).field_versions == {BASE_VERSION_KEY: kennel.lock_version}

    def test_a_child_below_a_plain_parent_writes_its_whole_row_beside_a_sibling(self) -> None:
        """``Van``'s fields, a sibling's below the plain ``Vehicle``, are in no row of ``Truck``'s (Django
        lists no sibling's parent link among ``Truck``'s relations: a guard against looking above it)."""
        truck = Truck.objects.create(load=1)
        Van.objects.create(vehicle_ptr=Vehicle.objects.get(pk=truck.pk), wheels=4, doors=3)
        truck.load = 2
        truck.save()
        assert Truck.objects.get(pk=truck.pk).field_versions == {BASE_VERSION_KEY: truck.lock_version}

    def test_a_childs_save_keeps_a_queued_request_for_a_siblings_field(self, redis: Any) -> None:
        """One vendor row that is a bakery and a florist: the bakery's save never writes bouquets."""
        florist = Florist.objects.create(name="both", bouquets=1)
        bakery = Bakery.objects.create(vendor_ptr=Vendor.objects.get(pk=florist.pk), name="both", loaves=2)
        request = enqueue_update(florist, bouquets=9)
        bakery.loaves = 3
        bakery.save()
        assert apply_update(str(request.request_id)) == "1 applied"
        assert Florist.objects.get(pk=florist.pk).bouquets == 9
        assert Bakery.objects.get(pk=florist.pk).loaves == 3

    def test_a_child_created_for_a_siblings_row_keeps_a_queued_request_for_the_siblings_field(self, redis: Any) -> None:
        """Creating a bakery on a florist's vendor row writes the vendor's fields, never bouquets."""
        florist = Florist.objects.create(name="both", bouquets=1)
        request = enqueue_update(florist, bouquets=9)
        Bakery.objects.create(vendor_ptr=Vendor.objects.get(pk=florist.pk), name="both", loaves=2)
        assert apply_update(str(request.request_id)) == "1 applied"
        assert Florist.objects.get(pk=florist.pk).bouquets == 9
        assert Bakery.objects.get(pk=florist.pk).loaves == 2

    @pytest.mark.urls("tests.save_admin")
    def test_the_admin_of_the_parent_keeps_a_queued_request_for_a_childs_field(
        self, admin_client: Any, redis: Any
    ) -> None:
        restaurant = Restaurant.objects.create(name="Luigi's", seats=10)
        request = enqueue_update(restaurant, seats=50)
        url = reverse("save_admin:testapp_place_change", args=[restaurant.pk])
        data = {**form_data(admin_client.get(url).content, "place_form"), "name": "Luigi", "_save": "Save"}
        assert admin_client.post(url, data).status_code == 302
        assert apply_update(str(request.request_id)) == "1 applied"
        row = Restaurant.objects.get(pk=restaurant.pk)
        assert (row.name, row.seats) == ("Luigi", 50)


# --- 19.2: the instance keeps the version its row carries ------------------------------------------------


@pytest.mark.django_db(transaction=True)
class TestAFailingReceiver:
    @pytest.mark.parametrize("model", [Profile, Restaurant], ids=["one table", "two tables"])
    def test_post_save_in_autocommit_keeps_the_committed_version(self, receiver: Any, model: Any) -> None:
        obj = model.objects.create(name="a")
        receiver(post_save, model, fail)
        obj.name = "b"
        with pytest.raises(RuntimeError):
            obj.save()
        row = model.objects.get(pk=obj.pk)
        assert row.name == "b"  # committed before post_save was sent
        assert (obj.lock_version, obj.field_versions) == (row.lock_version, row.field_versions)
        post_save.disconnect(fail, sender=model)
        obj.name = "c"
        obj.save()  # no false conflict
        assert model.objects.get(pk=obj.pk).name == "c"

    def test_pre_save_writes_nothing_and_keeps_the_loaded_version(self, receiver: Any) -> None:
        profile = Profile.objects.create(name="a")
        loaded = (profile.lock_version, dict(profile.field_versions))
        receiver(pre_save, Profile, fail)
        profile.name = "b"
        with pytest.raises(RuntimeError):
            profile.save()
        assert (profile.lock_version, profile.field_versions) == loaded
        assert Profile.objects.get(pk=profile.pk).name == "a"
        pre_save.disconnect(fail, sender=Profile)
        profile.save()
        assert Profile.objects.get(pk=profile.pk).name == "b"

    def test_post_save_in_a_transaction_that_commits(self, receiver: Any) -> None:
        profile = Profile.objects.create(name="a")
        receiver(post_save, Profile, fail)
        with transaction.atomic():
            profile.name = "b"
            with pytest.raises(RuntimeError):
                profile.save()
            # The caller caught it: its transaction holds the write, and decides.
            assert Profile.objects.get(pk=profile.pk).lock_version == profile.lock_version
        assert Profile.objects.get(pk=profile.pk).name == "b"  # as Django's save leaves it: written
        post_save.disconnect(fail, sender=Profile)
        assert_a_stale_copy_is_refused(profile)

    @pytest.mark.django_db(transaction=True, databases=["default", "tenant"])
    @pytest.mark.parametrize("named_by", ["using", "position", "loaded"])
    def test_post_save_in_a_transaction_of_the_database_the_save_writes(self, receiver: Any, named_by: str) -> None:
        """The transaction that decides is that of the database the save writes, not the router's plain
        answer: named by ``using=``, by position (Django 5.2), or, without either, the router's database
        for this instance (the one it was loaded from)."""
        if named_by == "position" and not DJANGO_TAKES_POSITIONS:
            pytest.skip("Django 6.0 takes save()'s arguments by keyword only")
        if named_by == "loaded":
            Profile.objects.using("tenant").create(name="a")
            profile = Profile.objects.using("tenant").get()
        else:
            profile = Profile(name="a")
        save = {
            "using": lambda: profile.save(using="tenant"),
            "position": lambda: profile.save(False, False, "tenant"),
            "loaded": profile.save,
        }[named_by]
        warned = pytest.warns(RemovedInDjango60Warning) if named_by == "position" else nullcontext()
        receiver(post_save, Profile, fail)
        with transaction.atomic(using="tenant"), pytest.raises(RuntimeError), warned:
            profile.name = "b"
            save()
        post_save.disconnect(fail, sender=Profile)
        row = Profile.objects.using("tenant").get(pk=profile.pk)
        assert (profile.lock_version, profile.field_versions) == (row.lock_version, row.field_versions)
        profile.name = "c"
        profile.save()  # no false conflict
        assert Profile.objects.using("tenant").get(pk=profile.pk).name == "c"

    def test_post_save_in_a_transaction_that_rolls_back(self, receiver: Any) -> None:
        profile = Profile.objects.create(name="a")
        receiver(post_save, Profile, fail)
        with pytest.raises(RuntimeError), transaction.atomic():
            profile.name = "b"
            profile.save()
        post_save.disconnect(fail, sender=Profile)
        assert Profile.objects.get(pk=profile.pk).name == "a"
        profile.name = "c"
        profile.save()  # the row carries the version before the rolled-back save: accepted
        assert Profile.objects.get(pk=profile.pk).name == "c"

    @pytest.mark.django_db(transaction=True, databases=["default", "tenant"])
    @pytest.mark.parametrize("alias", ["default", "tenant"])
    def test_a_child_table_that_fails_after_the_versions_were_written(self, alias: str, postgres_only: None) -> None:
        """The commit callback of Django's own transaction around the two tables is registered on the
        row's database, not on ``default``."""
        restaurant = Restaurant.objects.using(alias).create(name="a", seats=1)
        loaded = restaurant.lock_version
        # A value the app cannot know to be refused (out of range, it would be refused before any statement):
        # the database's own trigger refuses it.
        table = Restaurant._meta.db_table
        refuse = "IF NEW.seats = 13 THEN RAISE EXCEPTION 'no table 13'; END IF;"
        _create_profile_trigger("safeupdates_test_no_13", refuse, table=table, using=alias)
        try:
            restaurant.name, restaurant.seats = "b", 13  # the parent row is written, the child's UPDATE fails
            with pytest.raises(DatabaseError):
                restaurant.save()
        finally:
            _drop_profile_trigger("safeupdates_test_no_13", table=table, using=alias)
        assert restaurant.lock_version == loaded  # the save's transaction rolled back
        row = Restaurant.objects.using(alias).get(pk=restaurant.pk)
        assert (row.name, row.seats, row.lock_version) == ("a", 1, loaded)
        restaurant.seats = 2
        restaurant.save()
        assert Restaurant.objects.using(alias).get(pk=restaurant.pk).seats == 2


# --- 19.10, 24.2, 24.3: new instances, changed primary keys, children of loaded parents -------------------


class TestANewInstanceWithAPrimaryKey:
    def test_a_key_that_matches_no_row_inserts_in_one_statement(self, receiver: Any) -> None:
        created: list[bool] = []
        receiver(post_save, Tag, lambda **kwargs: created.append(kwargs["created"]))
        with CaptureQueriesContext(connection) as queries:
            Tag(code="new", label="x").save()
        assert Tag.objects.get(pk="new").label == "x"
        assert created == [True]
        if connection.vendor == "postgresql":
            assert verbs(queries) == ["WITH"]  # the INSERT; Django runs an UPDATE first

    def test_a_key_of_an_existing_row_is_refused(self) -> None:
        tag = Tag.objects.create(code="t", label="stored")
        blind = Tag(code="t", label="overwritten")
        for kwargs in ({}, {"force_update": True}):
            with pytest.raises(NeverLoadedError) as raised:
                blind.save(**kwargs)
            assert str(raised.value) == (
                "testapp.Tag pk='t' exists, and this instance never loaded it: there is no lock_version to "
                "check its save against. Load the row and change that instance, or write with "
                "update_if_newer() or with_lock()."
            )
            assert isinstance(raised.value, StaleObjectError)
        row = Tag.objects.get(pk="t")
        assert (row.label, row.lock_version) == ("stored", tag.lock_version)
        assert blind._state.adding and blind.lock_version == 0

    def test_a_refused_save_leaves_the_transaction_usable(self) -> None:
        Profile.objects.create(pk=10**9, name="stored")
        with transaction.atomic():
            with pytest.raises(NeverLoadedError):
                Profile(pk=10**9, name="blind").save()
            Profile.objects.create(name="after")
        assert Profile.objects.get(pk=10**9).name == "stored"
        assert Profile.objects.filter(name="after").exists()

    def test_force_update_of_a_key_that_matches_no_row_is_djangos_error(self) -> None:
        with pytest.raises(DatabaseError, match=r"^Forced update did not affect any rows\.$"), transaction.atomic():
            Tag(code="none", label="x").save(force_update=True)
        assert not Tag.objects.filter(pk="none").exists()

    def test_force_insert_over_an_existing_row_is_djangos_integrity_error(self) -> None:
        Tag.objects.create(code="t", label="stored")
        with pytest.raises(IntegrityError), transaction.atomic():
            Tag(code="t", label="x").save(force_insert=True)
        assert Tag.objects.get(pk="t").label == "stored"

    def test_a_key_taken_while_the_instance_was_new(self) -> None:
        """Created in Python, saved once (inserted), then saved again: now it is loaded and checked."""
        tag = Tag(code="t", label="a")
        tag.save()
        stale = Tag.objects.get(pk="t")
        tag.label = "b"
        tag.save()
        stale.label = "c"
        with pytest.raises(StaleObjectError) as raised:
            stale.save()
        assert not isinstance(raised.value, NeverLoadedError)
        assert Tag.objects.get(pk="t").label == "b"


class TestANewInstanceWithAVersionOfItsOwn:
    """An instance built with a ``lock_version`` (one a client carried) is checked against it."""

    def test_the_rows_version_saves(self) -> None:
        tag = Tag.objects.create(code="t", label="a")
        Tag(code="t", label="b", lock_version=tag.lock_version).save()
        assert Tag.objects.get(pk="t").label == "b"

    def test_another_version_is_stale(self) -> None:
        tag = Tag.objects.create(code="t", label="a")
        with pytest.raises(StaleObjectError) as raised, transaction.atomic():
            Tag(code="t", label="b", lock_version=tag.lock_version + 1000).save()
        assert not isinstance(raised.value, NeverLoadedError)
        assert Tag.objects.get(pk="t").label == "a"

    def test_no_row_inserts(self) -> None:
        given = next_version()
        Tag(code="t", label="b", lock_version=given).save()
        row = Tag.objects.get(pk="t")
        assert row.label == "b" and row.lock_version > given


def test_a_new_instance_whose_values_need_the_compiler_never_writes_over_a_row() -> None:
    """Django's own INSERT (a value is an expression): the key is looked for first, and the insert takes
    one version, as the one-statement INSERT does (``base._do_insert`` 47: the key not named; 50: a
    second version taken on SQLite, where the save took one before)."""
    from safeupdates.versions import last_issued

    specimen = Specimen.objects.create(text="stored")
    with pytest.raises(NeverLoadedError) as raised, transaction.atomic():
        Specimen(pk=specimen.pk, text=Lower(Value("BLIND"))).save()
    assert str(raised.value).startswith(f"testapp.Specimen pk={specimen.pk} exists, and this instance never loaded")
    before = last_issued()
    created = Specimen(pk=specimen.pk + 1000, text=Lower(Value("NEW")))
    created.save()
    assert created.lock_version == before + 1 == last_issued()
    assert Specimen.objects.get(pk=specimen.pk).text == "stored"
    assert Specimen.objects.get(pk=specimen.pk + 1000).text == "new"


@pytest.mark.django_db(transaction=True, databases=["default", "tenant"])
def test_a_new_instance_whose_values_need_the_compiler_writes_to_its_own_database() -> None:
    """``save(using=...)`` of another database than the router's: the key is looked for there, and the row
    inserted there (``base._do_insert`` 42, 56: both on the default database)."""
    Tag.objects.using("tenant").create(code="t", label="stored")
    with pytest.raises(NeverLoadedError):
        Tag(code="t", label=Lower(Value("BLIND"))).save(using="tenant")
    Tag(code="n", label=Lower(Value("NEW"))).save(using="tenant")
    assert list(Tag.objects.using("tenant").order_by("code").values_list("code", "label")) == [
        ("n", "new"),
        ("t", "stored"),
    ]
    assert not Tag.objects.using("default").exists()


class TestAChangedPrimaryKey:
    def test_the_same_key_given_as_text_is_the_same_row(self) -> None:
        profile = Profile.objects.create(name="a")
        profile.pk = str(profile.pk)
        profile.name = "b"
        profile.save()
        assert list(Profile.objects.values_list("name", flat=True)) == ["b"]

    def test_inserts_a_row_under_the_new_key_as_django_does(self, receiver: Any) -> None:
        created: list[bool] = []
        receiver(post_save, Tag, lambda **kwargs: created.append(kwargs["created"]))
        tag = Tag.objects.create(code="old", label="x")
        old_version = tag.lock_version
        created.clear()
        tag.code = "new"
        tag.label = "y"
        tag.save()
        assert created == [True]
        assert Tag.objects.get(pk="old").label == "x" and Tag.objects.get(pk="old").lock_version == old_version
        assert Tag.objects.get(pk="new").label == "y"
        assert tag.lock_version == Tag.objects.get(pk="new").lock_version > old_version
        tag.label = "z"
        tag.save()  # the instance is now the new row's, and checked against it
        assert Tag.objects.get(pk="new").label == "z"

    def test_a_new_key_that_exists_is_refused(self) -> None:
        Tag.objects.create(code="taken", label="kept")
        tag = Tag.objects.create(code="old", label="x")
        tag.code = "taken"
        with pytest.raises(NeverLoadedError):
            tag.save()
        assert Tag.objects.get(pk="taken").label == "kept"
        assert Tag.objects.filter(pk="old").exists()

    def test_reloaded_under_the_new_key_it_is_that_rows(self) -> None:
        Tag.objects.create(code="other", label="kept")
        tag = Tag.objects.create(code="old", label="x")
        tag.code = "other"
        tag.refresh_from_db()  # now the instance of row "other"
        tag.label = "changed"
        tag.save()
        assert Tag.objects.get(pk="other").label == "changed"

    def test_refreshed_and_given_a_new_key_it_inserts_a_row_under_it(self) -> None:
        """A refresh reloads the row of the instance's key: a key changed after it is a new row, as
        for an instance just loaded."""
        Tag.objects.create(code="old", label="x")
        tag = Tag.objects.get(pk="old")
        tag.refresh_from_db()
        tag.code = "new"
        tag.label = "y"
        tag.save()
        assert dict(Tag.objects.values_list("code", "label")) == {"old": "x", "new": "y"}

    def test_refresh_takes_djangos_arguments_by_position(self) -> None:
        tag = Tag.objects.create(code="old", label="x")
        Tag.objects.filter(pk="old").update(label="elsewhere")
        tag.label = "unsaved"
        tag.refresh_from_db(None, ["lock_version"])  # using, fields: only lock_version is reloaded
        assert tag.label == "unsaved"
        tag.refresh_from_db("default", ["label"])
        assert tag.label == "elsewhere"

    @pytest.mark.urls("tests.save_admin")
    def test_in_the_admin_change_form(self, admin_client: Any) -> None:
        Tag.objects.create(code="old", label="x")
        url = reverse("save_admin:testapp_tag_change", args=["old"])
        data = {**form_data(admin_client.get(url).content, "tag_form"), "code": "new", "_save": "Save"}
        response = admin_client.post(url, data)
        assert response.status_code == 302
        assert Tag.objects.get(pk="new").label == "x"
        assert Tag.objects.filter(pk="old").exists()  # as Django's admin leaves it


class TestANewInstanceRefreshedFromARow:
    """``Tag(code=...)`` then ``refresh_from_db()``: Django leaves ``_state.adding`` set, but the instance
    loaded its row (and its lock_version) as ``Tag.objects.get()`` would have: it is checked as loaded."""

    def refreshed(self, code: str) -> Tag:
        tag = Tag(code=code)
        tag.refresh_from_db()
        assert tag._state.adding  # Django's refresh_from_db() leaves it
        return tag

    def test_its_save_is_checked_against_the_row(self) -> None:
        Tag.objects.create(code="t", label="a")
        tag, other = self.refreshed("t"), Tag.objects.get(pk="t")
        tag.label = "b"
        tag.save()
        other.label = "c"
        with pytest.raises(StaleObjectError) as raised:
            other.save()
        assert not isinstance(raised.value, NeverLoadedError)
        assert Tag.objects.get(pk="t").label == "b"

    def test_a_row_deleted_since_is_stale_not_inserted_again(self) -> None:
        Tag.objects.create(code="t", label="a")
        tag = self.refreshed("t")
        Tag.objects.filter(pk="t").delete()
        tag.label = "b"
        with pytest.raises(StaleObjectError, match=r"^testapp.Tag pk='t' was deleted after it was loaded"):
            tag.save()
        assert not Tag.objects.filter(pk="t").exists()

    def test_a_new_key_that_exists_was_never_loaded(self) -> None:
        Tag.objects.create(code="t", label="a")
        Tag.objects.create(code="taken", label="kept")
        tag = self.refreshed("t")
        tag.code = "taken"
        with pytest.raises(NeverLoadedError, match=r"^testapp.Tag pk='taken' exists, and this instance never"):
            tag.save()
        assert dict(Tag.objects.values_list("code", "label")) == {"t": "a", "taken": "kept"}

    @pytest.mark.parametrize(
        ("args", "kwargs"), [((), {"fields": ["label"]}), ((), {"fields": ("code", "label")}), ((None, ["label"]), {})]
    )
    def test_refreshed_without_its_lock_version_it_never_loaded_the_row(self, args: Any, kwargs: Any) -> None:
        Tag.objects.create(code="t", label="a")
        tag = Tag(code="t")
        tag.refresh_from_db(*args, **kwargs)
        tag.label = "b"
        with pytest.raises(NeverLoadedError):
            tag.save()
        assert Tag.objects.get(pk="t").label == "a"

    @pytest.mark.parametrize(
        ("args", "kwargs"),
        [((), {"fields": ["label", "lock_version"]}), (("default", ["lock_version"]), {}), (("default",), {})],
    )
    def test_refreshed_with_its_lock_version_it_loaded_the_row(self, args: Any, kwargs: Any) -> None:
        """Django's arguments by name or by position (``using``, ``fields``): ``fields`` naming
        ``lock_version``, or none, reloads the version the instance's save is checked by."""
        Tag.objects.create(code="t", label="a")
        tag = Tag(code="t")
        tag.refresh_from_db(*args, **kwargs)
        Tag.objects.filter(pk="t").delete()
        tag.label = "b"
        with pytest.raises(StaleObjectError, match=r"^testapp.Tag pk='t' was deleted after it was loaded"):
            tag.save()
        assert not Tag.objects.filter(pk="t").exists()

    def test_a_new_key_that_matches_no_row_inserts_it_as_django_does(self) -> None:
        Tag.objects.create(code="t", label="a")
        tag = self.refreshed("t")
        tag.code, tag.label = "new", "b"
        tag.save()
        assert dict(Tag.objects.values_list("code", "label")) == {"t": "a", "new": "b"}


class TestAChildOfALoadedParent:
    def test_create_with_the_parent_link(self) -> None:
        place = Place.objects.create(name="corner", open=True)
        restaurant = Restaurant.objects.create(place_ptr=place, name="corner", open=True, seats=3)
        row = Restaurant.objects.get(pk=place.pk)
        assert (row.name, row.open, row.seats) == ("corner", True, 3)
        assert restaurant.lock_version == row.lock_version > place.lock_version
        restaurant.seats = 4
        restaurant.save()  # checked against the version the create wrote
        assert Restaurant.objects.get(pk=place.pk).seats == 4

    def test_the_parents_values_copied_onto_a_new_child(self) -> None:
        place = Place.objects.create(name="corner", open=True)
        restaurant = Restaurant(place_ptr=place, seats=5)
        for field in Place._meta.concrete_fields:
            setattr(restaurant, field.attname, getattr(place, field.attname))
        restaurant.save()
        row = Restaurant.objects.get(pk=place.pk)
        assert (row.name, row.open, row.seats) == ("corner", True, 5)

    def test_a_parent_refreshed_from_its_row_is_loaded(self) -> None:
        stored = Place.objects.create(name="corner", open=True)
        place = Place(pk=stored.pk)
        place.refresh_from_db()  # Django leaves place._state.adding set
        Restaurant.objects.create(place_ptr=place, name="corner", open=True, seats=3)
        assert Restaurant.objects.get(pk=stored.pk).seats == 3
        other = Place.objects.create(name="other")
        moved = Place(pk=other.pk)
        moved.refresh_from_db()
        Place.objects.update_if_newer(other.pk, version=next_version(), name="moved on")
        with pytest.raises(StaleObjectError) as raised, transaction.atomic():
            Restaurant.objects.create(place_ptr=moved, name="other", seats=3)
        assert not isinstance(raised.value, NeverLoadedError)
        assert Place.objects.get(pk=other.pk).name == "moved on"
        assert not Restaurant.objects.filter(pk=other.pk).exists()

    def test_a_parent_that_moved_on_is_stale(self) -> None:
        place = Place.objects.create(name="corner")
        Place.objects.update_if_newer(place.pk, version=next_version(), name="moved on")
        with pytest.raises(StaleObjectError) as raised, transaction.atomic():
            Restaurant.objects.create(place_ptr=place, name="corner", seats=3)
        assert not isinstance(raised.value, NeverLoadedError)
        assert not Restaurant.objects.filter(pk=place.pk).exists()
        assert Place.objects.get(pk=place.pk).name == "moved on"

    def test_a_parent_deleted_since_it_was_loaded_is_stale(self) -> None:
        """Creating the child would insert the parent's row again, undoing the delete."""
        place = Place.objects.create(name="corner")
        Place.objects.filter(pk=place.pk).delete()
        with pytest.raises(StaleObjectError, match="was deleted after it was loaded"), transaction.atomic():
            Restaurant.objects.create(place_ptr=place, name="corner", seats=3)
        assert not Place.objects.filter(pk=place.pk).exists()

    def test_a_parent_given_by_its_key_only_was_never_loaded(self) -> None:
        place = Place.objects.create(name="corner")
        with pytest.raises(NeverLoadedError), transaction.atomic():
            Restaurant.objects.create(place_ptr_id=place.pk, seats=3)
        assert not Restaurant.objects.filter(pk=place.pk).exists()
        assert Place.objects.get(pk=place.pk).name == "corner"

    def test_a_parent_loaded_without_its_version_was_never_loaded(self) -> None:
        """Its version would be read at the save, after any write that came in between."""
        place = Place.objects.create(name="corner")
        deferred = Place.objects.defer("lock_version").get(pk=place.pk)
        with pytest.raises(NeverLoadedError), transaction.atomic():
            Restaurant.objects.create(place_ptr=deferred, name="corner", seats=3)
        assert not Restaurant.objects.filter(pk=place.pk).exists()

    def test_a_copy_with_both_keys_cleared_inserts_new_rows(self) -> None:
        """Django's documented copy of a multi-table instance."""
        restaurant = Restaurant.objects.create(name="a", seats=3)
        first = restaurant.pk
        restaurant.pk = None
        restaurant.id = None
        restaurant._state.adding = True
        restaurant.save()
        assert restaurant.pk != first
        assert Restaurant.objects.filter(pk__in=[first, restaurant.pk]).count() == 2


# --- 19.12, 24.1: update_fields as Django takes it and passes it on ---------------------------------------


def test_update_fields_naming_no_field_is_djangos_value_error() -> None:
    profile = Profile.objects.create(name="a")
    profile.name = "b"
    with pytest.raises(ValueError) as raised:
        profile.save(update_fields=["no_such_field"])
    assert str(raised.value) == (
        "The following fields do not exist in this model, are m2m fields, primary keys, or are non-concrete "
        "fields: no_such_field"
    )
    assert Profile.objects.get(pk=profile.pk).name == "a"


@pytest.mark.parametrize(
    "update_fields", [None, ["name"], ("name", "score")], ids=["full save", "one field", "two fields"]
)
def test_signals_receive_the_callers_update_fields(receiver: Any, update_fields: Any) -> None:
    seen: list[Any] = []
    for signal in (pre_save, post_save):
        receiver(signal, Profile, lambda **kwargs: seen.append(kwargs["update_fields"]))
    profile = Profile.objects.create(name="a")
    seen.clear()
    profile.name = "b"
    profile.save(update_fields=update_fields)
    expected = None if update_fields is None else frozenset(update_fields)
    assert seen == [expected, expected]


def test_signals_of_a_deferred_save_receive_what_django_passes(receiver: Any) -> None:
    seen: list[Any] = []
    receiver(post_save, Profile, lambda **kwargs: seen.append(kwargs["update_fields"]))
    profile = Profile.objects.create(name="a")
    seen.clear()
    partial = Profile.objects.only("name", "lock_version").get(pk=profile.pk)
    partial.name = "b"
    partial.save()
    assert seen == [frozenset({"name", "lock_version"})]  # the loaded fields, as Django's save() computes them


@pytest.mark.skipif(not DJANGO_TAKES_POSITIONS, reason="Django 6.0 takes save()'s arguments by keyword only")
def test_update_fields_given_by_position_mark_only_those_fields(redis: Any) -> None:
    """``save(False, False, None, ["name"])`` writes ``name`` only: marking the whole row would make a
    queued request for another field stale."""
    profile = Profile.objects.create(name="a")
    request = enqueue_update(profile, active=True)
    profile.name = "b"
    with pytest.warns(RemovedInDjango60Warning):
        profile.save(False, False, None, ["name"])
    assert profile.field_versions == Profile.objects.get(pk=profile.pk).field_versions
    assert set(profile.field_versions) == {BASE_VERSION_KEY, "name"}
    assert apply_update(str(request.request_id)) == "1 applied"
    row = Profile.objects.get(pk=profile.pk)
    assert (row.name, row.active) == ("b", True)


def test_an_empty_update_fields_by_position_is_passed_on_as_given() -> None:
    """Django saves nothing, after its own warning (5.2) or its TypeError (6.0 and later)."""
    profile = Profile.objects.create(name="a")
    profile.name = "b"
    expected = pytest.warns(RemovedInDjango60Warning) if DJANGO_TAKES_POSITIONS else pytest.raises(TypeError)
    with expected:
        profile.save(False, False, None, [])
    assert Profile.objects.get(pk=profile.pk).name == "a"


@pytest.mark.skipif(DJANGO_TAKES_POSITIONS, reason="Django 5.2 still takes save()'s arguments by position")
def test_arguments_by_position_are_djangos_type_error_and_write_nothing() -> None:
    profile = Profile.objects.create(name="a")
    profile.name = "b"
    with pytest.raises(TypeError):
        profile.save(False, False, None, ["name"])
    assert Profile.objects.get(pk=profile.pk).name == "a"


# --- 19.4: statements follow the model's table, not its class --------------------------------------------


@contextmanager
def moved_gadget_table() -> Iterator[None]:
    """``Gadget`` stored in a second table meanwhile (as a multi-tenant app switches schemas)."""
    original = Gadget._meta.db_table

    def move(table: str) -> None:
        Gadget._meta.db_table = table
        for field in Gadget._meta.concrete_fields:
            field.__dict__.pop("cached_col", None)  # Django's own queries name the column by its table

    move("testapp_gadget_moved")
    try:
        with connection.schema_editor() as editor:
            editor.create_model(Gadget)
        yield
        with connection.schema_editor() as editor:
            editor.delete_model(Gadget)
    finally:
        move(original)


def gadgets_in(table: str) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT label, count FROM {connection.ops.quote_name(table)} ORDER BY label")
        return list(cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_a_model_whose_table_changes_is_written_to_its_new_table() -> None:
    def every_write(label: str) -> None:
        gadget = Gadget.objects.create(label=label)  # INSERT
        gadget.count = 1
        gadget.save()  # UPDATE
        gadget.count = 2
        gadget.save(update_fields=["count"])
        Gadget.objects.update_if_newer(gadget.pk, version=next_version(), count=3)
        Gadget.objects.bulk_update_if_newer([(gadget.pk, next_version(), {"count": 4})])
        Gadget.objects.create(label=f"{label} doomed").delete()

    every_write("first")  # every statement built and cached for the first table
    assert gadgets_in("testapp_gadget") == [("first", 4)]
    with moved_gadget_table():
        every_write("second")
        assert gadgets_in("testapp_gadget_moved") == [("second", 4)]
    assert gadgets_in("testapp_gadget") == [("first", 4)]


@contextmanager
def renamed_count_column() -> Iterator[None]:
    """``Gadget.count`` stored in a column renamed meanwhile (``db_column`` changed at run time)."""
    field = Gadget._meta.get_field("count")

    def rename(column: str | None) -> None:
        old = copy.copy(field)
        field.db_column = column
        field.set_attributes_from_name(field.name)  # the column follows db_column
        field.__dict__.pop("cached_col", None)
        with connection.schema_editor() as editor:
            editor.alter_field(Gadget, old, field)

    rename("tally")
    try:
        yield
    finally:
        rename(None)


@pytest.mark.django_db(transaction=True)
def test_a_field_whose_column_changes_is_written_to_its_new_column() -> None:
    """The statement caches are keyed by the columns they name, not by the model and field names."""
    gadget = Gadget.objects.create(label="g")

    def every_write(count: int) -> None:
        gadget.count = count
        gadget.save()
        gadget.save(update_fields=["count"])
        Gadget.objects.update_if_newer(gadget.pk, version=next_version(), count=count + 1)
        Gadget.objects.bulk_update_if_newer([(gadget.pk, next_version(), {"count": count + 2})])
        gadget.refresh_from_db()

    every_write(1)  # every statement built and cached for the first column
    with renamed_count_column():
        every_write(10)
        with connection.cursor() as cursor:
            cursor.execute("SELECT tally FROM testapp_gadget WHERE id = %s", [gadget.pk])
            assert cursor.fetchone() == (12,)
        Gadget.objects.create(label="doomed").delete()
    assert Gadget.objects.get(pk=gadget.pk).count == 12


# --- 24.4, 24.5: the statements Django runs, and its transaction semantics --------------------------------


@pytest.mark.django_db(transaction=True)
class TestStatements:
    """Outside a transaction, a save runs what Django's runs, or less; the check rides in it."""

    def run(self, operation: Any) -> list[str]:
        """The statements ``operation`` runs, by their first word."""
        with CaptureQueriesContext(connection) as queries:
            operation()
        return verbs(queries)

    def test_a_deferred_save_reads_nothing_back(self, postgres_only: None) -> None:
        profile = Profile.objects.create(name="a")
        partial = Profile.objects.only("name", "lock_version").get(pk=profile.pk)
        partial.name = "b"
        assert self.run(partial.save) == ["WITH"]
        assert "field_versions" not in partial.get_deferred_fields()  # the statement returned it
        assert partial.field_versions == Profile.objects.get(pk=profile.pk).field_versions

    def test_a_new_instance_with_a_key_of_its_own(self, postgres_only: None) -> None:
        assert self.run(Specimen(pk=10**9, text="a").save) == ["WITH"]
        assert self.run(lambda: models.Model.save(PlainSpecimen(pk=10**9, text="a"))) == ["UPDATE", "INSERT"]

    def test_a_key_from_the_database_default(self, postgres_only: None) -> None:
        with CaptureQueriesContext(connection) as queries:
            stamp = Stamp.objects.create(note="a")
        assert verbs(queries) == ["WITH"]
        row = Stamp.objects.get(pk=stamp.pk)
        assert row.note == "a" and stamp.lock_version == row.lock_version > 0
        assert row.field_versions == {BASE_VERSION_KEY: row.lock_version}

    def test_a_save_in_a_transaction_takes_no_savepoint(self, postgres_only: None) -> None:
        profile = Profile.objects.create(name="a")
        with transaction.atomic():
            profile.name = "b"
            assert self.run(profile.save) == ["WITH"]
            stale = Profile.objects.get(pk=profile.pk)
            profile.save()
            stale.name = "c"
            with CaptureQueriesContext(connection) as queries, pytest.raises(StaleObjectError):
                stale.save()
            assert verbs(queries) == ["WITH", "SELECT"]  # the check, then: changed, or deleted?
            assert Profile.objects.get(pk=profile.pk).name == "b"  # the transaction is usable
        assert Profile.objects.get(pk=profile.pk).name == "b"

    def test_a_delete_with_cascades_runs_what_django_runs(self, postgres_only: None) -> None:
        ours, djangos = (Document.objects.create(title=title) for title in ("ours", "django's"))
        for document in (ours, djangos):
            Chapter.objects.create(document=document, title="c")
        ran = self.run(ours.delete)
        assert ran == self.run(lambda: models.Model.delete(djangos))
        assert ran.count("DELETE") == 2 and "SAVEPOINT" not in ran  # the chapters', the document's

    def test_a_delete_whose_receivers_watch_what_goes_after_the_row_runs_what_django_runs(
        self, receiver: Any, postgres_only: None
    ) -> None:
        """Users (a nullable foreign key: no order needed) are deleted after their avatar: the check rides
        in the avatar's DELETE, before any receiver runs. Django's test_can_defer_constraint_checks."""
        receiver(post_delete, User, lambda **kwargs: None)
        ours, djangos = (Avatar.objects.create(desc=desc) for desc in ("ours", "django's"))
        for avatar in (ours, djangos):
            User.objects.create(avatar=avatar)
        ran = self.run(ours.delete)
        assert (
            ran == self.run(lambda: models.Model.delete(djangos)) == ["SELECT", "BEGIN", "DELETE", "DELETE", "COMMIT"]
        )

    def test_a_stale_delete_refused_before_the_receivers_of_what_goes_after_it(self, receiver: Any) -> None:
        seen: list[Any] = []
        receiver(post_delete, User, lambda instance, **kwargs: seen.append(instance.pk))
        current = Avatar.objects.create(desc="a")
        user = User.objects.create(avatar=current)
        stale = Avatar.objects.get(pk=current.pk)
        current.save()
        with pytest.raises(StaleObjectError):
            stale.delete()
        assert seen == [] and User.objects.filter(pk=user.pk).exists() and stale.pk == current.pk
        assert current.delete() == (2, {"django_contract.Avatar": 1, "django_contract.User": 1})
        assert seen == [user.pk]

    @pytest.mark.parametrize("signal", [pre_delete, post_delete])
    def test_a_delete_watched_by_a_receiver_that_runs_before_the_row_is_deleted_locks_it_first(
        self, receiver: Any, signal: Any, postgres_only: None
    ) -> None:
        """A documented difference (Limits): one UPDATE more, so that no receiver runs for a refused delete.
        A pre_delete receiver runs before any DELETE; the chapters are deleted before their document."""
        receiver(signal, Chapter, lambda **kwargs: None)
        ours, djangos = (Document.objects.create(title=title) for title in ("ours", "django's"))
        for document in (ours, djangos):
            Chapter.objects.create(document=document, title="c")
        ran, django = self.run(ours.delete), self.run(lambda: models.Model.delete(djangos))
        assert ran[ran.index("BEGIN") + 1] == "UPDATE"
        ran.remove("UPDATE")
        assert ran == django

    @pytest.mark.django_db(transaction=True, databases=["default", "tenant"])
    @pytest.mark.parametrize("alias", ["default", "tenant"])
    def test_the_row_locked_first_stays_locked_until_its_delete_on_its_own_database(
        self, alias: str, postgres_only: None
    ) -> None:
        """The lock's UPDATE and the collector's deletes are one transaction on the row's database: a
        receiver that runs before the DELETE finds the row held (another connection cannot lock it)."""
        document = Document.objects.using(alias).create(title="d")
        Chapter.objects.using(alias).create(document=document, title="c")
        held: list[bool] = []

        def before_the_delete(**kwargs: Any) -> None:
            held.append(locked_elsewhere(Document, document.pk, alias))

        pre_delete.connect(before_the_delete, sender=Document, weak=False)
        try:
            assert document.delete() == (2, {"testapp.Chapter": 1, "testapp.Document": 1})
        finally:
            pre_delete.disconnect(before_the_delete, sender=Document)
        assert held == [True]

    def test_a_delete_with_cascades_in_a_transaction_locks_the_row_first(self, postgres_only: None) -> None:
        """A documented difference (Limits): one UPDATE more instead of a savepoint's two statements."""
        ours, djangos = (Document.objects.create(title=title) for title in ("ours", "django's"))
        for document in (ours, djangos):
            Chapter.objects.create(document=document, title="c")
        with transaction.atomic():
            ran, django = self.run(ours.delete), self.run(lambda: models.Model.delete(djangos))
        assert ran[0] == "UPDATE" and ran[1:] == django and "SAVEPOINT" not in django

    def test_update_fields_of_a_childs_own_fields_is_one_statement(self, postgres_only: None) -> None:
        """The parent's row holds the versions and the check: its UPDATE rides in the child's statement."""
        ours, djangos = Restaurant.objects.create(name="a"), Restaurant.objects.create(name="b")
        loaded = ours.lock_version
        ours.seats = djangos.seats = 5
        assert self.run(lambda: ours.save(update_fields=["seats"])) == ["BEGIN", "WITH", "COMMIT"]
        assert self.run(lambda: models.Model.save(djangos, update_fields=["seats"])) == ["BEGIN", "UPDATE", "COMMIT"]
        row = Restaurant.objects.get(pk=ours.pk)
        assert row.seats == 5 and row.lock_version == ours.lock_version > loaded
        assert row.field_versions == ours.field_versions == {BASE_VERSION_KEY: loaded, "seats": ours.lock_version}

    def test_update_fields_of_each_table_of_three(self, postgres_only: None) -> None:
        restaurant = ItalianRestaurant.objects.create(name="a", address="x")
        restaurant.serves_pizza = True
        assert self.run(lambda: restaurant.save(update_fields=["serves_pizza"])) == ["BEGIN", "WITH", "COMMIT"]
        restaurant.serves_gnocchi = True
        assert self.run(lambda: restaurant.save(update_fields=["serves_gnocchi"])) == ["BEGIN", "WITH", "COMMIT"]
        restaurant.serves_pizza = restaurant.serves_gnocchi = False
        both = ["serves_pizza", "serves_gnocchi"]
        assert self.run(lambda: restaurant.save(update_fields=both)) == ["BEGIN", "WITH", "UPDATE", "COMMIT"]
        row = ItalianRestaurant.objects.get(pk=restaurant.pk)
        assert (row.serves_pizza, row.serves_gnocchi) == (False, False)
        assert row.lock_version == restaurant.lock_version
        assert row.field_version("serves_pizza") == row.field_version("serves_gnocchi") == row.lock_version
        assert row.field_version("name") < row.lock_version

    def test_a_deferred_save_of_a_childs_fields_is_one_statement(self, postgres_only: None) -> None:
        restaurant = Restaurant.objects.create(name="a")
        partial = Restaurant.objects.only("seats", "lock_version").get(pk=restaurant.pk)
        partial.seats = 7
        assert self.run(partial.save) == ["BEGIN", "WITH", "COMMIT"]
        row = Restaurant.objects.get(pk=restaurant.pk)
        assert row.seats == 7 and row.field_versions == {
            BASE_VERSION_KEY: restaurant.lock_version,
            "seats": partial.lock_version,
        }

    def test_a_childs_value_that_needs_the_compiler_checks_the_parents_row_first(self, postgres_only: None) -> None:
        """A documented difference (Limits): one UPDATE more, the parent's, for an expression."""
        restaurant = Restaurant.objects.create(name="a", seats=1)
        restaurant.seats = models.F("seats") + 1
        assert self.run(lambda: restaurant.save(update_fields=["seats"])) == ["BEGIN", "WITH", "UPDATE", "COMMIT"]
        assert Restaurant.objects.get(pk=restaurant.pk).seats == 2

    @pytest.mark.parametrize("value", [5, models.F("seats") + 5], ids=["value", "expression"])
    def test_a_stale_save_of_a_childs_fields_writes_nothing(self, value: Any) -> None:
        restaurant = Restaurant.objects.create(name="a", seats=1)
        stale = Restaurant.objects.get(pk=restaurant.pk)
        restaurant.save()
        stale.seats = value
        with pytest.raises(StaleObjectError) as raised:
            stale.save(update_fields=["seats"])
        assert str(raised.value) == (  # checked per field: the message names the field written since
            f"testapp.Restaurant pk={restaurant.pk!r} was changed after this instance read seats; reload it with "
            "refresh_from_db() and apply your change again."
        )
        row = Restaurant.objects.get(pk=restaurant.pk)
        assert row.seats == 1 and row.lock_version == restaurant.lock_version

    def test_a_save_of_a_childs_fields_after_its_row_was_deleted_is_djangos_error(self) -> None:
        restaurant = Restaurant.objects.create(name="a", seats=1)
        Restaurant.objects.get(pk=restaurant.pk).delete(keep_parents=True)
        restaurant.seats = 2
        with pytest.raises(DatabaseError) as raised:
            restaurant.save(update_fields=["seats"])
        assert str(raised.value) == "Save with update_fields did not affect any rows."
        assert restaurant.lock_version == Place.objects.get(pk=restaurant.pk).lock_version  # rolled back

    def test_a_row_with_cascades_deleted_already_is_no_error(self) -> None:
        document = Document.objects.create(title="d")
        Chapter.objects.create(document=document, title="c")
        Document.objects.filter(pk=document.pk).delete()
        assert document.delete() == (0, {})

    def test_a_child_of_a_plain_parent_is_locked_first(self) -> None:
        truck = Truck.objects.create(load=1)
        stale = Truck.objects.get(pk=truck.pk)
        truck.save()
        with pytest.raises(StaleObjectError):
            stale.delete()
        assert truck.delete() == (2, {"testapp.Truck": 1, "testapp.Vehicle": 1})

    def test_a_child_deleted_without_its_parent_is_locked_first(self) -> None:
        restaurant = Restaurant.objects.create(name="a")
        stale = Restaurant.objects.get(pk=restaurant.pk)
        restaurant.save()
        with pytest.raises(StaleObjectError):
            stale.delete(keep_parents=True)
        pk = restaurant.pk
        assert restaurant.delete(keep_parents=True) == (1, {"testapp.Restaurant": 1})
        assert Place.objects.filter(pk=pk).exists() and not Restaurant.objects.filter(pk=pk).exists()

    def test_a_stale_delete_of_a_child_deletes_nothing(self) -> None:
        restaurant = Restaurant.objects.create(name="a", seats=1)
        stale = Restaurant.objects.get(pk=restaurant.pk)
        restaurant.save()
        with pytest.raises(StaleObjectError):
            stale.delete()  # its own row was deleted first, in the transaction the refusal rolls back
        assert Restaurant.objects.get(pk=restaurant.pk).seats == 1 and stale.pk == restaurant.pk

    def test_a_stale_delete_of_a_proxy_deletes_nothing(self) -> None:
        """A proxy's delete goes through the collector under the proxy's key (the versions are in its
        concrete model's table): checked all the same."""
        profile = ProfileFactory()
        stale = ActiveOnlyProfile.objects.get(pk=profile.pk)
        profile.name = "moved on"
        profile.save()
        with pytest.raises(StaleObjectError):
            stale.delete()
        assert Profile.objects.get(pk=profile.pk).name == "moved on" and stale.pk == profile.pk
        fresh = ActiveOnlyProfile.objects.get(pk=profile.pk)
        assert fresh.delete() == (1, {"testapp.ActiveOnlyProfile": 1})
        assert not Profile.objects.filter(pk=profile.pk).exists()

    def stale_document(self) -> tuple[Document, Document]:
        """A document with a chapter, and an instance of it loaded before its last save."""
        current = Document.objects.create(title="d")
        Chapter.objects.create(document=current, title="c")
        stale = Document.objects.get(pk=current.pk)
        current.save()
        return current, stale

    def test_a_stale_delete_with_cascades_deletes_nothing(self) -> None:
        current, stale = self.stale_document()
        with pytest.raises(StaleObjectError):
            stale.delete()
        assert Chapter.objects.filter(document=current).count() == 1 and stale.pk == current.pk

    def test_a_delete_of_a_child_runs_what_django_runs(self, postgres_only: None) -> None:
        ours, djangos = Restaurant.objects.create(name="a"), Restaurant.objects.create(name="b")
        assert self.run(ours.delete) == self.run(lambda: models.Model.delete(djangos))

    def test_a_delete_with_receivers_checks_before_any_receiver_runs(self, receiver: Any) -> None:
        seen: list[Any] = []
        receiver(post_delete, Chapter, lambda instance, **kwargs: seen.append(instance.pk))
        current, stale = self.stale_document()
        with pytest.raises(StaleObjectError):
            stale.delete()
        assert seen == [] and Chapter.objects.filter(document=current).count() == 1
        assert current.delete() == (2, {"testapp.Chapter": 1, "testapp.Document": 1})
        assert len(seen) == 1

    def test_an_integrity_error_breaks_the_transaction_as_in_django(self) -> None:
        """Django's test_atomic_prevents_queries_in_broken_transaction, on a model with the mixin."""
        first = Profile.objects.create(name="Archibald")
        with transaction.atomic():
            second = Profile(pk=first.pk, name="Cuthbert")
            with pytest.raises(IntegrityError):
                second.save(force_insert=True)
            with pytest.raises(transaction.TransactionManagementError) as raised:
                second.save(force_update=True)
            assert isinstance(raised.value.__cause__, IntegrityError)
        assert Profile.objects.get(pk=first.pk).name == "Archibald"

    def test_a_stale_save_of_a_child_leaves_the_transaction_usable(self) -> None:
        restaurant = Restaurant.objects.create(name="a", seats=1)
        stale = Restaurant.objects.get(pk=restaurant.pk)
        restaurant.save()
        with transaction.atomic():
            stale.seats = 9
            with pytest.raises(StaleObjectError):
                stale.save()
            Profile.objects.create(name="after")
        assert Restaurant.objects.get(pk=restaurant.pk).seats == 1
        assert Profile.objects.filter(name="after").exists()

    def test_a_stale_save_after_a_plain_parents_table_undoes_that_write(self) -> None:
        truck = Truck.objects.create(wheels=6, load=1)
        stale = Truck.objects.get(pk=truck.pk)
        truck.save()
        with transaction.atomic():
            stale.wheels, stale.load = 8, 2
            with pytest.raises(StaleObjectError):
                stale.save()  # the vehicle table was written first: its savepoint undoes that
            Profile.objects.create(name="after")
        row = Truck.objects.get(pk=truck.pk)
        assert (row.wheels, row.load) == (6, 1)
        assert Profile.objects.filter(name="after").exists()


@pytest.mark.django_db(transaction=True)
def test_a_childs_fields_saved_while_the_parent_is_written_are_stale(postgres_only: None) -> None:
    """The one-statement save of a child's fields waits for a concurrent save's lock on the parent's row,
    then sees on the committed row that it moved on (READ COMMITTED's recheck): refused, both rows left
    as the other save wrote them."""
    from tests.workers import lock_waiters, wait_until

    restaurant = Restaurant.objects.create(name="a", seats=1)
    mine = Restaurant.objects.get(pk=restaurant.pk)
    written, release = threading.Event(), threading.Event()
    waited: list[bool] = []

    def other_save() -> None:
        try:
            with transaction.atomic():
                theirs = Restaurant.objects.get(pk=restaurant.pk)
                theirs.name, theirs.seats = "theirs", 3
                theirs.save()
                written.set()
                release.wait(30)
        finally:
            connections.close_all()

    def commit_once_mine_waits() -> None:
        try:
            waited.append(wait_until(lambda: lock_waiters(), timeout=30))
        finally:
            release.set()
            connections.close_all()

    other = threading.Thread(target=other_save)
    other.start()
    assert written.wait(30)
    releaser = threading.Thread(target=commit_once_mine_waits)
    releaser.start()
    mine.seats = 2
    try:
        with pytest.raises(StaleObjectError):
            mine.save(update_fields=["seats"])
    finally:
        releaser.join(30)
        other.join(30)
    assert waited == [True]  # mine waited for the lock, and was refused on the row as committed
    row = Restaurant.objects.get(pk=restaurant.pk)
    assert (row.name, row.seats) == ("theirs", 3)


@pytest.mark.django_db
@pytest.mark.parametrize("how", [{}, {"update_fields": ["name"]}, {"force_update": True}])
def test_a_never_loaded_instance_refreshed_then_given_another_rows_key_is_never_loaded(how: dict[str, Any]) -> None:
    """Issue 42's loose end: ``Profile(pk=a)`` refreshed from row ``a``, then given row ``b``'s key,
    never loaded ``b``: ``NeverLoadedError`` (what a loaded instance given another key gets), not "was
    changed after it was loaded". Already so since a refresh counts as loading its own row."""
    a, b = ProfileFactory(name="a"), ProfileFactory(name="b")
    instance = Profile(pk=a.pk)
    instance.refresh_from_db()
    instance.pk, instance.name = b.pk, "x"
    with pytest.raises(
        NeverLoadedError, match=rf"^testapp.Profile pk={b.pk} exists, and this instance never loaded it"
    ):
        instance.save(**how)
    assert Profile.objects.get(pk=b.pk).name == "b"
