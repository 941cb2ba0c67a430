"""A JSONField with an encoder of its own (``JSONField(encoder=...)``): every write path stores what the
field's encoder writes, as a plain save does, and the request log records that JSON, not what its own
encoder would make of the value (it writes a decimal as a string and knows no set)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from safeupdates import enqueue_update, replay
from safeupdates.jobs import apply_update
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.testapp.models import Priced

pytestmark = pytest.mark.django_db

#: A value of the field, and the JSON its encoder (tests.testapp.models.NumbersAndSets) writes of it.
VALUE = {"price": Decimal("1.50"), "tags": {"b", "a"}, "nested": [{"cost": Decimal("2")}]}
WRITTEN = {"price": 1.5, "tags": ["a", "b"], "nested": [{"cost": 2.0}]}


def via_update(pk: Any, **changes: Any) -> None:
    Priced.objects.update_if_newer(pk, version=next_version(), **changes)


def via_recorded_update(pk: Any, **changes: Any) -> None:
    Priced.objects.update_if_newer(pk, version=next_version(), request_id=uuid.uuid4(), **changes)


def via_timestamp(pk: Any, **changes: Any) -> None:
    Priced.objects.update_if_newer(pk, synced_at=timezone.now(), request_id=uuid.uuid4(), **changes)


def via_bulk(pk: Any, **changes: Any) -> None:
    Priced.objects.bulk_update_if_newer([(pk, next_version(), changes)])


def via_enqueue(pk: Any, **changes: Any) -> None:
    request = enqueue_update(Priced, pk, **changes)
    apply_update(str(request.request_id))  # as the worker does, in this test's transaction
    request.refresh_from_db()
    assert request.status == "applied", request.error


def via_save(pk: Any, **changes: Any) -> None:
    instance = Priced.objects.get(pk=pk)
    for name, value in changes.items():
        setattr(instance, name, value)
    instance.save()


ENTRY_POINTS: dict[str, Callable[..., None]] = {
    "update_if_newer": via_update,
    "update_if_newer(request_id=)": via_recorded_update,
    "update_if_newer(synced_at=)": via_timestamp,
    "bulk_update_if_newer": via_bulk,
    "enqueue_update": via_enqueue,
    "save": via_save,
}


def stored(pk: Any) -> Any:
    return Priced._base_manager.values_list("data", flat=True).get(pk=pk)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_write_path_stores_what_the_fields_encoder_writes(entry):
    plain = Priced.objects.create(data=VALUE)  # Django's own INSERT, through the field's encoder
    assert stored(plain.pk) == WRITTEN
    target = Priced.objects.create()
    ENTRY_POINTS[entry](target.pk, data=VALUE)
    assert stored(target.pk) == WRITTEN
    for request in ProcessedRequest.objects.filter(object_id=str(target.pk)):
        assert request.changes == {"data": WRITTEN}, entry  # what the column holds, for replay() and verify
    if ProcessedRequest.objects.filter(object_id=str(target.pk), status="applied").exists():
        assert replay(Priced.objects.get(pk=target.pk)) == {"data": WRITTEN}
