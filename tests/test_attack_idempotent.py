"""@idempotent refuses a key the request log cannot store, and a timeout PostgreSQL cannot wait, with
InvalidControl before anything runs or is written; the caller's transaction goes on (found by attacking
its arguments: a key is often made of a client's data, an order or event id)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from safeupdates.contrib.idempotent.decorators import idempotent
from safeupdates.exceptions import InvalidControl
from safeupdates.models import ProcessedRequest, RequestKind
from tests.workers import still_usable

pytestmark = pytest.mark.django_db

runs: list[str] = []


def body(name: str) -> str:
    runs.append(name)
    return f"ran {name}"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a\x00b", "a NUL character"),
        ("\ud800", "a lone surrogate"),
        ("x" * 1000 + "\udfff", "a lone surrogate"),  # too long for the column: the digest's way
        ("x" * 1000 + "\x00", "a NUL character"),
    ],
)
def test_a_key_the_request_log_cannot_store_is_refused(name: str, why: str) -> None:
    runs.clear()
    guarded = idempotent("attack:{name}")(body)
    with transaction.atomic():
        with pytest.raises(InvalidControl, match=rf"^the key of .*body contains {why}"):
            guarded(name)
        still_usable()
    assert runs == []
    assert not ProcessedRequest.objects.filter(kind=RequestKind.TASK).exists()


def test_a_callable_key_is_checked_too() -> None:
    guarded = idempotent(lambda name: f"attack:{name}")(body)
    with pytest.raises(InvalidControl, match=r"a NUL character"):
        guarded("\x00")


def test_a_key_with_any_other_character_runs_once() -> None:
    runs.clear()
    guarded = idempotent("attack:{name}")(body)
    assert guarded("zoë \U0001f600 \x01") == "ran zoë \U0001f600 \x01"
    assert guarded("zoë \U0001f600 \x01") == "duplicate"
    assert runs == ["zoë \U0001f600 \x01"]


@pytest.mark.parametrize("timeout", [2_147_484, 10**7, 10**30])
def test_a_timeout_beyond_postgresqls_lock_timeout_is_refused(timeout: Any) -> None:
    with pytest.raises(
        InvalidControl, match=r"^timeout must be at most 2147483 seconds \(PostgreSQL.s longest lock_timeout\), not "
    ):
        idempotent("attack:{name}", timeout=timeout)


def test_the_longest_timeout_is_taken() -> None:
    runs.clear()
    assert idempotent("attack:{name}", timeout=2_147_483)(body)("longest") == "ran longest"


@pytest.mark.parametrize("job_timeout", [2_147_484, 10**12])
def test_a_job_timeout_beyond_it_waits_as_long_as_postgresql_can(job_timeout: int) -> None:
    runs.clear()
    with override_settings(SAFEUPDATES_JOB_TIMEOUT=job_timeout):
        assert idempotent("attack:{name}")(body)("long job") == "ran long job"
