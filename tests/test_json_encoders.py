"""A JSONField with an encoder of its own (``JSONField(encoder=...)``): every write path stores what the
field's encoder writes, as a plain save does, and the request log records that JSON, not what its own
encoder would make of the value (it writes a decimal as a string and knows no set)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from safeupdates import replay
from safeupdates.models import ProcessedRequest
from tests.test_hostile_values import write_paths
from tests.testapp.models import Priced

pytestmark = pytest.mark.django_db

#: A value of the field, and the JSON its encoder (tests.testapp.models.NumbersAndSets) writes of it.
VALUE = {"price": Decimal("1.50"), "tags": {"b", "a"}, "nested": [{"cost": Decimal("2")}]}
WRITTEN = {"price": 1.5, "tags": ["a", "b"], "nested": [{"cost": 2.0}]}


ENTRY_POINTS = write_paths(Priced)


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
