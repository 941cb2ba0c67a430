"""What the ported suite shares: the marks of what differs from Django, and the statement count."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext

#: A test that asserts one of the app's documented differences from Django (docs/limits.md,
#: docs/concepts.md): a row changed or deleted since it was loaded raises StaleObjectError; an instance
#: loaded without lock_version is refused.
difference = pytest.mark.difference


def issue_24(item: int, reason: str) -> pytest.MarkDecorator:
    """A known difference that issue 24 item ``item`` fixes: fails today, and fails the suite (XPASS
    strict) the moment the fix lands, so that the test is turned back into Django's."""
    return pytest.mark.xfail(strict=True, reason=f"issue 24.{item}: {reason}")


def not_in_issue_24(reason: str) -> pytest.MarkDecorator:
    """A difference found by the port that issue 24 does not list yet (reported to the lead)."""
    return pytest.mark.xfail(strict=True, reason=f"new, not in issue 24: {reason}")


#: SQLite's version source is a counter table, read before the statement that writes the row: two
#: statements more than Django (PostgreSQL takes the version inside the statement).
on_sqlite_version_source = pytest.mark.xfail(
    connection.vendor == "sqlite",
    strict=True,
    reason="issue 24.4 (SQLite): the version is taken first from the counter table (UPDATE and SELECT)",
)


#: Transaction control: Django's own counts were taken inside TestCase's transaction, where the
#: ``atomic(savepoint=False)`` of a multi-table save or a cascading delete sends none; outside a
#: transaction Django sends them exactly as the app does. SAVEPOINTs are counted.
TRANSACTION_CONTROL = ("BEGIN", "BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")


#: What Django's ``available_apps`` names in its transactional tests: the apps a test may use (safeupdates
#: for its version source).
AVAILABLE_APPS = ["tests.django_contract", "safeupdates", "django.contrib.contenttypes"]


class EmptiedAfter(TransactionTestCase):
    """Django's TransactionTestCase, but emptying this app's tables with DELETE instead of TRUNCATE.

    Django's flush truncates every table of ``available_apps``: about 80 here, a second or more per test
    on a loaded machine, where a DELETE of the few rows a test wrote costs milliseconds. One
    transaction, so that the deferred foreign keys of both backends allow any order."""

    available_apps = AVAILABLE_APPS

    def _fixture_teardown(self) -> None:
        for alias in self._databases_names(include_mirrors=False):
            with transaction.atomic(using=alias):
                for model in apps.get_app_config("django_contract").get_models(include_auto_created=True):
                    model._base_manager.using(alias).all()._raw_delete(alias)


class OutsideTransaction(EmptiedAfter):
    """A Django test class run outside a transaction, where the app promises Django's statement
    counts or lower (a save inside ``atomic()`` runs in a savepoint of its own)."""

    def assertNumQueries(  # type: ignore[override]
        self, num: int, func: Any = None, *args: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any
    ) -> Any:
        """Django's ``assertNumQueries`` (as a context manager, or calling ``func``), transaction
        control left out."""
        counted = self._counted(num, using)
        if func is None:
            return counted
        with counted:
            func(*args, **kwargs)
        return None

    @contextmanager
    def _counted(self, num: int, using: str) -> Iterator[CaptureQueriesContext]:
        context = CaptureQueriesContext(connections[using])
        with context:
            yield context
        statements = [query["sql"] for query in context.captured_queries if query["sql"] not in TRANSACTION_CONTROL]
        listing = "\n".join(f"{i}. {sql}" for i, sql in enumerate(statements, start=1))
        self.assertEqual(len(statements), num, f"{len(statements)} statements executed, {num} expected:\n{listing}")
