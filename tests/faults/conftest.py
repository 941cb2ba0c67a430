"""Fixtures of the fault scenarios: every server a scenario stops, kills or cuts off is its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.faults.harness import Site
from tests.servers import missing_servers


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "faults: restarts, kills or cuts off a PostgreSQL and Redis of the test's own mid-burst (slow)"
    )


@pytest.fixture
def make_site(tmp_path: Path, django_db_blocker: Any) -> Iterator[Callable[..., Site]]:
    """Build a :class:`~tests.faults.harness.Site` (``sentinel=True``: Redis behind Sentinels;
    ``delivery``: a key of :data:`~tests.faults.harness.DELIVERIES`); it is torn down after the test,
    also when the test or the set-up fails."""
    if connections["default"].vendor != "postgresql":
        # The test process is the site's web process: its default database connection must be PostgreSQL.
        pytest.skip("the fault scenarios run in the PostgreSQL pass (DATABASE_URL is not PostgreSQL)")
    missing = missing_servers()
    if missing:
        pytest.skip(missing)
    sites: list[Site] = []

    def make(*, sentinel: bool = False, delivery: str = "rq") -> Site:
        site = Site(tmp_path / f"site{len(sites)}", sentinel=sentinel, delivery=delivery)
        sites.append(site)
        return site.start(django_db_blocker)

    try:
        yield make
    finally:
        for site in reversed(sites):
            site.close()
