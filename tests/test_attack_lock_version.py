"""save() and delete() refuse a lock_version set by hand to something that is no version (text, a bool, a
float, an integer beyond a bigint) with InvalidUpdate before any statement: it was a DataError,
ProgrammingError or NotSupportedError in the checked statement, which broke the caller's transaction
(found by attacking what a careless view does: ``obj.lock_version = request.POST["lock_version"]``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction

from safeupdates.exceptions import InvalidUpdate, StaleObjectError
from tests.testapp.models import Profile
from tests.workers import still_usable

pytestmark = pytest.mark.django_db

NO_VERSIONS = [
    "abc",
    "1.5",
    "0x10",
    "",
    str(2**63),
    True,
    False,
    1.5,
    0.0,
    float("nan"),
    Decimal("NaN"),
    Decimal(0),
    [0],
    2**63,
    -(2**63) - 1,
]


def save(profile: Profile) -> None:
    profile.save()


def save_some(profile: Profile) -> None:
    profile.save(update_fields=["name"])


def delete(profile: Profile) -> None:
    profile.delete()


@pytest.mark.parametrize("write", [save, save_some, delete])
@pytest.mark.parametrize("value", NO_VERSIONS)
def test_a_lock_version_that_is_no_version_is_refused_and_nothing_is_written(write: Any, value: Any) -> None:
    profile = Profile.objects.create(name="before")
    loaded = Profile.objects.get(pk=profile.pk)
    loaded.lock_version, loaded.name = value, "after"
    with transaction.atomic():
        with pytest.raises(
            InvalidUpdate, match=r"^testapp\.Profile pk=\d+ has lock_version=.* which is no version: its "
        ):
            write(loaded)
        still_usable()
    assert Profile.objects.filter(pk=profile.pk).values_list("name", "lock_version").get() == (
        "before",
        profile.lock_version,
    )


@pytest.mark.parametrize("write", [save, save_some, delete])
@pytest.mark.parametrize("value", [-1, 2**63 - 1, -(2**63)])
def test_an_integer_in_the_columns_range_is_checked_as_a_version(write: Any, value: int) -> None:
    profile = Profile.objects.create(name="before")
    loaded = Profile.objects.get(pk=profile.pk)
    loaded.lock_version, loaded.name = value, "after"
    with transaction.atomic():
        with pytest.raises(StaleObjectError):
            write(loaded)
        still_usable()


@pytest.mark.parametrize("write", [save, save_some, delete])
def test_a_version_posted_as_text_is_the_integer_it_spells(write: Any) -> None:
    """``obj.lock_version = request.POST["lock_version"]``: an integer as text is that version, as the
    column's own ``to_python()`` reads it. The current one writes; an older one is refused as stale."""
    profile = Profile.objects.create(name="before")
    stale = Profile.objects.get(pk=profile.pk)
    stale.lock_version = f" {profile.lock_version - 1}"
    with transaction.atomic():
        with pytest.raises(StaleObjectError):
            write(stale)
        still_usable()
    current = Profile.objects.get(pk=profile.pk)
    current.lock_version, current.name = str(profile.lock_version), "after"
    write(current)
    if write is delete:
        assert not Profile.objects.filter(pk=profile.pk).exists()
    else:
        current.refresh_from_db()
        assert current.name == "after" and current.lock_version > profile.lock_version
