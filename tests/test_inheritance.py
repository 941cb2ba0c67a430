"""Multi-table inheritance: the parent table holds the versions, the child table more fields (item 8)."""

from __future__ import annotations

import threading
import uuid
from contextlib import nullcontext
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from safeupdates.exceptions import StaleObjectError
from safeupdates.jobs import apply_update
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.testapp.models import Place, Profile, Restaurant

pytestmark = pytest.mark.django_db


@pytest.fixture
def restaurant() -> Restaurant:
    return Restaurant.objects.create(name="Luigi's", seats=10)


def row(pk) -> Restaurant:
    return Restaurant.objects.get(pk=pk)


def test_a_child_saves_and_is_checked(restaurant):
    restaurant.seats = 12
    restaurant.name = "Luigi"
    restaurant.save()
    stale = row(restaurant.pk)
    restaurant.serves_pizza = True
    restaurant.save(update_fields=["serves_pizza"])
    assert row(restaurant.pk).lock_version == restaurant.lock_version
    stale.seats, stale.serves_pizza = 99, False
    with pytest.raises(StaleObjectError):
        stale.save()
    with pytest.raises(StaleObjectError):  # serves_pizza was written after it was read
        stale.save(update_fields=["serves_pizza"])
    current = row(restaurant.pk)
    assert (current.name, current.seats, current.serves_pizza) == ("Luigi", 12, True)
    stale.save(update_fields=["seats"])  # seats was not: checked per field, it lands (issue 53)
    current = row(restaurant.pk)
    assert (current.name, current.seats, current.serves_pizza) == ("Luigi", 99, True)


def test_a_parent_instance_of_a_child_row_is_checked_too(restaurant):
    place = Place.objects.get(pk=restaurant.pk)
    restaurant.seats = 20
    restaurant.save()
    place.name = "renamed"
    with pytest.raises(StaleObjectError):
        place.save()
    assert row(restaurant.pk).name == "Luigi's"


def test_update_if_newer_writes_fields_of_both_tables(restaurant):
    older, version = next_version(), next_version()
    result = Restaurant.objects.update_if_newer(restaurant.pk, version=version, name="Mario's", seats=30)
    assert result.applied
    current = row(restaurant.pk)
    assert (current.name, current.seats) == ("Mario's", 30)
    assert current.field_version("seats") == current.field_version("name") == version
    assert current.lock_version > version
    # Older requests lose per field, in either table; a field of either table is still open to them.
    assert Restaurant.objects.update_if_newer(restaurant.pk, version=older, seats=1).outcome == "stale"
    assert Restaurant.objects.update_if_newer(restaurant.pk, version=older, serves_pizza=True).outcome == "applied"
    current = row(restaurant.pk)
    assert (current.seats, current.serves_pizza) == (30, True)


def test_update_if_newer_with_a_request_id_on_a_child(restaurant):
    rid = uuid.uuid4()
    version = next_version()
    assert Restaurant.objects.update_if_newer(restaurant.pk, version=version, request_id=rid, seats=5).applied
    assert Restaurant.objects.update_if_newer(restaurant.pk, version=version, request_id=rid, seats=5).outcome == (
        "duplicate"
    )
    assert ProcessedRequest.objects.get(request_id=rid).status == "applied"
    assert row(restaurant.pk).seats == 5


def test_the_job_applies_requests_to_a_child(restaurant, redis):
    from safeupdates import enqueue_update

    first = enqueue_update(restaurant, seats=7, open=True)
    second = enqueue_update(restaurant, seats=8)
    assert apply_update(str(first.request_id)) == "2 applied"
    current = row(restaurant.pk)
    assert (current.seats, current.open) == (8, True)
    assert current.field_version("seats") == second.version
    assert set(ProcessedRequest.objects.values_list("status", flat=True)) == {"applied"}


def test_missing_child_row_is_missing():
    result = Restaurant.objects.update_if_newer(10**9, version=next_version(), seats=1)
    assert result.outcome == "missing"


def test_bulk_update_on_a_child(restaurant):
    other = Restaurant.objects.create(name="b")
    version = next_version()
    result = Restaurant.objects.bulk_update_if_newer(
        [(restaurant.pk, version, {"seats": 3, "name": "x"}), (other.pk, version, {"serves_pizza": True})]
    )
    assert (result.applied, result.stale, result.missing) == (2, 0, 0)
    assert row(restaurant.pk).seats == 3
    assert row(other.pk).serves_pizza is True
    result = Restaurant.objects.bulk_update_if_newer([(restaurant.pk, version - 1, {"seats": 4})])
    assert (result.applied, result.stale) == (0, 1)


def test_timestamp_mode_on_a_child_locks_decides_and_sets_the_timestamp(restaurant):
    """The child's rows are locked, decided and written per table, the timestamp too (mutation survivors:
    timestamp mode on a child was not tested, so dropping its guard or its write went unnoticed)."""
    synced = timezone.now()
    assert row(restaurant.pk).last_synced_at is None
    assert Restaurant.objects.update_if_newer(restaurant.pk, synced_at=synced, seats=5, name="Mario's").applied
    current = row(restaurant.pk)
    assert (current.seats, current.name, current.last_synced_at) == (5, "Mario's", synced)
    for older_or_same in (synced - timedelta(seconds=1), synced):
        result = Restaurant.objects.update_if_newer(restaurant.pk, synced_at=older_or_same, seats=6, open=True)
        assert result.outcome == "stale"
    current = row(restaurant.pk)
    assert (current.seats, current.open, current.last_synced_at) == (5, False, synced)
    newer = synced + timedelta(seconds=1)
    assert Restaurant.objects.update_if_newer(restaurant.pk, synced_at=newer, open=True).applied
    assert (row(restaurant.pk).open, row(restaurant.pk).last_synced_at) == (True, newer)


@pytest.mark.django_db(transaction=True, databases=["default", "tenant"])
def test_update_if_newer_on_a_child_in_another_database():
    """The rows are locked and written on the manager's database, not on ``default``."""
    restaurant = Restaurant.objects.using("tenant").create(name="Luigi's", seats=10)
    version = next_version("tenant")
    assert Restaurant.objects.using("tenant").update_if_newer(restaurant.pk, version=version, seats=3).applied
    assert Restaurant.objects.using("tenant").get(pk=restaurant.pk).seats == 3
    assert not Restaurant.objects.using("default").filter(pk=restaurant.pk).exists()


def test_a_write_to_a_child_takes_its_version_in_the_update(restaurant, postgres_only):
    """Lock, then one UPDATE per table; on PostgreSQL the fresh ``lock_version`` is taken in the UPDATE, not by
    a statement of its own (a mutation survivor: one more round trip per write went unnoticed)."""
    version = next_version()  # handed out by this process: checking it costs no query
    with CaptureQueriesContext(connection) as queries:
        assert Restaurant.objects.update_if_newer(restaurant.pk, version=version, seats=3, name="x").applied
    verbs = [q["sql"].split()[0] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert verbs == ["SELECT", "UPDATE", "UPDATE"]


@pytest.mark.django_db(transaction=True, databases=["default", "tenant"])
@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "atomic"])
def test_a_stale_delete_in_another_database_is_refused(in_transaction):
    """The delete's check and lock run on the instance's database, not on ``default`` (mutation
    survivors: checking there found no row, took the delete as a no-op's and deleted unchecked)."""
    from django.db import transaction

    for model in (Profile, Restaurant):  # a delete that nothing cascades from, and a parent's and child's
        stale = model.objects.using("tenant").create(name="a")
        moved = model.objects.using("tenant").get(pk=stale.pk)
        moved.name = "b"
        moved.save()
        inside = transaction.atomic(using="tenant") if in_transaction else nullcontext()
        with pytest.raises(StaleObjectError), inside:
            stale.delete()
        assert model.objects.using("tenant").filter(pk=stale.pk).exists()


@pytest.mark.django_db(transaction=True, databases=["default", "tenant"])
@pytest.mark.parametrize("alias", ["default", "tenant"])
def test_bulk_update_on_children_past_a_missing_one_and_in_another_database(alias):
    """A missing row does not end the batch, and the versions are read on the manager's database
    (mutation survivors: ``break`` for ``continue``, and reading ``default``, went unnoticed)."""
    restaurants = Restaurant.objects.using(alias)
    first, gone, second = (restaurants.create(name=name) for name in "abc")
    missing = gone.pk  # between the two others, in the order the rows are written
    gone.delete()
    version = next_version(alias)
    result = restaurants.bulk_update_if_newer(
        [(first.pk, version, {"seats": 1}), (missing, version, {"seats": 2}), (second.pk, version, {"seats": 3})]
    )
    assert (result.applied, result.stale, result.missing) == (2, 0, 1)
    assert sorted(restaurants.values_list("seats", flat=True)) == [1, 3]


@pytest.mark.django_db(transaction=True)
def test_a_write_to_a_child_leaves_its_rows_open_to_key_share_locks(postgres_only):
    """The rows are locked ``FOR NO KEY UPDATE``, as an UPDATE that keeps the key locks them: an insert of
    a row that references one (a foreign key check takes ``FOR KEY SHARE``) need not wait for the write's
    transaction, as it would behind ``FOR UPDATE``."""
    restaurant = Restaurant.objects.create(name="Luigi's", seats=10)
    refused: list[str] = []

    def key_share() -> None:
        try:
            for model in (Place, Restaurant):
                table, key = model._meta.db_table, model._meta.pk.column
                with connections["default"].cursor() as cursor:
                    try:
                        cursor.execute(
                            f'SELECT 1 FROM "{table}" WHERE "{key}" = %s FOR KEY SHARE NOWAIT', [restaurant.pk]
                        )
                    except OperationalError as exc:
                        refused.append(f"{table}: {exc}")
        finally:
            connections.close_all()

    with transaction.atomic():
        assert Restaurant.objects.update_if_newer(
            restaurant.pk, version=next_version(), name="Mario's", seats=3
        ).applied
        thread = threading.Thread(target=key_share)
        thread.start()
        thread.join(30)
    assert refused == []
