"""with_lock() refuses a timeout or a primary key it cannot use with InvalidUpdate, before any statement,
and the caller's transaction goes on (found by attacking its arguments)."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction

from safeupdates.exceptions import InvalidUpdate
from tests.testapp.models import Profile
from tests.workers import still_usable

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "timeout",
    [float("inf"), float("nan"), 1e10, 1e300, 10**30, 2_147_484, "5", b"5", Decimal("NaN"), [1], True],
)
def test_a_timeout_it_cannot_wait_is_refused_and_the_transaction_goes_on(timeout: Any) -> None:
    profile = Profile.objects.create(name="locked")
    with transaction.atomic():
        with (
            pytest.raises(InvalidUpdate, match=r"timeout must be a positive number of seconds"),
            Profile.objects.with_lock(profile.pk, timeout=timeout),
        ):
            pass  # pragma: no cover - never reached
        still_usable()


@pytest.mark.parametrize("timeout", [0.001, 1, 2.5, Decimal("1.5"), 2_147_483])
def test_a_timeout_in_range_is_taken(timeout: Any) -> None:
    profile = Profile.objects.create(name="locked")
    with Profile.objects.with_lock(profile.pk, timeout=timeout) as locked:
        assert locked.pk == profile.pk


@pytest.mark.parametrize("pk", ["abc", [1], {"a": 1}, 2.5, True, uuid.uuid4(), "1\x00"])
def test_a_primary_key_of_the_wrong_kind_is_refused_and_the_transaction_goes_on(pk: Any) -> None:
    with transaction.atomic():
        with (
            pytest.raises(InvalidUpdate, match=r"testapp\.Profile: (invalid )?primary key"),
            Profile.objects.with_lock(pk),
        ):
            pass  # pragma: no cover - never reached
        still_usable()


def test_a_primary_key_given_as_text_locks_its_row() -> None:
    profile = Profile.objects.create(name="locked")
    with Profile.objects.with_lock(str(profile.pk)) as locked:
        assert locked.pk == profile.pk
