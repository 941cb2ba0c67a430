"""safeupdates_purge and safeupdates_verify refuse a --batch-size no LIMIT can take with a CommandError,
never a DataError (found by attacking their arguments)."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.parametrize("command", ["safeupdates_purge", "safeupdates_verify"])
@pytest.mark.parametrize("value", ["99999999999999999999999", str(2**63), "1000001"])
def test_a_batch_size_beyond_a_million_rows_is_refused(command: str, value: str) -> None:
    with pytest.raises(CommandError, match=r"^--batch-size must be a whole number from 1 to 1000000, not "):
        run(command, "--batch-size", value, *(["--dry-run"] if command == "safeupdates_purge" else []))


def test_a_batch_size_of_a_million_rows_is_taken() -> None:
    assert "deleted 0 request(s)" in run("safeupdates_purge", "--batch-size", "1000000", "--older-than", "1")
    assert "no drift" in run("safeupdates_verify", "testapp.Profile", "--batch-size", "1000000")
