"""enqueue() of the job controls refuses a unique, serial or throttle key with a lone surrogate (no
encoding can carry it to Redis) with InvalidControl and enqueues nothing: it was a UnicodeEncodeError at
enqueue, or in the worker for a throttle key (found by attacking the keys, often made of a client's
data)."""

from __future__ import annotations

from typing import Any

import pytest

from safeupdates.contrib.controls.jobs import enqueue
from safeupdates.exceptions import InvalidControl
from tests.testapp import jobs


@pytest.mark.parametrize(
    "controls",
    [
        {"unique_key": "user:\ud800"},
        {"serial_key": "\udfff"},
        {"throttle": "1/second", "throttle_key": "api:\ud800"},
    ],
    ids=["unique_key", "serial_key", "throttle_key"],
)
def test_a_key_with_a_lone_surrogate_is_refused_and_nothing_is_enqueued(redis: Any, controls: dict[str, Any]) -> None:
    with pytest.raises(InvalidControl, match=r"_key .* contains a lone surrogate \(\\ud800 to \\udfff\)"):
        enqueue(jobs.record, "log", 1, **controls)
    assert redis.dbsize() == 0
