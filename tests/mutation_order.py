"""A pytest plugin for ``make mutation`` only (setup.cfg's ``[mutmut] pytest_add_cli_args``): a mutant's
tests run quickest first.

mutmut runs each mutant's tests with ``-x`` in the order of a set, so a mutant that only a few tests
kill waits, on average, for half of the others first (``save`` is covered by 1,130 tests). With the
durations of mutmut's own stats run (``mutmut-stats.json``, in the directory the tests run in) the
tests run in ascending order of time, within the three groups pytest-django orders them in (tests in
a transaction, tests that flush the database, tests without it), whose order is kept: a test that
flushes the database must not run before one that expects the rows the migrations made. Without
the stats file (mutmut's stats run) the order is left as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

STATS = Path("mutmut-stats.json")


def group(item: pytest.Item) -> int:
    """pytest-django's order: 0 in a transaction rolled back, 1 flushing the database, 2 no database."""
    from django.test import TestCase, TransactionTestCase

    cls = getattr(item, "cls", None)
    if cls is not None and issubclass(cls, TransactionTestCase):
        return 0 if issubclass(cls, TestCase) else 1
    marker = item.get_closest_marker("django_db")
    fixtures = getattr(item, "fixturenames", ())
    if marker is not None:
        kwargs = dict(zip(("transaction", "reset_sequences"), marker.args, strict=False)) | marker.kwargs
        if kwargs.get("transaction") or kwargs.get("reset_sequences"):
            return 1
    if "transactional_db" in fixtures or "live_server" in fixtures:
        return 1
    if marker is not None or "db" in fixtures:
        return 0
    return 2


def quickest_first(items: list[pytest.Item], durations: dict[str, float]) -> None:
    items.sort(key=lambda item: (group(item), durations.get(item.nodeid, 0.0)))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if STATS.exists():
        quickest_first(items, json.loads(STATS.read_text())["duration_by_test"])
