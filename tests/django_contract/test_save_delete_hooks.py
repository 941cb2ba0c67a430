"""Django's ``tests/save_delete_hooks/tests.py`` on a model with ``LockVersionMixin``: a custom save()
and delete() that call the mixin's."""

from __future__ import annotations

from django.test import TestCase

from .models import HookPerson


class SaveDeleteHookTests(TestCase):
    def test_basic(self) -> None:
        """Django: tests/save_delete_hooks/tests.py::SaveDeleteHookTests::test_basic"""
        p = HookPerson(first_name="John", last_name="Smith")
        self.assertEqual(p.data, [])
        p.save()
        self.assertEqual(p.data, ["Before save", "After save"])
        self.assertQuerySetEqual(HookPerson.objects.all(), ["John Smith"], str)
        p.delete()
        self.assertEqual(p.data, ["Before save", "After save", "Before deletion", "After deletion"])
        self.assertQuerySetEqual(HookPerson.objects.all(), [])
