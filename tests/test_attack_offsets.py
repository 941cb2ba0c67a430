"""A datetime whose offset PostgreSQL does not take (beyond +-15:59; Python allows up to 24 hours) is
written as its instant by every guarded write, also where the statement carries it as text (bulk writes,
and every write with SAFEUPDATES_PREPARED_STATEMENTS = False): it was a DataError there (found by
attacking the values of a DateTimeField)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.test import override_settings

from safeupdates import enqueue_update
from safeupdates.jobs import apply_update
from safeupdates.versions import next_version
from tests.testapp.models import Gadget

pytestmark = pytest.mark.django_db


def via_update(pk: Any, value: datetime) -> None:
    Gadget.objects.update_if_newer(pk, version=next_version(), seen_at=value)


def via_bulk(pk: Any, value: datetime) -> None:
    Gadget.objects.bulk_update_if_newer([(pk, next_version(), {"seen_at": value})])


def via_enqueue(pk: Any, value: datetime) -> None:
    request = enqueue_update(Gadget, pk, seen_at=value)
    apply_update(str(request.request_id))  # as the worker does, in this test's transaction
    request.refresh_from_db()
    assert request.status == "applied", request.error


@pytest.mark.parametrize("prepared", [True, False])
@pytest.mark.parametrize("write", [via_update, via_bulk, via_enqueue])
@pytest.mark.parametrize("hours", [16, 20, -23])
def test_a_datetime_with_any_offset_python_allows_is_written_as_its_instant(
    write: Callable[[Any, datetime], None], prepared: bool, hours: int
) -> None:
    value = datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=hours, minutes=59)))
    gadget = Gadget.objects.create()
    with override_settings(SAFEUPDATES_PREPARED_STATEMENTS=prepared):
        write(gadget.pk, value)
    gadget.refresh_from_db()
    assert gadget.seen_at == value
