"""The test helpers of ``tests/workers.py``: a helper that hides a failure hides a bug."""

from __future__ import annotations

import pytest

from tests.workers import run_threads, start_threads


def boom() -> None:
    raise ValueError("raised in a thread")


def test_run_threads_raises_what_a_thread_raised():
    with pytest.raises(ValueError, match="raised in a thread"):
        run_threads(boom, 3)


def test_joining_a_started_thread_raises_what_it_raised():
    [thread] = start_threads(boom, 1)
    with pytest.raises(ValueError, match="raised in a thread"):
        thread.join()
