"""What the test suite promises about itself: tests that cannot run here for want of a program say so in
the summary of every run, with how to run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest
import pytest_django.plugin
from django.db import connections

from tests import mutation_order
from tests.conftest import skipped_groups
from tests.workers import ROOT


def report(marker: str, reason: str, name: str = "test_x") -> pytest.TestReport:
    return pytest.TestReport(
        f"tests/{marker}/test_x.py::{name}",
        ("tests/x.py", 1, name),
        {marker: 1, name: 1},
        "skipped",
        ("tests/x.py", 1, f"Skipped: {reason}"),
        "setup",
    )


def test_skips_for_want_of_a_program_are_counted_per_reason():
    missing = "redis-server is not on PATH: install Redis, then run them with `pytest -m faults`"
    reports = [report("faults", missing, f"test_{n}") for n in range(3)]
    reports += [report("browser", "Chromium is not installed at /x"), report("other", "needs PostgreSQL")]
    assert skipped_groups(reports) == [
        f"3 fault scenarios skipped: {missing}",
        "1 browser tests skipped: Chromium is not installed at /x",
    ]


def test_browser_tests_skipped_for_want_of_chromium_say_so_in_the_summary(tmp_path):
    chromium = tmp_path / "no-chromium"
    env = {
        **os.environ,
        "CHROMIUM": str(chromium),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "SQLITE_TEST_NAME": str(tmp_path / "test.sqlite3"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "tests/browser/test_toggle_page.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = re.search(r"(\d+) skipped", done.stdout)
    assert skipped and int(skipped[1]) > 0, done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith("safeupdates: ")] == [
        f"safeupdates: {skipped[1]} browser tests skipped: Chromium is not installed at {chromium}: "
        "`apt-get install -y chromium`, or set CHROMIUM."
    ]


@pytest.mark.django_db
def test_the_fault_scenarios_settings_name_only_the_database_a_scenario_starts(postgres_only):
    """A fault scenario's workers run ``tests.faults.settings`` against a cluster of its own that holds one
    database. Django 6.1's management commands check every alias in ``DATABASES`` at start: the tenant
    alias of ``tests.settings`` (a database the scenario never creates) stopped every worker and the relay
    before they took a job."""
    import psycopg

    from tests.workers import subprocess_env, worker_db_url

    server, name = worker_db_url().rsplit("/", 1)
    alone = f"{name}_alone"
    with psycopg.connect(f"{server}/{name}", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{alone}"')
        admin.execute(f'CREATE DATABASE "{alone}"')
        try:
            env = subprocess_env(DATABASE_URL=f"{server}/{alone}", DJANGO_SETTINGS_MODULE="tests.faults.settings")
            done = subprocess.run(
                [sys.executable, "-m", "django", "check"], env=env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr[-2000:]
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{alone}"')


@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
def test_a_test_that_starts_processes_has_every_test_database():
    """On Django 6.1 each ``manage.py`` command a test starts (rqworker, the relay, runserver) runs the
    system checks, which connect to every database in ``DATABASES``. A run of tests that need only the
    default database still has the tenant's test database when one of them starts processes: without it,
    ``-k`` picking one worker test failed with ``database "test_safeupdates_tenant" does not exist``."""
    for alias in connections:  # a connection of its own, as another process has: the test's may not query
        raw = connections[alias].get_new_connection(connections[alias].get_connection_params())
        try:
            assert raw.execute("SELECT 1").fetchone() == (1,)
        finally:
            raw.close()


@pytest.mark.django_db
def test_a_run_of_one_worker_test_alone_sets_up_every_test_database(postgres_only):
    """:func:`test_a_test_that_starts_processes_has_every_test_database` run on its own, in a session of
    its own on a database of its own (whose tenant database no other test creates)."""
    from tests.workers import subprocess_env, worker_db_url

    server, name = worker_db_url().rsplit("/", 1)
    env = subprocess_env(DATABASE_URL=f"{server}/{name}_alone_{os.getpid()}")
    test = "tests/test_conftest.py::test_a_test_that_starts_processes_has_every_test_database"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--no-cov", "--create-db", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout


def test_the_mutation_runs_order_reads_pytest_djangos_groups_as_it_does(request):
    """The groups of this session's tests, as pytest-django computes them (its sort key, caught)."""

    class CaughtKey(list[pytest.Item]):
        def sort(self, *, key: Any = None, reverse: bool = False) -> None:
            self.key = key

    items = CaughtKey(request.session.items)
    pytest_django.plugin.pytest_collection_modifyitems(items)
    assert [mutation_order.group(item) for item in items] == [items.key(item) for item in items]


def test_a_mutants_tests_run_quickest_first_within_their_groups(request):
    items = list(request.session.items)
    durations = {item.nodeid: -index for index, item in enumerate(items)}  # the slowest first
    mutation_order.quickest_first(items, durations)
    keys = [(mutation_order.group(item), durations[item.nodeid]) for item in items]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(items)


@pytest.mark.django_db(transaction=True)
def test_a_flush_makes_no_permissions_and_keeps_the_content_types(redis):
    """``_flush_makes_no_permissions``: after a flush no permission is made again; the content types are,
    before any test code runs (a request logged after the flush names one that was already there)."""
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType
    from django.core.management import call_command

    from safeupdates import enqueue_update
    from tests.factories import ProfileFactory

    call_command("flush", interactive=False, verbosity=0)
    assert not Permission.objects.exists()
    types = set(ContentType.objects.values_list("pk", flat=True))
    assert enqueue_update(ProfileFactory(), active=False).content_type_id in types
