"""What the ported suite shares: the marks of what differs from Django, and the statement count."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import Model
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext

from safeupdates.models import VersionCounter

#: A test that asserts one of the app's documented differences from Django (docs/limits.md,
#: docs/concepts.md), said in its docstring: a row changed or deleted since it was loaded raises
#: StaleObjectError; a new instance never writes over a row it did not load (NeverLoadedError); an
#: instance loaded without lock_version is refused; a statement count other than Django's.
difference = pytest.mark.difference

T = TypeVar("T")


def _unmarked(test: T) -> T:
    return test


#: ``difference`` on SQLite only, whose version source runs a statement of its own before a save's
#: (``assertNumQueries(..., sqlite_versions=n)``); Django's own test on PostgreSQL, where the version is
#: taken inside the save's statement.
on_sqlite_version_source: Callable[[T], T] = difference if connection.vendor == "sqlite" else _unmarked


def takes_a_version(sql: str) -> bool:
    """Whether ``sql`` is the statement that takes a version from SQLite's counter table."""
    return sql.startswith("UPDATE ") and connection.ops.quote_name(VersionCounter._meta.db_table) in sql


def stale_delete(model: type[Model], pk: Any, lock_version: int) -> str:
    """The message of the StaleObjectError that refuses the delete of an instance of ``model`` loaded at
    ``lock_version`` whose row moved on since."""
    return (
        f"{model._meta.label} pk={pk!r} was changed after it was loaded (lock_version {lock_version}); reload it "
        "and decide again before deleting it."
    )


def never_loaded(model: type[Model], pk: Any) -> str:
    """The message of the NeverLoadedError that refuses a new instance of ``model`` whose key ``pk``
    names a row it never loaded."""
    return (
        f"{model._meta.label} pk={pk!r} exists, and this instance never loaded it: there is no lock_version "
        "to check its save against. Load the row and change that instance, or write with update_if_newer() "
        "or with_lock()."
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
    counts or lower (inside a transaction, a delete with cascades locks its row first: docs/limits.md)."""

    def assertNumQueries(  # type: ignore[override]
        self,
        num: int,
        func: Any = None,
        *args: Any,
        using: str = DEFAULT_DB_ALIAS,
        sqlite_versions: int = 0,
        sqlite_parents: int = 0,
        **kwargs: Any,
    ) -> Any:
        """Django's ``assertNumQueries`` (as a context manager, or calling ``func``), transaction
        control left out. On SQLite (docs/limits.md), ``sqlite_versions`` statements more, one per
        version the saves take from the counter table, and ``sqlite_parents`` more, one per save whose
        ``update_fields`` names a multi-table child's fields only: the parent's row, which holds the
        versions, is checked and written in an UPDATE of its own (PostgreSQL does both in one)."""
        if connections[using].vendor == "sqlite":
            num += sqlite_versions + sqlite_parents
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
