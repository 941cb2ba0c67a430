"""safeupdates_verify --after-pk refuses a key no column can hold (a NUL character, a lone surrogate: what a
byte the terminal's encoding cannot decode becomes, an integer beyond the column) with a CommandError: it was
a DataError or a UnicodeEncodeError of the first query (found by attacking the command's arguments)."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("model", "after", "why"),
    [
        ("testapp.Tag", "a\x00", "NUL character"),
        ("testapp.Tag", "caf\udce9", "lone surrogate"),
        ("testapp.Profile", "99999999999999999999999", "out of range"),
    ],
)
def test_a_key_no_column_can_hold_is_refused(model: str, after: str, why: str) -> None:
    with pytest.raises(CommandError, match=rf"^--after-pk .* is not a primary key of {model}: .*{why}"):
        call_command("safeupdates_verify", model, "--after-pk", after, stdout=io.StringIO(), stderr=io.StringIO())


def test_a_key_of_the_column_resumes_after_it() -> None:
    out = io.StringIO()
    call_command("safeupdates_verify", "testapp.Tag", "--after-pk", "café", stdout=out, stderr=io.StringIO())
    assert "no drift" in out.getvalue()
