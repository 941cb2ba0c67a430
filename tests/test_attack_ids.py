"""request_id_for() refuses an event id or a source with a lone surrogate (a client's JSON makes one of an
unpaired \\u escape) with InvalidUpdate: it was a UnicodeEncodeError from uuid5 (found by attacking the
webhook helper)."""

from __future__ import annotations

import uuid

import pytest

from safeupdates.exceptions import InvalidUpdate
from safeupdates.ids import request_id_for


@pytest.mark.parametrize(
    ("source", "event"),
    [("stripe", "\ud800"), ("stripe", "evt_\udfff_1"), ("\ud800", "evt_1"), (uuid.NAMESPACE_URL, "\udc80")],
)
def test_a_lone_surrogate_is_refused(source: str | uuid.UUID, event: str) -> None:
    with pytest.raises(InvalidUpdate, match=r"contains a lone surrogate \(\\ud800 to \\udfff\)"):
        request_id_for(source, event)


def test_a_refused_external_id_is_not_echoed_whole() -> None:
    with pytest.raises(InvalidUpdate) as excinfo:
        request_id_for("stripe", ["x" * 100_000])  # type: ignore[arg-type]
    assert len(str(excinfo.value)) < 300


def test_any_other_text_makes_a_request_id() -> None:
    assert request_id_for("stripe", "evt_\U0001f600\x00") == request_id_for("stripe", "evt_\U0001f600\x00")
