"""Django's ``tests/force_insert_update/tests.py`` on models with ``LockVersionMixin``.

Run outside a transaction where Django counts statements (see :class:`.support.OutsideTransaction`).
"""

from __future__ import annotations

import django
from django.db import DatabaseError, IntegrityError, models, transaction
from django.test import TestCase

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
from .support import OutsideTransaction, issue_24


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

    @issue_24(2, "a new instance with an existing row's pk raises StaleObjectError instead of updating the row")
    def test_force_insert_false(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_false"""
        with self.assertNumQueries(3):
            obj = SubCounter.objects.create(pk=1, value=0)
        with self.assertNumQueries(2):
            SubCounter(pk=obj.pk, value=1).save()
        obj.refresh_from_db()
        self.assertEqual(obj.value, 1)
        with self.assertNumQueries(2):
            SubCounter(pk=obj.pk, value=2).save(force_insert=False)
        obj.refresh_from_db()
        self.assertEqual(obj.value, 2)
        with self.assertNumQueries(2):
            SubCounter(pk=obj.pk, value=3).save(force_insert=())
        obj.refresh_from_db()
        self.assertEqual(obj.value, 3)

    @issue_24(2, "a multi-table child created for an existing parent raises StaleObjectError")
    def test_force_insert_false_with_existing_parent(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_false_with_existing_parent"""  # noqa: E501
        parent = Counter.objects.create(pk=1, value=1)
        with self.assertNumQueries(2):
            SubCounter.objects.create(pk=parent.pk, value=2)

    @issue_24(4, "a new instance with an explicit pk that matches no row runs an extra SELECT 1")
    def test_force_insert_parent(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_parent"""
        with self.assertNumQueries(3):
            SubCounter(pk=1, value=1).save(force_insert=True)
        # Force insert a new parent and don't UPDATE first.
        with self.assertNumQueries(2):
            SubCounter(pk=2, value=1).save(force_insert=(Counter,))
        with self.assertNumQueries(2):
            SubCounter(pk=3, value=1).save(force_insert=(models.Model,))

    @issue_24(4, "a new instance with an explicit pk that matches no row runs an extra SELECT 1")
    def test_force_insert_with_grandparent(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_with_grandparent"""  # noqa: E501
        with self.assertNumQueries(4):
            SubSubCounter(pk=1, value=1).save(force_insert=True)
        # Force insert parents on all levels and don't UPDATE first.
        with self.assertNumQueries(3):
            SubSubCounter(pk=2, value=1).save(force_insert=(models.Model,))
        with self.assertNumQueries(3):
            SubSubCounter(pk=3, value=1).save(force_insert=(Counter,))
        # Force insert only the last parent.
        with self.assertNumQueries(4):
            SubSubCounter(pk=4, value=1).save(force_insert=(SubCounter,))

    @issue_24(2, "a multi-table child created for an existing grandparent raises StaleObjectError")
    def test_force_insert_with_existing_grandparent(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_with_existing_grandparent"""  # noqa: E501
        # Force insert only the last child.
        grandparent = Counter.objects.create(pk=1, value=1)
        with self.assertNumQueries(4):
            SubSubCounter(pk=grandparent.pk, value=1).save(force_insert=True)
        # Force insert a parent, and don't force insert a grandparent.
        grandparent = Counter.objects.create(pk=2, value=1)
        with self.assertNumQueries(3):
            SubSubCounter(pk=grandparent.pk, value=1).save(force_insert=(SubCounter,))
        # Force insert parents on all levels, grandparent conflicts.
        grandparent = Counter.objects.create(pk=3, value=1)
        with self.assertRaises(IntegrityError), transaction.atomic():
            SubSubCounter(pk=grandparent.pk, value=1).save(force_insert=(Counter,))

    @issue_24(2, "a multi-table child created for an existing grandparent raises StaleObjectError")
    def test_force_insert_diamond_mti(self) -> None:
        """Django: tests/force_insert_update/tests.py::ForceInsertInheritanceTests::test_force_insert_diamond_mti"""
        # Force insert all parents.
        with self.assertNumQueries(4):
            DiamondSubSubCounter(pk=1, value=1).save(force_insert=(Counter, SubCounter, OtherSubCounter))
        with self.assertNumQueries(4):
            DiamondSubSubCounter(pk=2, value=1).save(force_insert=(models.Model,))
        # Force insert parents, and don't force insert a common grandparent.
        with self.assertNumQueries(5):
            DiamondSubSubCounter(pk=3, value=1).save(force_insert=(SubCounter, OtherSubCounter))
        grandparent = Counter.objects.create(pk=4, value=1)
        with self.assertNumQueries(4):
            DiamondSubSubCounter(pk=grandparent.pk, value=1).save(force_insert=(SubCounter, OtherSubCounter))
        # Force insert all parents, grandparent conflicts.
        grandparent = Counter.objects.create(pk=5, value=1)
        with self.assertRaises(IntegrityError), transaction.atomic():
            DiamondSubSubCounter(pk=grandparent.pk, value=1).save(force_insert=(models.Model,))
