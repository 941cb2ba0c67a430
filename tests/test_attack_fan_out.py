"""fan_out() refuses a retry count its batch cannot record, and items that are no iterable, with
InvalidControl before anything is written; the caller's transaction goes on (found by attacking its
arguments)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from safeupdates.contrib.batches.jobs import fan_out
from safeupdates.contrib.batches.models import Batch
from safeupdates.exceptions import InvalidControl
from safeupdates.models import ProcessedRequest
from tests.testapp.batch_jobs import add_score
from tests.testapp.models import Profile

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"items": [{"pk": 1, "points": 1}], "retries": 2**31},
            r"^retries must be at most 2147483647, got 2147483648\.",
        ),
        ({"items": [{"pk": 1, "points": 1}], "retries": 10**30}, r"^retries must be at most 2147483647, got 10+\."),
        ({"items": None}, r"^items must be an iterable of JSON-serialisable items, got None\."),
        ({"items": 5}, r"^items must be an iterable of JSON-serialisable items, got 5\."),
    ],
)
def test_an_argument_the_batch_cannot_take_is_refused_and_nothing_is_written(
    arguments: dict[str, Any], message: str
) -> None:
    with transaction.atomic():
        with pytest.raises(InvalidControl, match=message):
            fan_out(add_score, **arguments)
        Profile.objects.create(name="after")  # the caller's transaction goes on
    assert not Batch.objects.exists()
    assert not ProcessedRequest.objects.exists()


def test_the_largest_retry_count_is_recorded() -> None:
    batch = fan_out(add_score, [{"pk": 1, "points": 1}], retries=2**31 - 1)
    assert batch.retries == 2**31 - 1
