"""Fixtures of the fault scenarios: every server a scenario stops, kills or cuts off is its own."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.faults.harness import Site
from tests.servers import PG_BIN_DIRS, find_initdb


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "faults: restarts, kills or cuts off a PostgreSQL and Redis of the test's own mid-burst (slow)"
    )


def _missing_binaries() -> str | None:
    """Why the scenarios cannot start their own servers, and how to run them; None if they can."""
    if find_initdb() is None:
        return (
            f"PostgreSQL's initdb is neither on PATH nor in {PG_BIN_DIRS}: install the PostgreSQL server "
            "(Debian: apt-get install postgresql), then run them with `pytest -m faults`"
        )
    if shutil.which("redis-server") is None:
        return (
            "redis-server is not on PATH: install Redis (Debian: apt-get install redis-server), then run them "
            "with `pytest -m faults`"
        )
    return None


@pytest.fixture
def make_site(tmp_path: Path, django_db_blocker: Any) -> Iterator[Callable[..., Site]]:
    """Build a :class:`~tests.faults.harness.Site` (``sentinel=True``: Redis behind Sentinels); it is
    torn down after the test, also when the test or the set-up fails."""
    if connections["default"].vendor != "postgresql":
        # The test process is the site's web process: its default database connection must be PostgreSQL.
        pytest.skip("the fault scenarios run in the PostgreSQL pass (DATABASE_URL is not PostgreSQL)")
    missing = _missing_binaries()
    if missing:
        pytest.skip(missing)
    sites: list[Site] = []

    def make(*, sentinel: bool = False) -> Site:
        site = Site(tmp_path / f"site{len(sites)}", sentinel=sentinel)
        sites.append(site)
        return site.start(django_db_blocker)

    try:
        yield make
    finally:
        for site in reversed(sites):
            site.close()
