from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import django_rq
import pytest
from django.db import connection, connections
from redis import Redis

from tests.workers import Workers


def _fresh_thread_sensitive_executor() -> None:
    """In a process forked by mutmut (``make mutation``): a new executor for asgiref's thread-sensitive
    code (``sync_to_async`` outside ``async_to_sync``). The one inherited from the parent names a thread
    that the fork left behind, so every async test would wait for it until mutmut's timeout, and each
    mutant of an async function would count as killed whatever the tests check."""
    from asgiref.sync import SyncToAsync

    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)


if "MUTANT_UNDER_TEST" in os.environ:
    os.register_at_fork(after_in_child=_fresh_thread_sensitive_executor)


@pytest.fixture(autouse=True)
def _cold_statement_caches() -> None:
    """Under mutmut (``make mutation``), every test starts with the memoized builders of safeupdates
    (the statements' ``lru_cache``) empty.

    A helper that only a memoized builder calls runs once per process: mutmut's first run would tie it
    to the one test that filled the cache, and a mutant run forked after the cache was filled would
    never run the mutant at all. Either way a mutant of it would "survive" whatever the tests check.
    Outside mutmut the caches stay warm, as in production."""
    if "MUTANT_UNDER_TEST" not in os.environ:
        return
    for name, module in list(sys.modules.items()):
        if name == "safeupdates" or name.startswith("safeupdates."):
            for value in list(vars(module).values()):
                clear = getattr(value, "cache_clear", None)
                if callable(clear) and hasattr(value, "cache_info"):
                    clear()


@pytest.fixture(scope="session", autouse=True)
def _flush_makes_no_permissions() -> Iterator[None]:
    """After each transactional test Django flushes every table and sends ``post_migrate``; auth's receiver
    then creates every permission again: most of a flush's time. In this suite it runs after a
    ``migrate`` only (a ``plan`` given, as ``safeupdates.versions.floor_after_migrate`` does). The tests
    that need permissions are not transactional: they find those the test database's ``migrate`` created.
    Content types are still created again after a flush, as a deployed project has them: created on
    first use instead, inside a test's open transaction, they would hold back every other connection's
    write that names them until it ends."""
    from django.contrib.auth.management import create_permissions
    from django.db.models.signals import post_migrate

    uid = "django.contrib.auth.management.create_permissions"

    def after_migrate_only(*args: Any, plan: Any = None, **kwargs: Any) -> None:
        if plan is not None:
            create_permissions(*args, plan=plan, **kwargs)

    post_migrate.disconnect(create_permissions, dispatch_uid=uid)
    post_migrate.connect(after_migrate_only, dispatch_uid=uid, weak=False)
    yield
    post_migrate.disconnect(dispatch_uid=uid)
    post_migrate.connect(create_permissions, dispatch_uid=uid)


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


@pytest.hookimpl(trylast=True)  # after ``-k`` and ``-m`` deselected theirs
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test database is set up in a run that starts processes (tests marked ``workers``).

    On Django 6.1 each ``manage.py`` command a test starts (rqworker, the relay, runserver) runs the
    system checks, which connect to every database in ``DATABASES``; pytest-django sets up only the
    databases the selected tests ask for. The first test that starts processes asks for all of them, which
    costs nothing when other tests already do."""
    starts_processes = next((item for item in items if item.get_closest_marker("workers")), None)
    if starts_processes is None:
        return
    marker = starts_processes.get_closest_marker("django_db")
    # A test that asked for no database access (the fault scenarios: they point the connection at servers
    # of their own) is made transactional, not wrapped in a transaction it never expected: a Site closes
    # and re-points the connection, which inside the test's atomic block breaks every later query.
    kwargs = dict(marker.kwargs) if marker else {"transaction": True}
    if kwargs.get("databases") != "__all__":
        starts_processes.add_marker(pytest.mark.django_db(**{**kwargs, "databases": "__all__"}), append=False)


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


def _create_profile_trigger(name: str, statement: str, *, table: str = "", using: str = "default") -> None:
    """A BEFORE UPDATE trigger ``name`` on the Profile table (or ``table``) of database ``using`` that runs
    ``statement`` (PL/pgSQL) per row."""
    from tests.testapp.models import Profile

    with connections[using].cursor() as cursor:
        cursor.execute(
            f"""
            CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$
            BEGIN
                {statement}
                RETURN NEW;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER {name} BEFORE UPDATE ON {table or Profile._meta.db_table}
                FOR EACH ROW EXECUTE FUNCTION {name}();
            """
        )


def _drop_profile_trigger(name: str, *, table: str = "", using: str = "default") -> None:
    from tests.testapp.models import Profile

    with connections[using].cursor() as cursor:
        cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table or Profile._meta.db_table}")
        cursor.execute(f"DROP FUNCTION IF EXISTS {name}()")


@pytest.fixture
def refusing_trigger(postgres_only):
    """A trigger on the Profile table that refuses ``name = 'forbidden'`` with a given SQLSTATE."""
    created: list[str] = []

    def create(sqlstate: str = "P0001") -> None:
        _create_profile_trigger(
            "safeupdates_test_refuse",
            "IF NEW.name = 'forbidden' THEN RAISE EXCEPTION 'the name % is forbidden', NEW.name "
            f"USING ERRCODE = '{sqlstate}'; END IF;",
        )
        created.append(sqlstate)

    yield create
    if created:
        _drop_profile_trigger("safeupdates_test_refuse")


@pytest.fixture
def slow_trigger(postgres_only):
    """A trigger on the Profile table that sleeps 3 s in an UPDATE that sets ``name = 'slow'``."""
    _create_profile_trigger("safeupdates_test_slow", "IF NEW.name = 'slow' THEN PERFORM pg_sleep(3); END IF;")
    yield
    _drop_profile_trigger("safeupdates_test_slow")


@pytest.fixture
def refused() -> Iterator[list[dict[str, Any]]]:
    """Every ``stale_save_refused`` sent during the test: its arguments, ``sender`` included."""
    from safeupdates import signals

    got: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        kwargs.pop("signal")
        got.append({"sender": sender, **kwargs})

    signals.stale_save_refused.connect(receiver, weak=False, dispatch_uid="tests.refused")
    yield got
    signals.stale_save_refused.disconnect(dispatch_uid="tests.refused")


@pytest.fixture
def uninstalled(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``uninstalled(module, *libraries)``: the delivery backend ``module`` is imported afresh, and the
    ``libraries`` cannot be imported, as where they are not installed (until the test ends)."""
    from safeupdates import delivery

    def uninstall(module: str, *libraries: str) -> None:
        for library in libraries:
            monkeypatch.setitem(sys.modules, library, None)  # `import library` raises ImportError
        monkeypatch.delitem(sys.modules, module)
        monkeypatch.setattr(delivery, "_loaded", {})

    return uninstall
