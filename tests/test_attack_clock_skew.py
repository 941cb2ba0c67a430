"""SAFEUPDATES_MAX_CLOCK_SKEW beyond what the date arithmetic of update_if_newer(synced_at=...) can add is a
system check error (E005), not an OverflowError at request time (found by attacking the settings)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from safeupdates.checks import check_settings


@pytest.mark.parametrize("skew", [1e300, 10**12, timedelta(days=999_999_999), timedelta(days=365_001)])
def test_a_clock_skew_beyond_a_thousand_years_is_a_check_error(skew: Any) -> None:
    with override_settings(SAFEUPDATES_MAX_CLOCK_SKEW=skew):
        assert [(m.id, m.msg.split(" is not valid.")[0]) for m in check_settings()] == [
            ("safeupdates.E005", f"SAFEUPDATES_MAX_CLOCK_SKEW = {skew!r}")
        ]


@pytest.mark.parametrize("skew", [0, 300, 31_536_000_000, timedelta(days=365_000)])
def test_a_clock_skew_up_to_a_thousand_years_is_valid(skew: Any) -> None:
    with override_settings(SAFEUPDATES_MAX_CLOCK_SKEW=skew):
        assert check_settings() == []
