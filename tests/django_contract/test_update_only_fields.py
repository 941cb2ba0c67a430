"""Django's ``tests/update_only_fields/tests.py`` on models with ``LockVersionMixin``.

Run outside a transaction where Django counts statements (see :class:`.support.OutsideTransaction`).
"""

from __future__ import annotations

from typing import Any

import django
import pytest
from django.db import connection, transaction
from django.db.models import F
from django.db.models.signals import post_save, pre_save

from safeupdates.exceptions import InvalidUpdate, StaleObjectError

from .models import Account, Employee, Person, Profile, ProxyEmployee
from .support import OutsideTransaction, difference, on_sqlite_version_source

DJANGO_6 = django.VERSION >= (6, 0)
REFUSED = "was loaded without lock_version (.only()/.defer()), so its save cannot be checked"


class UpdateOnlyFieldsTests(OutsideTransaction):
    msg = (
        "The following fields do not exist in this model, are m2m fields, primary keys, or are non-concrete fields: %s"
    )

    def test_update_fields_basic(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_basic"""
        s = Person.objects.create(name="Sara", gender="F")
        self.assertEqual(s.gender, "F")
        s.gender = "M"
        s.name = "Ian"
        s.save(update_fields=["name"])
        s = Person.objects.get(pk=s.pk)
        self.assertEqual(s.gender, "F")
        self.assertEqual(s.name, "Ian")

    @difference
    @on_sqlite_version_source
    def test_update_fields_deferred(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_deferred

        Difference: deferring lock_version is refused; Django's test runs with lock_version loaded."""
        s = Person.objects.create(name="Sara", gender="F", pid=22)
        self.assertEqual(s.gender, "F")
        with self.assertRaisesMessage(InvalidUpdate, REFUSED):
            Person.objects.defer("gender", "pid", "lock_version").get(pk=s.pk).save()
        s1 = Person.objects.defer("gender", "pid").get(pk=s.pk)
        s1.name = "Emily"
        s1.gender = "M"
        with self.assertNumQueries(1, sqlite_versions=1):
            s1.save()
        s2 = Person.objects.get(pk=s1.pk)
        self.assertEqual(s2.name, "Emily")
        self.assertEqual(s2.gender, "M")

    @difference
    @on_sqlite_version_source
    def test_update_fields_only_1(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_only_1

        Difference: .only() without lock_version is refused; Django's test runs with it loaded."""
        s = Person.objects.create(name="Sara", gender="F")
        self.assertEqual(s.gender, "F")
        with self.assertRaisesMessage(InvalidUpdate, REFUSED):
            Person.objects.only("name").get(pk=s.pk).save()
        s1 = Person.objects.only("name", "lock_version").get(pk=s.pk)
        s1.name = "Emily"
        s1.gender = "M"
        with self.assertNumQueries(1, sqlite_versions=1):
            s1.save()
        s2 = Person.objects.get(pk=s1.pk)
        self.assertEqual(s2.name, "Emily")
        self.assertEqual(s2.gender, "M")

    @difference
    @on_sqlite_version_source
    def test_update_fields_only_2(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_only_2

        Difference: .only() without lock_version is refused; Django's test runs with it loaded."""
        s = Person.objects.create(name="Sara", gender="F", pid=22)
        self.assertEqual(s.gender, "F")
        with self.assertRaisesMessage(InvalidUpdate, REFUSED):
            Person.objects.only("name").get(pk=s.pk).save(update_fields=["pid"])
        s1 = Person.objects.only("name", "lock_version").get(pk=s.pk)
        s1.name = "Emily"
        s1.gender = "M"
        with self.assertNumQueries(2, sqlite_versions=1):
            s1.save(update_fields=["pid"])
        s2 = Person.objects.get(pk=s1.pk)
        self.assertEqual(s2.name, "Sara")
        self.assertEqual(s2.gender, "F")

    @difference
    @on_sqlite_version_source
    def test_update_fields_only_repeated(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_only_repeated

        Difference: .only() without lock_version is refused; Django's test runs with it loaded."""
        s = Person.objects.create(name="Sara", gender="F")
        self.assertEqual(s.gender, "F")
        with self.assertRaisesMessage(InvalidUpdate, REFUSED):
            Person.objects.only("name").get(pk=s.pk).save()
        s1 = Person.objects.only("name", "lock_version").get(pk=s.pk)
        s1.gender = "M"
        with self.assertNumQueries(1, sqlite_versions=1):
            s1.save()
        # save() should not fetch deferred fields
        s1 = Person.objects.only("name", "lock_version").get(pk=s.pk)
        with self.assertNumQueries(1, sqlite_versions=1):
            s1.save()

    @difference
    @on_sqlite_version_source
    def test_update_fields_inheritance_defer(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_inheritance_defer

        Difference: .only() without lock_version is refused; Django's test runs with it loaded."""
        profile_boss = Profile.objects.create(name="Boss", salary=3000)
        e1 = Employee.objects.create(name="Sara", gender="F", employee_num=1, profile=profile_boss)
        with self.assertRaisesMessage(InvalidUpdate, REFUSED):
            Employee.objects.only("name").get(pk=e1.pk).save()
        e1 = Employee.objects.only("name", "lock_version").get(pk=e1.pk)
        e1.name = "Linda"
        with self.assertNumQueries(1, sqlite_versions=1):
            e1.save()
        self.assertEqual(Employee.objects.get(pk=e1.pk).name, "Linda")

    @difference
    @on_sqlite_version_source
    def test_update_fields_fk_defer(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_fk_defer

        Difference: .only() without lock_version is refused; Django's test runs with it loaded."""
        profile_boss = Profile.objects.create(name="Boss", salary=3000)
        profile_receptionist = Profile.objects.create(name="Receptionist", salary=1000)
        e1 = Employee.objects.create(name="Sara", gender="F", employee_num=1, profile=profile_boss)
        with self.assertRaisesMessage(InvalidUpdate, REFUSED):
            Employee.objects.only("profile").get(pk=e1.pk).save()
        e1 = Employee.objects.only("profile", "lock_version").get(pk=e1.pk)
        e1.profile = profile_receptionist
        with self.assertNumQueries(1, sqlite_versions=1, sqlite_parents=1):
            e1.save()
        self.assertEqual(Employee.objects.get(pk=e1.pk).profile, profile_receptionist)
        e1.profile_id = profile_boss.pk
        with self.assertNumQueries(1, sqlite_versions=1, sqlite_parents=1):
            e1.save()
        self.assertEqual(Employee.objects.get(pk=e1.pk).profile, profile_boss)

    @difference
    @on_sqlite_version_source
    def test_select_related_only_interaction(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_select_related_only_interaction

        Difference: the related instance, loaded without lock_version, is refused; with lock_version
        loaded, it was loaded before profile_boss.save(), so it is stale (Django writes the old salary
        over the newer row)."""
        profile_boss = Profile.objects.create(name="Boss", salary=3000)
        e1 = Employee.objects.create(name="Sara", gender="F", employee_num=1, profile=profile_boss)
        e1 = Employee.objects.only("profile__salary").select_related("profile").get(pk=e1.pk)
        e2 = Employee.objects.only("profile__salary", "profile__lock_version").select_related("profile").get(pk=e1.pk)
        profile_boss.name = "Clerk"
        profile_boss.salary = 1000
        profile_boss.save()
        with self.assertRaisesMessage(InvalidUpdate, REFUSED):
            e1.profile.save()
        with self.assertRaises(StaleObjectError):
            e2.profile.save()
        e2.profile.refresh_from_db(fields=["lock_version"])
        # The loaded salary of 3000 gets saved, the name of 'Clerk' isn't overwritten.
        with self.assertNumQueries(1, sqlite_versions=1):
            e2.profile.save()
        reloaded_profile = Profile.objects.get(pk=profile_boss.pk)
        self.assertEqual(reloaded_profile.name, profile_boss.name)
        self.assertEqual(reloaded_profile.salary, 3000)

    def test_update_fields_m2m(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_m2m"""
        profile_boss = Profile.objects.create(name="Boss", salary=3000)
        e1 = Employee.objects.create(name="Sara", gender="F", employee_num=1, profile=profile_boss)
        a1 = Account.objects.create(num=1)
        a2 = Account.objects.create(num=2)
        e1.accounts.set([a1, a2])
        with self.assertRaisesMessage(ValueError, self.msg % "accounts"):
            e1.save(update_fields=["accounts"])

    @on_sqlite_version_source
    def test_update_fields_inheritance(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_inheritance"""
        profile_boss = Profile.objects.create(name="Boss", salary=3000)
        profile_receptionist = Profile.objects.create(name="Receptionist", salary=1000)
        e1 = Employee.objects.create(name="Sara", gender="F", employee_num=1, profile=profile_boss)
        e1.name = "Ian"
        e1.gender = "M"
        e1.save(update_fields=["name"])
        e2 = Employee.objects.get(pk=e1.pk)
        self.assertEqual(e2.name, "Ian")
        self.assertEqual(e2.gender, "F")
        self.assertEqual(e2.profile, profile_boss)
        e2.profile = profile_receptionist
        e2.name = "Sara"
        e2.save(update_fields=["profile"])
        e3 = Employee.objects.get(pk=e1.pk)
        self.assertEqual(e3.name, "Ian")
        self.assertEqual(e3.profile, profile_receptionist)
        with self.assertNumQueries(1, sqlite_versions=1, sqlite_parents=1):
            e3.profile = profile_boss
            e3.save(update_fields=["profile_id"])
        e4 = Employee.objects.get(pk=e3.pk)
        self.assertEqual(e4.profile, profile_boss)
        self.assertEqual(e4.profile_id, profile_boss.pk)

    def test_update_fields_inheritance_with_proxy_model(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_inheritance_with_proxy_model"""  # noqa: E501
        profile_boss = Profile.objects.create(name="Boss", salary=3000)
        profile_receptionist = Profile.objects.create(name="Receptionist", salary=1000)
        e1 = ProxyEmployee.objects.create(name="Sara", gender="F", employee_num=1, profile=profile_boss)
        e1.name = "Ian"
        e1.gender = "M"
        e1.save(update_fields=["name"])
        e2 = ProxyEmployee.objects.get(pk=e1.pk)
        self.assertEqual(e2.name, "Ian")
        self.assertEqual(e2.gender, "F")
        self.assertEqual(e2.profile, profile_boss)
        e2.profile = profile_receptionist
        e2.name = "Sara"
        e2.save(update_fields=["profile"])
        e3 = ProxyEmployee.objects.get(pk=e1.pk)
        self.assertEqual(e3.name, "Ian")
        self.assertEqual(e3.profile, profile_receptionist)

    def test_update_fields_signals(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_signals"""
        p = Person.objects.create(name="Sara", gender="F")
        pre_save_data = []

        def pre_save_receiver(**kwargs: Any) -> None:
            pre_save_data.append(kwargs["update_fields"])

        pre_save.connect(pre_save_receiver)
        self.addCleanup(pre_save.disconnect, pre_save_receiver)
        post_save_data = []

        def post_save_receiver(**kwargs: Any) -> None:
            post_save_data.append(kwargs["update_fields"])

        post_save.connect(post_save_receiver)
        self.addCleanup(post_save.disconnect, post_save_receiver)
        p.save(update_fields=["name"])
        self.assertEqual(len(pre_save_data), 1)
        self.assertEqual(len(pre_save_data[0]), 1)
        self.assertIn("name", pre_save_data[0])
        self.assertEqual(len(post_save_data), 1)
        self.assertEqual(len(post_save_data[0]), 1)
        self.assertIn("name", post_save_data[0])

    def test_update_fields_incorrect_params(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_incorrect_params"""
        s = Person.objects.create(name="Sara", gender="F")
        with self.assertRaisesMessage(ValueError, self.msg % "first_name"):
            s.save(update_fields=["first_name"])
        # "name" is treated as an iterable so the output is something like "n, a, m, e" but the order
        # isn't deterministic.
        with self.assertRaisesMessage(ValueError, self.msg % ""):
            s.save(update_fields="name")

    def test_empty_update_fields(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_empty_update_fields"""
        s = Person.objects.create(name="Sara", gender="F")
        pre_save_data = []

        def pre_save_receiver(**kwargs: Any) -> None:
            pre_save_data.append(kwargs["update_fields"])

        pre_save.connect(pre_save_receiver)
        self.addCleanup(pre_save.disconnect, pre_save_receiver)
        post_save_data = []

        def post_save_receiver(**kwargs: Any) -> None:
            post_save_data.append(kwargs["update_fields"])

        post_save.connect(post_save_receiver)
        self.addCleanup(post_save.disconnect, post_save_receiver)
        # Save is skipped.
        with self.assertNumQueries(0):
            s.save(update_fields=[])
        # Signals were skipped, too...
        self.assertEqual(len(pre_save_data), 0)
        self.assertEqual(len(post_save_data), 0)

    @on_sqlite_version_source
    def test_num_queries_inheritance(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_num_queries_inheritance"""
        s = Employee.objects.create(name="Sara", gender="F")
        s.employee_num = 1
        s.name = "Emily"
        with self.assertNumQueries(1, sqlite_versions=1, sqlite_parents=1):
            s.save(update_fields=["employee_num"])
        s = Employee.objects.get(pk=s.pk)
        self.assertEqual(s.employee_num, 1)
        self.assertEqual(s.name, "Sara")
        s.employee_num = 2
        s.name = "Emily"
        with self.assertNumQueries(1, sqlite_versions=1):
            s.save(update_fields=["name"])
        s = Employee.objects.get(pk=s.pk)
        self.assertEqual(s.name, "Emily")
        self.assertEqual(s.employee_num, 1)
        # A little sanity check that we actually did updates...
        self.assertEqual(Employee.objects.count(), 1)
        self.assertEqual(Person.objects.count(), 1)
        with self.assertNumQueries(2, sqlite_versions=1):
            s.save(update_fields=["name", "employee_num"])

    def test_update_non_concrete_field(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_non_concrete_field"""
        profile_boss = Profile.objects.create(name="Boss", salary=3000)
        with self.assertRaisesMessage(ValueError, self.msg % "non_concrete"):
            profile_boss.save(update_fields=["non_concrete"])

    def test_update_pk_field(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_pk_field"""
        person_boss = Person.objects.create(name="Boss", gender="F")
        with self.assertRaisesMessage(ValueError, self.msg % "id"):
            person_boss.save(update_fields=["id"])

    def test_update_inherited_pk_field(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_inherited_pk_field"""
        employee_boss = Employee.objects.create(name="Boss", gender="F")
        with self.assertRaisesMessage(ValueError, self.msg % "id"):
            employee_boss.save(update_fields=["id"])

    @pytest.mark.skipif(not DJANGO_6, reason="Django 6.0+ (Model.NotUpdated)")
    @difference
    def test_update_fields_not_updated(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_not_updated (6.0+)

        Difference: the row was deleted after the instance was loaded: StaleObjectError, which is a
        DatabaseError too, instead of Django's NotUpdated."""
        obj = Person.objects.create(name="Sara", gender="F")
        Person.objects.filter(pk=obj.pk).delete()
        with self.assertRaisesMessage(StaleObjectError, "was deleted after it was loaded"), transaction.atomic():
            obj.save(update_fields=["name"])

    @pytest.mark.skipif(not DJANGO_6, reason="Django 6.0+ (expressions returned by UPDATE ... RETURNING)")
    def test_update_fields_expression(self) -> None:
        """Django: tests/update_only_fields/tests.py::UpdateOnlyFieldsTests::test_update_fields_expression (6.0+)"""
        obj = Person.objects.create(name="Valerie", gender="F", pid=42)
        updated_pid = F("pid") + 1
        obj.pid = updated_pid
        obj.save(update_fields={"gender"})
        self.assertIs(obj.pid, updated_pid)
        obj.save(update_fields={"pid"})
        expected_num_queries = 0 if connection.features.can_return_rows_from_update else 1
        with self.assertNumQueries(expected_num_queries):
            self.assertEqual(obj.pid, 43)
