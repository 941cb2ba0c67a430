"""The relay refuses an age or an interval it cannot use (its command with a CommandError, relay() with a
ValueError, SAFEUPDATES_RELAY_AFTER with a system check), never an OverflowError or a DataError (found by
attacking its arguments)."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from safeupdates.checks import check_settings
from safeupdates.jobs import relay

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.parametrize("value", ["1e300", "1e13", "9e13", "31536000001"])
def test_relay_refuses_an_age_beyond_a_thousand_years(value: str) -> None:
    with pytest.raises(CommandError, match=r"^--older-than must be a number of seconds from 0 to 31536000000, "):
        run("safeupdates_relay", "--older-than", value, "--dry-run")


def test_relay_takes_an_age_of_a_thousand_years() -> None:
    assert "would deliver 0 job(s)" in run("safeupdates_relay", "--older-than", "31536000000", "--dry-run")


@pytest.mark.parametrize("value", ["1e300", "9300000000", "86401"])
def test_relay_refuses_an_interval_it_cannot_sleep(value: str) -> None:
    with pytest.raises(CommandError, match=r"^--interval must be a number of seconds from more than 0 to 86400, "):
        run("safeupdates_relay", "--interval", value, "--dry-run")


def test_relay_refuses_a_relay_after_beyond_a_thousand_years() -> None:
    with override_settings(SAFEUPDATES_RELAY_AFTER=10**20):
        assert [m.id for m in check_settings()] == ["safeupdates.E005"]
        with pytest.raises(CommandError, match=r"^SAFEUPDATES_RELAY_AFTER must be a whole number of seconds"):
            run("safeupdates_relay", "--dry-run")


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1, 1e300, 31_536_000_001])
def test_relay_called_with_an_age_it_cannot_use_is_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match=r"^older_than must be a number of seconds from 0 to 31536000000, not "):
        relay(seconds, dry_run=True)
