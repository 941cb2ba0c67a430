"""Multi-table inheritance: the parent table holds the versions, the child table more fields (item 8)."""

from __future__ import annotations

import uuid

import pytest

from safeupdates.exceptions import StaleObjectError
from safeupdates.jobs import apply_update
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.testapp.models import Place, Restaurant

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
    stale.seats = 99
    with pytest.raises(StaleObjectError):
        stale.save()
    with pytest.raises(StaleObjectError):
        stale.save(update_fields=["seats"])
    current = row(restaurant.pk)
    assert (current.name, current.seats, current.serves_pizza) == ("Luigi", 12, True)


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
