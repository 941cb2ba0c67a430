"""update_if_newer(synced_at=...) refuses an aware datetime that lies before the year 1 once in UTC: it was
written (PostgreSQL keeps years BC), and then every read of the row failed with a DataError (found by
attacking the timestamp mode)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import transaction

from safeupdates.exceptions import InvalidUpdate
from tests.testapp.models import Profile
from tests.workers import still_usable

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "synced_at",
    [
        datetime(1, 1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
        datetime(1, 1, 1, 23, 59, tzinfo=timezone(timedelta(hours=23, minutes=59, seconds=59))),
        datetime(1, 1, 1, tzinfo=timezone(timedelta(microseconds=1))),
    ],
)
@pytest.mark.parametrize("request_id", [None, "new"])
def test_a_timestamp_before_the_year_1_in_utc_is_refused_and_nothing_is_written(
    synced_at: datetime, request_id: Any
) -> None:
    profile = Profile.objects.create(name="before")
    rid = uuid.uuid4() if request_id else None
    with transaction.atomic():
        with pytest.raises(
            InvalidUpdate, match=r"^synced_at=0001-01-01T.* lies outside the years 1 to 9999 once in UTC"
        ):
            Profile.objects.update_if_newer(profile.pk, synced_at=synced_at, request_id=rid, name="after")
        still_usable()
    profile.refresh_from_db()  # the row reads back, as it was
    assert (profile.name, profile.last_synced_at) == ("before", None)


def test_an_offset_beyond_postgresqls_is_written_as_its_instant() -> None:
    profile = Profile.objects.create(name="before")
    synced_at = datetime(2020, 1, 2, 23, 59, tzinfo=timezone(timedelta(hours=23, minutes=59)))
    assert Profile.objects.update_if_newer(profile.pk, synced_at=synced_at, name="after").applied
    profile.refresh_from_db()
    assert (profile.name, profile.last_synced_at) == ("after", synced_at)


def test_the_first_instant_of_the_year_1_in_utc_is_written() -> None:
    profile = Profile.objects.create(name="before")
    first = datetime(1, 1, 1, tzinfo=UTC)
    assert Profile.objects.update_if_newer(profile.pk, synced_at=first, name="after").applied
    profile.refresh_from_db()
    assert (profile.name, profile.last_synced_at) == ("after", first)
