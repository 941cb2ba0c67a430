"""Django's ``tests/force_insert_update/tests.py`` on models with ``LockVersionMixin``.

Run outside a transaction where Django counts statements (see :class:`.support.OutsideTransaction`).
"""

from __future__ import annotations

import django
from django.db import DatabaseError, IntegrityError, models, transaction
from django.test import TestCase

from safeupdates.exceptions import NeverLoadedError

from .models import (
    Counter,
    DiamondSubSubCounter,
    InheritedCounter,
    OtherSubCounter,
    ProxyCounter,
    SubCounter,
    SubSubCounter,
    WithCustomPK,
)
from .support import OutsideTransaction, difference, never_loaded, on_sqlite_version_source


class ForceTests(TestCase):
    def test_force_update(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceTests::test_force_update"""
        c = Counter.objects.create(name="one", value=1)
        # The normal case
        c.value = 2
        c.save()
        # Same thing, via an update
        c.value = 3
        c.save(force_update=True)
        # Won't work because force_update and force_insert are mutually exclusive
        c.value = 4
        msg = "Cannot force both insert and updating in model saving."
        with self.assertRaisesMessage(ValueError, msg):
            c.save(force_insert=True, force_update=True)
        # Try to update something that doesn't have a primary key in the first place.
        c1 = Counter(name="two", value=2)
        msg = "Cannot force an update in save() with no primary key."
        with self.assertRaisesMessage(ValueError, msg), transaction.atomic():
            c1.save(force_update=True)
        c1.save(force_insert=True)
        # Won't work because we can't insert a pk of the same value.
        c.value = 5
        with self.assertRaises(IntegrityError), transaction.atomic():
            c.save(force_insert=True)
        # Trying to update should still fail, even with manual primary keys, if the data isn't in the
        # database already.
        obj = WithCustomPK(name=1, value=1)
        msg = "Forced update did not affect any rows."
        exceptions: list[type[Exception]] = [DatabaseError]
        if django.VERSION >= (6, 0):
            from django.core.exceptions import ObjectNotUpdated

            # Make sure backward compatibility with DatabaseError is preserved.
            exceptions += [ObjectNotUpdated, WithCustomPK.NotUpdated]  # type: ignore[attr-defined]
        for exception in exceptions:
            with self.subTest(exception), self.assertRaisesMessage(exception, msg), transaction.atomic():
                obj.save(force_update=True)


class InheritanceTests(TestCase):
    def test_force_update_on_inherited_model(self) -> None:
        """Django: tests/force_insert_update/tests.py::InheritanceTests::test_force_update_on_inherited_model"""
        a = InheritedCounter(name="count", value=1, tag="spam")
        a.save()
        a.save(force_update=True)
        self.assertEqual(InheritedCounter.objects.get().tag, "spam")

    def test_force_update_on_proxy_model(self) -> None:
        """Django: tests/force_insert_update/tests.py::InheritanceTests::test_force_update_on_proxy_model"""
        a = ProxyCounter(name="count", value=1)
        a.save()
        a.save(force_update=True)
        self.assertEqual(ProxyCounter.objects.get().name, "count")

    def test_force_update_on_inherited_model_without_fields(self) -> None:
        """Django: tests/force_insert_update/tests.py::InheritanceTests::test_force_update_on_inherited_model_without_fields"""  # noqa: E501
        a = SubCounter(name="count", value=1)
        a.save()
        a.value = 2
        a.save(force_update=True)
        self.assertEqual(SubCounter.objects.get().value, 2)


class ForceInsertInheritanceTests(OutsideTransaction):
    def test_force_insert_not_bool_or_tuple(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_not_bool_or_tuple"""  # noqa: E501
        msg = "force_insert must be a bool or tuple."
        with self.assertRaisesMessage(TypeError, msg), transaction.atomic():
            Counter().save(force_insert=1)
        with self.assertRaisesMessage(TypeError, msg), transaction.atomic():
            Counter().save(force_insert="test")
        with self.assertRaisesMessage(TypeError, msg), transaction.atomic():
            Counter().save(force_insert=[])

    def test_force_insert_not_model(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_not_model"""
        msg = f"Invalid force_insert member. {object!r} must be a model subclass."
        with self.assertRaisesMessage(TypeError, msg), transaction.atomic():
            Counter().save(force_insert=(object,))
        instance = Counter()
        msg = f"Invalid force_insert member. {instance!r} must be a model subclass."
        with self.assertRaisesMessage(TypeError, msg), transaction.atomic():
            Counter().save(force_insert=(instance,))

    def test_force_insert_not_base(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_not_base"""
        msg = "Invalid force_insert member. SubCounter must be a base of Counter."
        with self.assertRaisesMessage(TypeError, msg):
            Counter().save(force_insert=(SubCounter,))

    @difference
    @on_sqlite_version_source
    def test_force_insert_false(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_false

        Differences: create() with a key of its own inserts the parent's row in one statement (INSERT ... ON
        CONFLICT DO NOTHING), where Django tries an UPDATE first (2 statements, Django 3); a new instance
        with the key of an existing row never loaded that row, so its save is refused (NeverLoadedError)
        and writes nothing, in one statement, where Django's writes over the row (2 statements). Given
        the row's version, as an instance loaded from it carries, it is checked and saved."""
        with self.assertNumQueries(2, sqlite_versions=1):
            obj = SubCounter.objects.create(pk=1, value=0)
        for value, force_insert in ((1, None), (2, False), (3, ())):
            with (
                self.assertNumQueries(1, sqlite_versions=1),
                self.assertRaisesMessage(NeverLoadedError, never_loaded(SubCounter, obj.pk)),
            ):
                if force_insert is None:
                    SubCounter(pk=obj.pk, value=value).save()
                else:
                    SubCounter(pk=obj.pk, value=value).save(force_insert=force_insert)
            obj.refresh_from_db()
            self.assertEqual(obj.value, 0)
        with self.assertNumQueries(2, sqlite_versions=1):
            SubCounter(pk=obj.pk, lock_version=obj.lock_version, value=1).save()
        obj.refresh_from_db()
        self.assertEqual(obj.value, 1)

    @difference
    @on_sqlite_version_source
    def test_force_insert_false_with_existing_parent(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_false_with_existing_parent

        Difference: a child created for an existing parent by its key alone never loaded the parent's
        row (NeverLoadedError, nothing written); given the loaded parent, it is checked against the
        parent's version, in Django's 2 statements."""  # noqa: E501
        parent = Counter.objects.create(pk=1, value=1)
        with (
            self.assertNumQueries(1, sqlite_versions=1),
            self.assertRaisesMessage(NeverLoadedError, never_loaded(SubCounter, parent.pk)),
        ):
            SubCounter.objects.create(pk=parent.pk, value=2)
        self.assertFalse(SubCounter.objects.exists())
        with self.assertNumQueries(2, sqlite_versions=1):
            SubCounter.objects.create(counter_ptr=parent, value=2)
        self.assertEqual(SubCounter.objects.get(pk=parent.pk).value, 2)

    @difference
    @on_sqlite_version_source
    def test_force_insert_parent(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_parent

        Difference: a parent's row not forced to insert, for a new instance with a key of its own, is
        inserted in one statement (INSERT ... ON CONFLICT DO NOTHING) where Django tries an UPDATE first
        (2 statements, Django 3)."""
        with self.assertNumQueries(2, sqlite_versions=1):
            SubCounter(pk=1, value=1).save(force_insert=True)
        # Force insert a new parent and don't UPDATE first.
        with self.assertNumQueries(2, sqlite_versions=1):
            SubCounter(pk=2, value=1).save(force_insert=(Counter,))
        with self.assertNumQueries(2, sqlite_versions=1):
            SubCounter(pk=3, value=1).save(force_insert=(models.Model,))

    @difference
    @on_sqlite_version_source
    def test_force_insert_with_grandparent(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_with_grandparent

        Difference: a grandparent's row not forced to insert, for a new instance with a key of its own, is
        inserted in one statement (INSERT ... ON CONFLICT DO NOTHING) where Django tries an UPDATE first
        (3 statements, Django 4)."""
        with self.assertNumQueries(3, sqlite_versions=1):
            SubSubCounter(pk=1, value=1).save(force_insert=True)
        # Force insert parents on all levels and don't UPDATE first.
        with self.assertNumQueries(3, sqlite_versions=1):
            SubSubCounter(pk=2, value=1).save(force_insert=(models.Model,))
        with self.assertNumQueries(3, sqlite_versions=1):
            SubSubCounter(pk=3, value=1).save(force_insert=(Counter,))
        # Force insert only the last parent.
        with self.assertNumQueries(3, sqlite_versions=1):
            SubSubCounter(pk=4, value=1).save(force_insert=(SubCounter,))

    @difference
    @on_sqlite_version_source
    def test_force_insert_with_existing_grandparent(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_with_existing_grandparent

        Difference: a grandchild created for an existing grandparent by its key alone never loaded the
        grandparent's row (NeverLoadedError, nothing written, one statement); given the grandparent's
        version, it is checked against it, in Django's statements."""  # noqa: E501
        # Force insert only the last child.
        grandparent = Counter.objects.create(pk=1, value=1)
        with (
            self.assertNumQueries(1, sqlite_versions=1),
            self.assertRaisesMessage(NeverLoadedError, never_loaded(SubSubCounter, grandparent.pk)),
        ):
            SubSubCounter(pk=grandparent.pk, value=1).save(force_insert=True)
        with self.assertNumQueries(4, sqlite_versions=1):
            SubSubCounter(pk=grandparent.pk, lock_version=grandparent.lock_version, value=1).save(force_insert=True)
        # Force insert a parent, and don't force insert a grandparent.
        grandparent = Counter.objects.create(pk=2, value=1)
        with (
            self.assertNumQueries(1, sqlite_versions=1),
            self.assertRaisesMessage(NeverLoadedError, never_loaded(SubSubCounter, grandparent.pk)),
        ):
            SubSubCounter(pk=grandparent.pk, value=1).save(force_insert=(SubCounter,))
        with self.assertNumQueries(3, sqlite_versions=1):
            SubSubCounter(pk=grandparent.pk, lock_version=grandparent.lock_version, value=1).save(
                force_insert=(SubCounter,)
            )
        self.assertEqual(SubSubCounter.objects.count(), 2)
        # Force insert parents on all levels, grandparent conflicts.
        grandparent = Counter.objects.create(pk=3, value=1)
        with self.assertRaises(IntegrityError), transaction.atomic():
            SubSubCounter(pk=grandparent.pk, value=1).save(force_insert=(Counter,))

    @difference
    @on_sqlite_version_source
    def test_force_insert_diamond_mti(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_diamond_mti

        Differences: a common grandparent's row not forced to insert is inserted in one statement (INSERT
        ... ON CONFLICT DO NOTHING) where Django tries an UPDATE first (4 statements, Django 5); one
        created for an existing grandparent by its key alone is refused (NeverLoadedError), and given
        the grandparent's version, checked against it in Django's statements."""
        # Force insert all parents.
        with self.assertNumQueries(4, sqlite_versions=1):
            DiamondSubSubCounter(pk=1, value=1).save(force_insert=(Counter, SubCounter, OtherSubCounter))
        with self.assertNumQueries(4, sqlite_versions=1):
            DiamondSubSubCounter(pk=2, value=1).save(force_insert=(models.Model,))
        # Force insert parents, and don't force insert a common grandparent.
        with self.assertNumQueries(4, sqlite_versions=1):
            DiamondSubSubCounter(pk=3, value=1).save(force_insert=(SubCounter, OtherSubCounter))
        grandparent = Counter.objects.create(pk=4, value=1)
        with (
            self.assertNumQueries(1, sqlite_versions=1),
            self.assertRaisesMessage(NeverLoadedError, never_loaded(DiamondSubSubCounter, grandparent.pk)),
        ):
            DiamondSubSubCounter(pk=grandparent.pk, value=1).save(force_insert=(SubCounter, OtherSubCounter))
        with self.assertNumQueries(4, sqlite_versions=1):
            DiamondSubSubCounter(pk=grandparent.pk, lock_version=grandparent.lock_version, value=1).save(
                force_insert=(SubCounter, OtherSubCounter)
            )
        # Force insert all parents, grandparent conflicts.
        grandparent = Counter.objects.create(pk=5, value=1)
        with self.assertRaises(IntegrityError), transaction.atomic():
            DiamondSubSubCounter(pk=grandparent.pk, value=1).save(force_insert=(models.Model,))
