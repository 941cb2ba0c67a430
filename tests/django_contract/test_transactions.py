"""Django's ``tests/transactions/tests.py`` on a model with ``LockVersionMixin``: saves inside and
outside ``atomic()``, nested, merged and durable blocks, broken transactions, manual autocommit.

A save inside ``atomic()`` takes no savepoint: a refused save writes nothing, so a StaleObjectError
leaves the caller's transaction usable, and any other error leaves it as Django's own save does
(docs/concepts.md); these tests check that nothing else of Django's transaction semantics changes.
"""

from __future__ import annotations

import sys

from django.db import DatabaseError, Error, IntegrityError, connection, transaction
from django.test import TestCase, skipUnlessDBFeature

from .models import Reporter
from .support import EmptiedAfter

# Django 6.1 renamed transaction.savepoint() (deprecated there) to savepoint_create().
SAVEPOINT_CREATE = getattr(transaction, "savepoint_create", transaction.savepoint)


@skipUnlessDBFeature("uses_savepoints")
class AtomicTests(EmptiedAfter):
    """Django: tests/transactions/tests.py::AtomicTests (each test below, and in the two subclasses)."""

    def test_decorator_syntax_commit(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_decorator_syntax_commit"""

        @transaction.atomic
        def make_reporter() -> Reporter:
            return Reporter.objects.create(first_name="Tintin")

        reporter = make_reporter()
        self.assertSequenceEqual(Reporter.objects.all(), [reporter])

    def test_decorator_syntax_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_decorator_syntax_rollback"""

        @transaction.atomic
        def make_reporter() -> None:
            Reporter.objects.create(first_name="Haddock")
            raise Exception("Oops, that's his last name")

        with self.assertRaisesMessage(Exception, "Oops"):
            make_reporter()
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_alternate_decorator_syntax_commit(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_alternate_decorator_syntax_commit"""

        @transaction.atomic()
        def make_reporter() -> Reporter:
            return Reporter.objects.create(first_name="Tintin")

        reporter = make_reporter()
        self.assertSequenceEqual(Reporter.objects.all(), [reporter])

    def test_alternate_decorator_syntax_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_alternate_decorator_syntax_rollback"""

        @transaction.atomic()
        def make_reporter() -> None:
            Reporter.objects.create(first_name="Haddock")
            raise Exception("Oops, that's his last name")

        with self.assertRaisesMessage(Exception, "Oops"):
            make_reporter()
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_commit(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_commit"""
        with transaction.atomic():
            reporter = Reporter.objects.create(first_name="Tintin")
        self.assertSequenceEqual(Reporter.objects.all(), [reporter])

    def test_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_rollback"""
        with self.assertRaisesMessage(Exception, "Oops"), transaction.atomic():
            Reporter.objects.create(first_name="Haddock")
            raise Exception("Oops, that's his last name")
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_nested_commit_commit(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_nested_commit_commit"""
        with transaction.atomic():
            reporter1 = Reporter.objects.create(first_name="Tintin")
            with transaction.atomic():
                reporter2 = Reporter.objects.create(first_name="Archibald", last_name="Haddock")
        self.assertSequenceEqual(Reporter.objects.all(), [reporter2, reporter1])

    def test_nested_commit_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_nested_commit_rollback"""
        with transaction.atomic():
            reporter = Reporter.objects.create(first_name="Tintin")
            with self.assertRaisesMessage(Exception, "Oops"), transaction.atomic():
                Reporter.objects.create(first_name="Haddock")
                raise Exception("Oops, that's his last name")
        self.assertSequenceEqual(Reporter.objects.all(), [reporter])

    def test_nested_rollback_commit(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_nested_rollback_commit"""
        with self.assertRaisesMessage(Exception, "Oops"), transaction.atomic():
            Reporter.objects.create(last_name="Tintin")
            with transaction.atomic():
                Reporter.objects.create(last_name="Haddock")
            raise Exception("Oops, that's his first name")
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_nested_rollback_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_nested_rollback_rollback"""
        with self.assertRaisesMessage(Exception, "Oops"), transaction.atomic():
            Reporter.objects.create(last_name="Tintin")
            with self.assertRaisesMessage(Exception, "Oops"):
                with transaction.atomic():
                    Reporter.objects.create(first_name="Haddock")
                raise Exception("Oops, that's his last name")
            raise Exception("Oops, that's his first name")
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_merged_commit_commit(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_merged_commit_commit"""
        with transaction.atomic():
            reporter1 = Reporter.objects.create(first_name="Tintin")
            with transaction.atomic(savepoint=False):
                reporter2 = Reporter.objects.create(first_name="Archibald", last_name="Haddock")
        self.assertSequenceEqual(Reporter.objects.all(), [reporter2, reporter1])

    def test_merged_commit_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_merged_commit_rollback"""
        with transaction.atomic():
            Reporter.objects.create(first_name="Tintin")
            with self.assertRaisesMessage(Exception, "Oops"), transaction.atomic(savepoint=False):
                Reporter.objects.create(first_name="Haddock")
                raise Exception("Oops, that's his last name")
        # Writes in the outer block are rolled back too.
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_merged_rollback_commit(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_merged_rollback_commit"""
        with self.assertRaisesMessage(Exception, "Oops"), transaction.atomic():
            Reporter.objects.create(last_name="Tintin")
            with transaction.atomic(savepoint=False):
                Reporter.objects.create(last_name="Haddock")
            raise Exception("Oops, that's his first name")
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_merged_rollback_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_merged_rollback_rollback"""
        with self.assertRaisesMessage(Exception, "Oops"), transaction.atomic():
            Reporter.objects.create(last_name="Tintin")
            with self.assertRaisesMessage(Exception, "Oops"):
                with transaction.atomic(savepoint=False):
                    Reporter.objects.create(first_name="Haddock")
                raise Exception("Oops, that's his last name")
            raise Exception("Oops, that's his first name")
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_reuse_commit_commit(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_reuse_commit_commit"""
        atomic = transaction.atomic()
        with atomic:
            reporter1 = Reporter.objects.create(first_name="Tintin")
            with atomic:
                reporter2 = Reporter.objects.create(first_name="Archibald", last_name="Haddock")
        self.assertSequenceEqual(Reporter.objects.all(), [reporter2, reporter1])

    def test_reuse_commit_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_reuse_commit_rollback"""
        atomic = transaction.atomic()
        with atomic:
            reporter = Reporter.objects.create(first_name="Tintin")
            with self.assertRaisesMessage(Exception, "Oops"), atomic:
                Reporter.objects.create(first_name="Haddock")
                raise Exception("Oops, that's his last name")
        self.assertSequenceEqual(Reporter.objects.all(), [reporter])

    def test_reuse_rollback_commit(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_reuse_rollback_commit"""
        atomic = transaction.atomic()
        with self.assertRaisesMessage(Exception, "Oops"), atomic:
            Reporter.objects.create(last_name="Tintin")
            with atomic:
                Reporter.objects.create(last_name="Haddock")
            raise Exception("Oops, that's his first name")
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_reuse_rollback_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_reuse_rollback_rollback"""
        atomic = transaction.atomic()
        with self.assertRaisesMessage(Exception, "Oops"), atomic:
            Reporter.objects.create(last_name="Tintin")
            with self.assertRaisesMessage(Exception, "Oops"):
                with atomic:
                    Reporter.objects.create(first_name="Haddock")
                raise Exception("Oops, that's his last name")
            raise Exception("Oops, that's his first name")
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_force_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_force_rollback"""
        with transaction.atomic():
            Reporter.objects.create(first_name="Tintin")
            # atomic block shouldn't rollback, but force it.
            self.assertFalse(transaction.get_rollback())
            transaction.set_rollback(True)
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_prevent_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_prevent_rollback"""
        with transaction.atomic():
            reporter = Reporter.objects.create(first_name="Tintin")
            sid = SAVEPOINT_CREATE()
            # trigger a database error inside an inner atomic without savepoint
            with self.assertRaises(DatabaseError), transaction.atomic(savepoint=False), connection.cursor() as cursor:
                cursor.execute("SELECT no_such_col FROM django_contract_reporter")
            # prevent atomic from rolling back since we're recovering manually
            self.assertTrue(transaction.get_rollback())
            transaction.set_rollback(False)
            transaction.savepoint_rollback(sid)
        self.assertSequenceEqual(Reporter.objects.all(), [reporter])

    @skipUnlessDBFeature("can_release_savepoints")
    def test_failure_on_exit_transaction(self) -> None:
        """Django: tests/transactions/tests.py::AtomicTests::test_failure_on_exit_transaction"""
        with transaction.atomic():
            with self.assertRaises(DatabaseError), transaction.atomic():
                Reporter.objects.create(last_name="Tintin")
                self.assertEqual(len(Reporter.objects.all()), 1)
                # Incorrect savepoint id to provoke a database error.
                connection.savepoint_ids.append("12")
            with self.assertRaises(transaction.TransactionManagementError):
                len(Reporter.objects.all())
            self.assertIs(connection.needs_rollback, True)
            if connection.savepoint_ids:
                connection.savepoint_ids.pop()
        self.assertSequenceEqual(Reporter.objects.all(), [])


class AtomicInsideTransactionTests(AtomicTests):
    """Django: tests/transactions/tests.py::AtomicInsideTransactionTests (AtomicTests' tests inside an
    existing transaction)."""

    def setUp(self) -> None:
        self.atomic = transaction.atomic()
        self.atomic.__enter__()

    def tearDown(self) -> None:
        self.atomic.__exit__(*sys.exc_info())


class AtomicWithoutAutocommitTests(AtomicTests):
    """Django: tests/transactions/tests.py::AtomicWithoutAutocommitTests (AtomicTests' tests with
    autocommit turned off)."""

    def setUp(self) -> None:
        transaction.set_autocommit(False)
        self.addCleanup(transaction.set_autocommit, True)
        # The tests access the database after exercising 'atomic', initiating a transaction; a rollback
        # is required before restoring autocommit.
        self.addCleanup(transaction.rollback)


@skipUnlessDBFeature("uses_savepoints")
class AtomicMergeTests(EmptiedAfter):
    def test_merged_outer_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicMergeTests::test_merged_outer_rollback"""
        with transaction.atomic():
            Reporter.objects.create(first_name="Tintin")
            with transaction.atomic(savepoint=False):
                Reporter.objects.create(first_name="Archibald", last_name="Haddock")
                with self.assertRaisesMessage(Exception, "Oops"), transaction.atomic(savepoint=False):
                    Reporter.objects.create(first_name="Calculus")
                    raise Exception("Oops, that's his last name")
                # The third insert couldn't be roll back. Temporarily mark the connection as not needing
                # rollback to check it.
                self.assertTrue(transaction.get_rollback())
                transaction.set_rollback(False)
                self.assertEqual(Reporter.objects.count(), 3)
                transaction.set_rollback(True)
            # The second insert couldn't be roll back. Temporarily mark the connection as not needing
            # rollback to check it.
            self.assertTrue(transaction.get_rollback())
            transaction.set_rollback(False)
            self.assertEqual(Reporter.objects.count(), 3)
            transaction.set_rollback(True)
        # The first block has a savepoint and must roll back.
        self.assertSequenceEqual(Reporter.objects.all(), [])

    def test_merged_inner_savepoint_rollback(self) -> None:
        """Django: tests/transactions/tests.py::AtomicMergeTests::test_merged_inner_savepoint_rollback"""
        with transaction.atomic():
            reporter = Reporter.objects.create(first_name="Tintin")
            with transaction.atomic():
                Reporter.objects.create(first_name="Archibald", last_name="Haddock")
                with self.assertRaisesMessage(Exception, "Oops"), transaction.atomic(savepoint=False):
                    Reporter.objects.create(first_name="Calculus")
                    raise Exception("Oops, that's his last name")
                # The third insert couldn't be roll back. Temporarily mark the connection as not needing
                # rollback to check it.
                self.assertTrue(transaction.get_rollback())
                transaction.set_rollback(False)
                self.assertEqual(Reporter.objects.count(), 3)
                transaction.set_rollback(True)
            # The second block has a savepoint and must roll back.
            self.assertEqual(Reporter.objects.count(), 1)
        self.assertSequenceEqual(Reporter.objects.all(), [reporter])


@skipUnlessDBFeature("uses_savepoints")
class AtomicErrorsTests(EmptiedAfter):
    def test_atomic_prevents_queries_in_broken_transaction(self) -> None:
        """Django: tests/transactions/tests.py::AtomicErrorsTests::test_atomic_prevents_queries_in_broken_transaction"""
        r1 = Reporter.objects.create(first_name="Archibald", last_name="Haddock")
        with transaction.atomic():
            r2 = Reporter(first_name="Cuthbert", last_name="Calculus", id=r1.id)
            with self.assertRaises(IntegrityError):
                r2.save(force_insert=True)
            # The transaction is marked as needing rollback.
            msg = (
                "An error occurred in the current transaction. You can't execute queries until the end of the "
                "'atomic' block."
            )
            with self.assertRaisesMessage(transaction.TransactionManagementError, msg) as cm:
                r2.save(force_update=True)
        self.assertIsInstance(cm.exception.__cause__, IntegrityError)
        self.assertEqual(Reporter.objects.get(pk=r1.pk).last_name, "Haddock")

    @skipUnlessDBFeature("test_db_allows_multiple_connections")
    def test_atomic_prevents_queries_in_broken_transaction_after_client_close(self) -> None:
        """Django: tests/transactions/tests.py::AtomicErrorsTests::test_atomic_prevents_queries_in_broken_transaction_after_client_close"""  # noqa: E501
        with transaction.atomic():
            Reporter.objects.create(first_name="Archibald", last_name="Haddock")
            connection.close()
            # The connection is closed and the transaction is marked as needing rollback. This raises an
            # InterfaceError on databases that refuse to create cursors on closed connections
            # (PostgreSQL) and a TransactionManagementError on other databases.
            with self.assertRaises(Error):
                Reporter.objects.create(first_name="Cuthbert", last_name="Calculus")
        # The connection is usable again.
        self.assertEqual(Reporter.objects.count(), 0)


class AtomicMiscTests(EmptiedAfter):
    @skipUnlessDBFeature("supports_transactions")
    def test_mark_for_rollback_on_error_in_transaction(self) -> None:
        """Django: tests/transactions/tests.py::AtomicMiscTests::test_mark_for_rollback_on_error_in_transaction"""
        with transaction.atomic(savepoint=False):
            # Swallow the intentional error raised.
            with self.assertRaisesMessage(Exception, "Oops"), transaction.mark_for_rollback_on_error():
                # Ensure that we are still in a good state.
                self.assertFalse(transaction.get_rollback())
                raise Exception("Oops")
            # mark_for_rollback_on_error marked the transaction as broken ...
            self.assertTrue(transaction.get_rollback())
            # ... and further queries fail.
            msg = "You can't execute queries until the end of the 'atomic' block."
            with self.assertRaisesMessage(transaction.TransactionManagementError, msg):
                Reporter.objects.create()
        # Transaction errors are reset at the end of an transaction, so this should just work.
        Reporter.objects.create()

    def test_mark_for_rollback_on_error_in_autocommit(self) -> None:
        """Django: tests/transactions/tests.py::AtomicMiscTests::test_mark_for_rollback_on_error_in_autocommit"""
        self.assertTrue(transaction.get_autocommit())
        # Swallow the intentional error raised.
        with self.assertRaisesMessage(Exception, "Oops"), transaction.mark_for_rollback_on_error():
            # Ensure that we are still in a good state.
            self.assertFalse(transaction.get_connection().needs_rollback)
            raise Exception("Oops")
        # Ensure that mark_for_rollback_on_error did not mark the transaction as broken, since we are in
        # autocommit mode ...
        self.assertFalse(transaction.get_connection().needs_rollback)
        # ... and further queries work nicely.
        Reporter.objects.create()


@skipUnlessDBFeature("supports_transactions")
class NonAutocommitTests(EmptiedAfter):
    def setUp(self) -> None:
        transaction.set_autocommit(False)
        self.addCleanup(transaction.set_autocommit, True)
        self.addCleanup(transaction.rollback)

    @skipUnlessDBFeature("supports_foreign_keys")
    def test_orm_query_after_error_and_rollback(self) -> None:
        """Django: tests/transactions/tests.py::NonAutocommitTests::test_orm_query_after_error_and_rollback"""
        r1 = Reporter.objects.create(first_name="Archibald", last_name="Haddock")
        r2 = Reporter(first_name="Cuthbert", last_name="Calculus", id=r1.id)
        with self.assertRaises(IntegrityError):
            r2.save(force_insert=True)
        transaction.rollback()
        Reporter.objects.last()

    def test_orm_query_without_autocommit(self) -> None:
        """Django: tests/transactions/tests.py::NonAutocommitTests::test_orm_query_without_autocommit"""
        Reporter.objects.create(first_name="Tintin")


class DurableTestsBase:
    """Django: tests/transactions/tests.py::DurableTestsBase (run by both subclasses)."""

    def test_commit(self) -> None:
        """Django: tests/transactions/tests.py::DurableTestsBase::test_commit"""
        with transaction.atomic(durable=True):
            reporter = Reporter.objects.create(first_name="Tintin")
        self.assertEqual(Reporter.objects.get(), reporter)  # type: ignore[attr-defined]

    def test_nested_outer_durable(self) -> None:
        """Django: tests/transactions/tests.py::DurableTestsBase::test_nested_outer_durable"""
        with transaction.atomic(durable=True):
            reporter1 = Reporter.objects.create(first_name="Tintin")
            with transaction.atomic():
                reporter2 = Reporter.objects.create(first_name="Archibald", last_name="Haddock")
        self.assertSequenceEqual(Reporter.objects.all(), [reporter2, reporter1])  # type: ignore[attr-defined]

    def test_sequence_of_durables(self) -> None:
        """Django: tests/transactions/tests.py::DurableTestsBase::test_sequence_of_durables"""
        with transaction.atomic(durable=True):
            reporter = Reporter.objects.create(first_name="Tintin 1")
        self.assertEqual(Reporter.objects.get(first_name="Tintin 1"), reporter)  # type: ignore[attr-defined]
        with transaction.atomic(durable=True):
            reporter = Reporter.objects.create(first_name="Tintin 2")
        self.assertEqual(Reporter.objects.get(first_name="Tintin 2"), reporter)  # type: ignore[attr-defined]


class DurableTransactionTests(DurableTestsBase, EmptiedAfter):
    """Django: tests/transactions/tests.py::DurableTransactionTests"""


class DurableTests(DurableTestsBase, TestCase):
    """Django: tests/transactions/tests.py::DurableTests"""
