"""Django's ``tests/delete/tests.py`` on models with ``LockVersionMixin``: every ``on_delete``, cascades
through multi-table inheritance, m2m and generic relations, signals, and the statements a delete runs.

QuerySet.delete() bypasses the check (as in Django); its tests are ported only where an instance's
delete runs in the same test. Run outside a transaction where Django counts statements (see
:class:`.support.OutsideTransaction`).
"""

from __future__ import annotations

from math import ceil
from typing import Any

import django
import pytest
from django.db import connection, models
from django.db.models import ProtectedError, RestrictedError
from django.db.models.deletion import Collector
from django.db.models.sql.constants import GET_ITERATOR_CHUNK_SIZE
from django.test import skipIfDBFeature, skipUnlessDBFeature

from safeupdates.exceptions import StaleObjectError

from .models import (
    B1,
    B2,
    B3,
    MR,
    A,
    Avatar,
    B,
    DelBase,
    DelChild,
    DeleteBottom,
    DeleteTop,
    DelParent,
    GenericB1,
    GenericB2,
    GenericDeleteBottom,
    HiddenUser,
    HiddenUserProfile,
    M,
    M2MFrom,
    M2MTo,
    MRNull,
    Origin,
    P,
    R,
    RChild,
    RChildChild,
    Referrer,
    RProxy,
    S,
    T,
    User,
    create_a,
    get_default_r,
)
from .support import OutsideTransaction, difference, stale_delete


class OnDeleteTests(OutsideTransaction):
    def setUp(self) -> None:
        self.DEFAULT = get_default_r()

    def test_auto(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_auto"""
        a = create_a("auto")
        a.auto.delete()
        self.assertFalse(A.objects.filter(name="auto").exists())

    def test_auto_nullable(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_auto_nullable"""
        a = create_a("auto_nullable")
        a.auto_nullable.delete()  # type: ignore[union-attr]
        self.assertFalse(A.objects.filter(name="auto_nullable").exists())

    def test_setvalue(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_setvalue"""
        a = create_a("setvalue")
        a.setvalue.delete()
        a = A.objects.get(pk=a.pk)
        self.assertEqual(self.DEFAULT, a.setvalue.pk)

    def test_setnull(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_setnull"""
        a = create_a("setnull")
        a.setnull.delete()  # type: ignore[union-attr]
        a = A.objects.get(pk=a.pk)
        self.assertIsNone(a.setnull)

    def test_setdefault(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_setdefault"""
        a = create_a("setdefault")
        a.setdefault.delete()
        a = A.objects.get(pk=a.pk)
        self.assertEqual(self.DEFAULT, a.setdefault.pk)

    def test_setdefault_none(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_setdefault_none"""
        a = create_a("setdefault_none")
        a.setdefault_none.delete()  # type: ignore[union-attr]
        a = A.objects.get(pk=a.pk)
        self.assertIsNone(a.setdefault_none)

    def test_cascade(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_cascade"""
        a = create_a("cascade")
        a.cascade.delete()
        self.assertFalse(A.objects.filter(name="cascade").exists())

    def test_cascade_nullable(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_cascade_nullable"""
        a = create_a("cascade_nullable")
        a.cascade_nullable.delete()  # type: ignore[union-attr]
        self.assertFalse(A.objects.filter(name="cascade_nullable").exists())

    def test_protect(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_protect"""
        a = create_a("protect")
        msg = (
            "Cannot delete some instances of model 'R' because they are referenced through protected foreign "
            "keys: 'A.protect'."
        )
        with self.assertRaisesMessage(ProtectedError, msg) as cm:
            a.protect.delete()  # type: ignore[union-attr]
        self.assertEqual(cm.exception.protected_objects, {a})

    def test_protect_multiple(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_protect_multiple"""
        a = create_a("protect")
        b = B.objects.create(protect=a.protect)
        msg = (
            "Cannot delete some instances of model 'R' because they are referenced through protected foreign "
            "keys: 'A.protect', 'B.protect'."
        )
        with self.assertRaisesMessage(ProtectedError, msg) as cm:
            a.protect.delete()  # type: ignore[union-attr]
        self.assertEqual(cm.exception.protected_objects, {a, b})

    def test_protect_path(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_protect_path"""
        a = create_a("protect")
        a.protect.p = P.objects.create()  # type: ignore[union-attr]
        a.protect.save()  # type: ignore[union-attr]
        msg = (
            "Cannot delete some instances of model 'P' because they are referenced through protected foreign "
            "keys: 'R.p'."
        )
        with self.assertRaisesMessage(ProtectedError, msg) as cm:
            a.protect.p.delete()  # type: ignore[union-attr]
        self.assertEqual(cm.exception.protected_objects, {a})

    def test_do_nothing(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_do_nothing"""
        # DO_NOTHING would raise IntegrityError for a normal model, so we connect to pre_delete and set
        # the fk to a known value.
        replacement_r = R.objects.create()

        def check_do_nothing(sender: Any, **kwargs: Any) -> None:
            obj = kwargs["instance"]
            obj.donothing_set.update(donothing=replacement_r)

        models.signals.pre_delete.connect(check_do_nothing)
        self.addCleanup(models.signals.pre_delete.disconnect, check_do_nothing)
        a = create_a("do_nothing")
        a.donothing.delete()  # type: ignore[union-attr]
        a = A.objects.get(pk=a.pk)
        self.assertEqual(replacement_r, a.donothing)

    def test_do_nothing_qscount(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_do_nothing_qscount"""
        # A models.DO_NOTHING relation doesn't trigger a query.
        b = DelBase.objects.create()
        with self.assertNumQueries(1):
            # RelToBase should not be queried.
            b.delete()
        self.assertEqual(DelBase.objects.count(), 0)

    def test_inheritance_cascade_up(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_inheritance_cascade_up"""
        child = RChild.objects.create()
        child.delete()
        self.assertFalse(R.objects.filter(pk=child.pk).exists())

    def test_inheritance_cascade_down(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_inheritance_cascade_down"""
        child = RChild.objects.create()
        parent = child.r_ptr
        parent.delete()
        self.assertFalse(RChild.objects.filter(pk=child.pk).exists())

    def test_cascade_from_child(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_cascade_from_child"""
        a = create_a("child")
        a.child.delete()
        self.assertFalse(A.objects.filter(name="child").exists())
        self.assertFalse(R.objects.filter(pk=a.child_id).exists())

    def test_cascade_from_parent(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_cascade_from_parent"""
        a = create_a("child")
        R.objects.get(pk=a.child_id).delete()
        self.assertFalse(A.objects.filter(name="child").exists())
        self.assertFalse(RChild.objects.filter(pk=a.child_id).exists())

    def test_setnull_from_child(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_setnull_from_child"""
        a = create_a("child_setnull")
        a.child_setnull.delete()  # type: ignore[union-attr]
        self.assertFalse(R.objects.filter(pk=a.child_setnull_id).exists())
        a = A.objects.get(pk=a.pk)
        self.assertIsNone(a.child_setnull)

    def test_setnull_from_parent(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_setnull_from_parent"""
        a = create_a("child_setnull")
        R.objects.get(pk=a.child_setnull_id).delete()
        self.assertFalse(RChild.objects.filter(pk=a.child_setnull_id).exists())
        a = A.objects.get(pk=a.pk)
        self.assertIsNone(a.child_setnull)

    def test_o2o_setnull(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_o2o_setnull"""
        a = create_a("o2o_setnull")
        a.o2o_setnull.delete()  # type: ignore[union-attr]
        a = A.objects.get(pk=a.pk)
        self.assertIsNone(a.o2o_setnull)

    def test_restrict(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_restrict"""
        a = create_a("restrict")
        msg = (
            "Cannot delete some instances of model 'R' because they are referenced through restricted foreign "
            "keys: 'A.restrict'."
        )
        with self.assertRaisesMessage(RestrictedError, msg) as cm:
            a.restrict.delete()  # type: ignore[union-attr]
        self.assertEqual(cm.exception.restricted_objects, {a})

    def test_restrict_multiple(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_restrict_multiple"""
        a = create_a("restrict")
        b3 = B3.objects.create(restrict=a.restrict)
        msg = (
            "Cannot delete some instances of model 'R' because they are referenced through restricted foreign "
            "keys: 'A.restrict', 'B3.restrict'."
        )
        with self.assertRaisesMessage(RestrictedError, msg) as cm:
            a.restrict.delete()  # type: ignore[union-attr]
        self.assertEqual(cm.exception.restricted_objects, {a, b3})

    @difference
    def test_restrict_path_cascade_indirect(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_restrict_path_cascade_indirect

        Difference: Django deletes ``a.restrict.p`` again from the instance whose first delete was
        refused; that instance was loaded before ``a.cascade.save()`` changed nothing of it, so it is
        not stale and is deleted as in Django. Its copy loaded before a change of its row is refused."""
        a = create_a("restrict")
        a.restrict.p = P.objects.create()  # type: ignore[union-attr]
        a.restrict.save()  # type: ignore[union-attr]
        msg = (
            "Cannot delete some instances of model 'P' because they are referenced through restricted foreign "
            "keys: 'A.restrict'."
        )
        with self.assertRaisesMessage(RestrictedError, msg) as cm:
            a.restrict.p.delete()  # type: ignore[union-attr]
        self.assertEqual(cm.exception.restricted_objects, {a})
        # Object referenced also with CASCADE relationship can be deleted.
        a.cascade.p = a.restrict.p  # type: ignore[union-attr]
        a.cascade.save()
        stale = P.objects.get(pk=a.restrict.p.pk)  # type: ignore[union-attr]
        P.objects.get(pk=stale.pk).save()
        with self.assertRaises(StaleObjectError):
            stale.delete()
        a.restrict.p.refresh_from_db()  # type: ignore[union-attr]
        a.restrict.p.delete()  # type: ignore[union-attr]
        self.assertFalse(A.objects.filter(name="restrict").exists())
        self.assertFalse(R.objects.filter(pk=a.restrict_id).exists())

    def test_restrict_path_cascade_direct(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_restrict_path_cascade_direct"""
        a = create_a("restrict")
        a.restrict.p = P.objects.create()  # type: ignore[union-attr]
        a.restrict.save()  # type: ignore[union-attr]
        a.cascade_p = a.restrict.p  # type: ignore[union-attr]
        a.save()
        a.restrict.p.delete()  # type: ignore[union-attr]
        self.assertFalse(A.objects.filter(name="restrict").exists())
        self.assertFalse(R.objects.filter(pk=a.restrict_id).exists())

    def test_restrict_path_cascade_indirect_diamond(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_restrict_path_cascade_indirect_diamond"""
        delete_top = DeleteTop.objects.create()
        b1 = B1.objects.create(delete_top=delete_top)
        b2 = B2.objects.create(delete_top=delete_top)
        delete_bottom = DeleteBottom.objects.create(b1=b1, b2=b2)
        msg = (
            "Cannot delete some instances of model 'B1' because they are referenced through restricted foreign "
            "keys: 'DeleteBottom.b1'."
        )
        with self.assertRaisesMessage(RestrictedError, msg) as cm:
            b1.delete()
        self.assertEqual(cm.exception.restricted_objects, {delete_bottom})
        self.assertTrue(DeleteTop.objects.exists())
        self.assertTrue(B1.objects.exists())
        self.assertTrue(B2.objects.exists())
        self.assertTrue(DeleteBottom.objects.exists())
        # Object referenced also with CASCADE relationship can be deleted.
        delete_top.delete()
        self.assertFalse(DeleteTop.objects.exists())
        self.assertFalse(B1.objects.exists())
        self.assertFalse(B2.objects.exists())
        self.assertFalse(DeleteBottom.objects.exists())

    def test_restrict_gfk_no_fast_delete(self) -> None:
        """Django: tests/delete/tests.py::OnDeleteTests::test_restrict_gfk_no_fast_delete"""
        delete_top = DeleteTop.objects.create()
        generic_b1 = GenericB1.objects.create(generic_delete_top=delete_top)
        generic_b2 = GenericB2.objects.create(generic_delete_top=delete_top)
        generic_delete_bottom = GenericDeleteBottom.objects.create(generic_b1=generic_b1, generic_b2=generic_b2)
        msg = (
            "Cannot delete some instances of model 'GenericB1' because they are referenced through restricted "
            "foreign keys: 'GenericDeleteBottom.generic_b1'."
        )
        with self.assertRaisesMessage(RestrictedError, msg) as cm:
            generic_b1.delete()
        self.assertEqual(cm.exception.restricted_objects, {generic_delete_bottom})
        self.assertTrue(DeleteTop.objects.exists())
        self.assertTrue(GenericB1.objects.exists())
        self.assertTrue(GenericB2.objects.exists())
        self.assertTrue(GenericDeleteBottom.objects.exists())
        # Object referenced also with CASCADE relationship can be deleted.
        delete_top.delete()
        self.assertFalse(DeleteTop.objects.exists())
        self.assertFalse(GenericB1.objects.exists())
        self.assertFalse(GenericB2.objects.exists())
        self.assertFalse(GenericDeleteBottom.objects.exists())


class DeletionTests(OutsideTransaction):
    def test_pk_none(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_pk_none"""
        m = M()
        msg = "M object can't be deleted because its id attribute is set to None."
        with self.assertRaisesMessage(ValueError, msg):
            m.delete()

    def test_m2m(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_m2m"""
        m = M.objects.create()
        r = R.objects.create()
        MR.objects.create(m=m, r=r)
        r.delete()
        self.assertFalse(MR.objects.exists())

        r = R.objects.create()
        MR.objects.create(m=m, r=r)
        m.delete()
        self.assertFalse(MR.objects.exists())

        m = M.objects.create()
        r = R.objects.create()
        m.m2m.add(r)
        r.delete()
        through = M._meta.get_field("m2m").remote_field.through  # type: ignore[union-attr]
        self.assertFalse(through.objects.exists())

        r = R.objects.create()
        m.m2m.add(r)
        m.delete()
        self.assertFalse(through.objects.exists())

        m = M.objects.create()
        r = R.objects.create()
        MRNull.objects.create(m=m, r=r)
        r.delete()
        self.assertFalse(not MRNull.objects.exists())
        self.assertFalse(m.m2m_through_null.exists())

    def test_bulk(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_bulk"""
        s = S.objects.create(r=R.objects.create())
        for _ in range(2 * GET_ITERATOR_CHUNK_SIZE):
            T.objects.create(s=s)
        #   1 (select related `T` instances)
        # + 1 (select related `U` instances)
        # + 2 (delete `T` instances in batches)
        # + 1 (delete `s`)
        self.assertNumQueries(5, s.delete)
        self.assertFalse(S.objects.exists())

    def test_instance_update(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_instance_update"""
        deleted = []
        related_setnull_sets = []

        def pre_delete(sender: Any, **kwargs: Any) -> None:
            obj = kwargs["instance"]
            deleted.append(obj)
            if isinstance(obj, R):
                related_setnull_sets.append([a.pk for a in obj.setnull_set.all()])  # type: ignore[attr-defined]

        models.signals.pre_delete.connect(pre_delete)
        self.addCleanup(models.signals.pre_delete.disconnect, pre_delete)
        a = create_a("update_setnull")
        a.setnull.delete()  # type: ignore[union-attr]
        a = create_a("update_cascade")
        a.cascade.delete()
        for obj in deleted:
            self.assertIsNone(obj.pk)
        for pk_list in related_setnull_sets:
            for a in A.objects.filter(id__in=pk_list):
                self.assertIsNone(a.setnull)

    @difference
    def test_deletion_order(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_deletion_order

        Difference: creating the child RChild(r_ptr=r) writes r's row (checked against r's version), so
        r, loaded before that write, is stale: its delete is refused before any receiver runs. Reloaded,
        it deletes in Django's order."""
        pre_delete_order = []
        post_delete_order = []

        def log_post_delete(sender: Any, **kwargs: Any) -> None:
            pre_delete_order.append((sender, kwargs["instance"].pk))

        def log_pre_delete(sender: Any, **kwargs: Any) -> None:
            post_delete_order.append((sender, kwargs["instance"].pk))

        models.signals.post_delete.connect(log_post_delete)
        models.signals.pre_delete.connect(log_pre_delete)
        self.addCleanup(models.signals.post_delete.disconnect, log_post_delete)
        self.addCleanup(models.signals.pre_delete.disconnect, log_pre_delete)
        r = R.objects.create()
        s1 = S.objects.create(r=r)
        s2 = S.objects.create(r=r)
        t1 = T.objects.create(s=s1)
        t2 = T.objects.create(s=s2)
        rchild = RChild.objects.create(r_ptr=r)
        r_pk = r.pk
        with self.assertRaisesMessage(StaleObjectError, stale_delete(R, r_pk, r.lock_version)):
            r.delete()
        self.assertEqual((pre_delete_order, post_delete_order), ([], []))
        r.refresh_from_db()
        r.delete()
        self.assertEqual(
            pre_delete_order,
            [(T, t2.pk), (T, t1.pk), (RChild, rchild.pk), (S, s2.pk), (S, s1.pk), (R, r_pk)],
        )
        self.assertEqual(
            post_delete_order,
            [(T, t1.pk), (T, t2.pk), (RChild, rchild.pk), (S, s1.pk), (S, s2.pk), (R, r_pk)],
        )

    def test_relational_post_delete_signals_happen_before_parent_object(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_relational_post_delete_signals_happen_before_parent_object"""  # noqa: E501
        deletions = []

        def log_post_delete(instance: Any, **kwargs: Any) -> None:
            self.assertTrue(R.objects.filter(pk=instance.r_id))
            self.assertIs(type(instance), S)
            deletions.append(instance.id)

        r = R.objects.create()
        s = S.objects.create(r=r)
        s_id = s.pk
        models.signals.post_delete.connect(log_post_delete, sender=S)
        try:
            r.delete()
        finally:
            models.signals.post_delete.disconnect(log_post_delete)
        self.assertEqual(len(deletions), 1)
        self.assertEqual(deletions[0], s_id)

    @skipUnlessDBFeature("can_defer_constraint_checks")
    def test_can_defer_constraint_checks(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_can_defer_constraint_checks"""
        u = User.objects.create(avatar=Avatar.objects.create())
        a = Avatar.objects.get(pk=u.avatar_id)
        # 1 query to find the users for the avatar, 1 to delete the user, 1 to delete the avatar. When
        # we can defer constraint checks there is no need to do an UPDATE on User.avatar to null it out.
        calls = []

        def noop(*args: Any, **kwargs: Any) -> None:
            calls.append("")

        # Attach a signal to make sure we will not do fast_deletes.
        models.signals.post_delete.connect(noop, sender=User)
        self.addCleanup(models.signals.post_delete.disconnect, noop, sender=User)
        self.assertNumQueries(3, a.delete)
        self.assertFalse(User.objects.exists())
        self.assertFalse(Avatar.objects.exists())
        self.assertEqual(len(calls), 1)

    @skipIfDBFeature("can_defer_constraint_checks")
    def test_cannot_defer_constraint_checks(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_cannot_defer_constraint_checks"""
        u = User.objects.create(avatar=Avatar.objects.create())
        calls = []

        def noop(*args: Any, **kwargs: Any) -> None:
            calls.append("")

        # Attach a signal to make sure we will not do fast_deletes.
        models.signals.post_delete.connect(noop, sender=User)
        self.addCleanup(models.signals.post_delete.disconnect, noop, sender=User)
        a = Avatar.objects.get(pk=u.avatar_id)
        # 1 query to find the users for the avatar, 1 to delete the user, 1 to null out user.avatar
        # since we can't defer the constraint, 1 to delete the avatar.
        self.assertNumQueries(4, a.delete)
        self.assertFalse(User.objects.exists())
        self.assertFalse(Avatar.objects.exists())
        self.assertEqual(len(calls), 1)

    def test_hidden_related(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_hidden_related"""
        r = R.objects.create()
        h = HiddenUser.objects.create(r=r)
        HiddenUserProfile.objects.create(user=h)
        r.delete()
        self.assertEqual(HiddenUserProfile.objects.count(), 0)

    def test_large_delete_related(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_large_delete_related"""
        test_size = 2000
        s = S.objects.create(r=R.objects.create())
        T.objects.bulk_create(T(s=s) for _ in range(test_size))  # Django creates them one by one
        batch_size = max(connection.ops.bulk_batch_size(["pk"], range(test_size)), 1)  # type: ignore[arg-type]
        # TEST_SIZE / batch_size (select related `T` instances)
        # + 1 (select related `U` instances)
        # + TEST_SIZE / GET_ITERATOR_CHUNK_SIZE (delete `T` matches in batches)
        # + 1 (delete `s`)
        expected_num_queries = ceil(test_size / batch_size)
        expected_num_queries += ceil(test_size / GET_ITERATOR_CHUNK_SIZE) + 2
        self.assertNumQueries(expected_num_queries, s.delete)
        self.assertFalse(S.objects.exists())
        self.assertFalse(T.objects.exists())

    def test_delete_with_keeping_parents(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_delete_with_keeping_parents"""
        child = RChild.objects.create()
        parent_id = child.r_ptr_id
        child.delete(keep_parents=True)
        self.assertFalse(RChild.objects.filter(id=child.id).exists())
        self.assertTrue(R.objects.filter(id=parent_id).exists())

    def test_delete_with_keeping_parents_relationships(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_delete_with_keeping_parents_relationships"""
        child = RChild.objects.create()
        parent_id = child.r_ptr_id
        parent_referent_id = S.objects.create(r=child.r_ptr).pk
        child.delete(keep_parents=True)
        self.assertFalse(RChild.objects.filter(id=child.id).exists())
        self.assertTrue(R.objects.filter(id=parent_id).exists())
        self.assertTrue(S.objects.filter(pk=parent_referent_id).exists())

        childchild = RChildChild.objects.create()
        parent_id = childchild.rchild_ptr.r_ptr_id
        child_id = childchild.rchild_ptr_id
        parent_referent_id = S.objects.create(r=childchild.rchild_ptr.r_ptr).pk
        childchild.delete(keep_parents=True)
        self.assertFalse(RChildChild.objects.filter(id=childchild.id).exists())
        self.assertTrue(RChild.objects.filter(id=child_id).exists())
        self.assertTrue(R.objects.filter(id=parent_id).exists())
        self.assertTrue(S.objects.filter(pk=parent_referent_id).exists())

    def test_model_delete_returns_num_rows(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_model_delete_returns_num_rows"""
        r = R.objects.create()
        h1 = HiddenUser.objects.create(r=r)
        h2 = HiddenUser.objects.create(r=r)
        HiddenUser.objects.create(r=r)
        HiddenUserProfile.objects.create(user=h1)
        HiddenUserProfile.objects.create(user=h2)
        m1 = M.objects.create()
        m2 = M.objects.create()
        MR.objects.create(r=r, m=m1)
        r.m_set.add(m1)  # type: ignore[attr-defined]
        r.m_set.add(m2)  # type: ignore[attr-defined]
        r.save()
        existed_objs = {
            R._meta.label: R.objects.count(),
            HiddenUser._meta.label: HiddenUser.objects.count(),
            MR._meta.label: MR.objects.count(),
            HiddenUserProfile._meta.label: HiddenUserProfile.objects.count(),
            M.m2m.through._meta.label: M.m2m.through.objects.count(),
        }
        deleted, deleted_objs = r.delete()
        self.assertEqual(deleted, sum(existed_objs.values()))
        self.assertCountEqual(deleted_objs.keys(), existed_objs.keys())
        for k, v in existed_objs.items():
            self.assertEqual(deleted_objs[k], v)

    def test_proxied_model_duplicate_queries(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_proxied_model_duplicate_queries"""
        # #25685 - Deleting instances of a model with existing proxy classes should not issue multiple
        # queries during cascade deletion of referring models.
        avatar = Avatar.objects.create()
        # One query for the Avatar table and a second for the User one.
        with self.assertNumQueries(2):
            avatar.delete()

    def test_only_referenced_fields_selected(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_only_referenced_fields_selected"""
        # Only referenced fields are selected during cascade deletion SELECT unless deletion signals
        # are connected.
        origin = Origin.objects.create()
        expected_sql = str(Referrer.objects.only("id", "unique_field").filter(origin__in=[origin]).query)
        with self.assertNumQueries(2) as ctx:
            origin.delete()
        self.assertEqual(ctx.captured_queries[0]["sql"], expected_sql)

        def receiver(instance: Any, **kwargs: Any) -> None:
            pass

        # All fields are selected if deletion signals are connected.
        for signal_name in ("pre_delete", "post_delete"):
            with self.subTest(signal=signal_name):
                origin = Origin.objects.create()
                signal = getattr(models.signals, signal_name)
                signal.connect(receiver, sender=Referrer)
                with self.assertNumQueries(2) as ctx:
                    origin.delete()
                self.assertIn(connection.ops.quote_name("large_field"), ctx.captured_queries[0]["sql"])
                signal.disconnect(receiver, sender=Referrer)

    @pytest.mark.skipif(django.VERSION < (6, 0), reason="Django 6.0+ (fixed in Django 6.0; 5.2 fails it too)")
    def test_keep_parents_does_not_delete_proxy_related(self) -> None:
        """Django: tests/delete/tests.py::DeletionTests::test_keep_parents_does_not_delete_proxy_related (6.0+)"""
        r_child = RChild.objects.create()
        r_proxy = RProxy.objects.get(pk=r_child.pk)
        Origin.objects.create(r_proxy=r_proxy)
        self.assertEqual(Origin.objects.count(), 1)
        r_child.delete(keep_parents=True)
        self.assertEqual(Origin.objects.count(), 1)


class FastDeleteTests(OutsideTransaction):
    def test_fast_delete_fk(self) -> None:
        """Django: tests/delete/tests.py::FastDeleteTests::test_fast_delete_fk"""
        u = User.objects.create(avatar=Avatar.objects.create())
        a = Avatar.objects.get(pk=u.avatar_id)
        # 1 query to fast-delete the user, 1 query to delete the avatar
        self.assertNumQueries(2, a.delete)
        self.assertFalse(User.objects.exists())
        self.assertFalse(Avatar.objects.exists())

    def test_fast_delete_m2m(self) -> None:
        """Django: tests/delete/tests.py::FastDeleteTests::test_fast_delete_m2m"""
        t = M2MTo.objects.create()
        f = M2MFrom.objects.create()
        f.m2m.add(t)
        # 1 to delete f, 1 to fast-delete m2m for f
        self.assertNumQueries(2, f.delete)

    def test_fast_delete_revm2m(self) -> None:
        """Django: tests/delete/tests.py::FastDeleteTests::test_fast_delete_revm2m"""
        t = M2MTo.objects.create()
        f = M2MFrom.objects.create()
        f.m2m.add(t)
        # 1 to delete t, 1 to fast-delete t's m_set
        self.assertNumQueries(2, f.delete)

    def test_fast_delete_instance_set_pk_none(self) -> None:
        """Django: tests/delete/tests.py::FastDeleteTests::test_fast_delete_instance_set_pk_none"""
        u = User.objects.create()
        # User can be fast-deleted.
        collector = Collector(using="default")
        self.assertTrue(collector.can_fast_delete(u))
        u.delete()
        self.assertIsNone(u.pk)

    def test_fast_delete_inheritance(self) -> None:
        """Django: tests/delete/tests.py::FastDeleteTests::test_fast_delete_inheritance"""
        c = DelChild.objects.create()
        p = DelParent.objects.create()
        # 1 for self, 1 for parent
        self.assertNumQueries(2, c.delete)
        self.assertFalse(DelChild.objects.exists())
        self.assertEqual(DelParent.objects.count(), 1)
        self.assertEqual(DelParent.objects.filter(pk=p.pk).count(), 1)
        # 1 for self delete, 1 for fast delete of empty "child" qs.
        self.assertNumQueries(2, p.delete)
        self.assertFalse(DelParent.objects.exists())
        # 1 for self delete, 1 for fast delete of empty "child" qs.
        c = DelChild.objects.create()
        p = c.delparent_ptr
        self.assertNumQueries(2, p.delete)
        self.assertFalse(DelParent.objects.exists())
        self.assertFalse(DelChild.objects.exists())

    def test_fast_delete_large_batch(self) -> None:
        """Django: tests/delete/tests.py::FastDeleteTests::test_fast_delete_large_batch"""
        User.objects.bulk_create(User() for _ in range(2000))
        # No problems here - we aren't going to cascade, so we will fast delete the objects in a
        # single query.
        self.assertNumQueries(1, User.objects.all().delete)
        a = Avatar.objects.create(desc="a")
        User.objects.bulk_create(User(avatar=a) for _ in range(2000))
        # We don't hit parameter amount limits for a, so just one query for that + fast delete of the
        # related objs.
        self.assertNumQueries(2, a.delete)
        self.assertEqual(User.objects.count(), 0)

    def test_fast_delete_combined_relationships(self) -> None:
        """Django: tests/delete/tests.py::FastDeleteTests::test_fast_delete_combined_relationships"""
        # The cascading fast-delete of SecondReferrer should be combined in a single DELETE WHERE
        # referrer_id OR unique_field.
        origin = Origin.objects.create()
        referer = Referrer.objects.create(origin=origin, unique_field=42)
        with self.assertNumQueries(2):
            referer.delete()
