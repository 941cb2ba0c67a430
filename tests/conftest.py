from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import django_rq
import pytest
from django.db import connection
from redis import Redis

from tests.workers import Workers


@pytest.fixture
def redis() -> Iterator[Redis]:
    """The tests' Redis database, emptied before and after the test."""
    conn = django_rq.get_connection("default")
    conn.flushdb()
    yield conn
    conn.flushdb()


@pytest.fixture
def workers(redis: Redis, transactional_db: None) -> Iterator[Workers]:
    """Real rqworker processes on the test database; call ``workers.start(n)``."""
    pool = Workers()
    yield pool
    pool.stop()


@pytest.fixture
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (row locks)")


#: Tests that need a program of their own (Chromium; initdb and redis-server) and skip without it.
NEEDS_A_PROGRAM = {"browser": "browser tests", "faults": "fault scenarios"}


def skipped_groups(reports: list[pytest.TestReport]) -> list[str]:
    """One line per marker of :data:`NEEDS_A_PROGRAM` and skip reason: how many tests skipped, and why
    (which says how to run them)."""
    counts: Counter[tuple[str, str]] = Counter()
    for report in reports:
        marker = next((name for name in NEEDS_A_PROGRAM if name in report.keywords), None)
        if marker is not None and isinstance(report.longrepr, tuple):
            counts[marker, report.longrepr[2].removeprefix("Skipped: ")] += 1
    return [f"{count} {NEEDS_A_PROGRAM[marker]} skipped: {reason}" for (marker, reason), count in counts.items()]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say which groups of tests did not run for want of a program, in every run (also with ``-q``,
    where the skip reasons are not shown)."""
    for line in skipped_groups(terminalreporter.stats.get("skipped", [])):
        terminalreporter.write_line(f"safeupdates: {line}", yellow=True)
