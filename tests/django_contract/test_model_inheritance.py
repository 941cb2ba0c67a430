"""Django's ``tests/model_inheritance/tests.py`` on models with ``LockVersionMixin``: abstract bases,
multi-table inheritance (diamonds, common parents, explicit parent links), proxies.

Run outside a transaction where Django counts statements (see :class:`.support.OutsideTransaction`).
"""

from __future__ import annotations

from operator import attrgetter

import django
import pytest
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext

from .models import (
    Chef,
    CommonChild,
    CommonInfo,
    CustomSupplier,
    GrandChild,
    GrandParent,
    InhBase,
    ItalianRestaurant,
    ItalianRestaurantCommonParent,
    ParkingLot,
    Place,
    Restaurant,
    Student,
    SubBase,
    Supplier,
    Title,
    Worker,
)
from .support import TRANSACTION_CONTROL, OutsideTransaction, on_sqlite_version_source, takes_a_version


class ModelInheritanceTests(OutsideTransaction):
    def test_abstract(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceTests::test_abstract"""
        w1 = Worker.objects.create(name="Fred", age=35, job="Quarry worker")
        Worker.objects.create(name="Barney", age=34, job="Quarry worker")
        s = Student.objects.create(name="Pebbles", age=5, school_class="1B")
        self.assertEqual(str(w1), "Worker Fred")
        self.assertEqual(str(s), "Student Pebbles")
        # The children inherit the Meta class of their parents (if they don't specify their own).
        self.assertSequenceEqual(Worker.objects.values("name"), [{"name": "Barney"}, {"name": "Fred"}])
        # Since Student does not subclass CommonInfo's Meta, it has the effect of completely overriding
        # it. So ordering by name doesn't take place for Students.
        self.assertEqual(Student._meta.ordering, [])
        # However, the CommonInfo class cannot be used as a normal model (it doesn't exist as a model).
        with self.assertRaisesMessage(AttributeError, "'CommonInfo' has no attribute 'objects'"):
            CommonInfo.objects.all()  # type: ignore[misc]

    def test_custompk_m2m(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceTests::test_custompk_m2m"""
        b = InhBase.objects.create()
        b.titles.add(Title.objects.create(title="foof"))
        s = SubBase.objects.create(sub_id=b.id)
        b = InhBase.objects.get(pk=s.id)
        self.assertNotEqual(b.pk, s.pk)
        # Low-level test for related_val
        self.assertEqual(s.titles.related_val, (s.id,))  # type: ignore[attr-defined]
        # Higher level test for correct query values (title foof not accidentally found).
        self.assertSequenceEqual(s.titles.all(), [])

    @on_sqlite_version_source
    def test_create_diamond_mti_default_pk(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceTests::test_create_diamond_mti_default_pk"""
        # 1 INSERT for each base.
        with self.assertNumQueries(4, sqlite_versions=1):
            common_child = CommonChild.objects.create()
        # 3 SELECTs for the parents, 1 UPDATE for the child.
        with self.assertNumQueries(4, sqlite_versions=1):
            common_child.save()

    @on_sqlite_version_source
    def test_create_diamond_mti_common_parent(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceTests::test_create_diamond_mti_common_parent"""
        with self.assertNumQueries(4, sqlite_versions=1):
            italian_restaurant_child = ItalianRestaurantCommonParent.objects.create(
                name="Ristorante Miron", address="1234 W. Ash"
            )
        self.assertEqual(
            italian_restaurant_child.italianrestaurant_ptr.place_ptr, italian_restaurant_child.place_ptr_two
        )
        self.assertEqual(
            italian_restaurant_child.italianrestaurant_ptr.restaurant_ptr, italian_restaurant_child.restaurant_ptr
        )
        self.assertEqual(italian_restaurant_child.restaurant_ptr.place_ptr, italian_restaurant_child.place_ptr_two)
        self.assertEqual(italian_restaurant_child.name, "Ristorante Miron")
        self.assertEqual(italian_restaurant_child.address, "1234 W. Ash")

    def test_update_parent_filtering(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceTests::test_update_parent_filtering

        Django compares the save's UPDATE with a QuerySet.update(): the checked save's UPDATE is the
        app's own statement, so the port checks what Django's test protects (#10399): no UPDATE is
        constrained by an inner query on a table."""
        supplier = Supplier.objects.create(name="Central market", address="610 some street")
        with CaptureQueriesContext(connection) as captured_queries:
            supplier.save(update_fields=("name",))
        updates = [query["sql"] for query in captured_queries if "UPDATE" in query["sql"]]
        self.assertTrue(updates)
        for sql in updates:
            self.assertNotRegex(sql, r'IN \(SELECT [^)]*FROM "')

    @on_sqlite_version_source
    def test_create_child_no_update(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceTests::test_create_child_no_update"""

        def a() -> None:
            GrandChild.objects.create(email="grand_parent@example.com", first_name="grand", last_name="parent")

        def b() -> None:
            GrandChild().save()

        # Django runs both in subTest(); one after the other here, so that a failure fails the test
        # (pytest reports a failed subtest of an expected failure apart from it).
        for test in [a, b]:
            with self.assertNumQueries(4, sqlite_versions=1) as queries:
                test()
                for query in queries:
                    sql = query["sql"]
                    if sql not in TRANSACTION_CONTROL and not takes_a_version(sql):
                        self.assertIn("INSERT INTO", sql, f"{test.__name__}: {sql}")

    def test_create_copy_with_inherited_m2m(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceTests::test_create_copy_with_inherited_m2m"""
        restaurant = Restaurant.objects.create()
        supplier = CustomSupplier.objects.create(name="Central market", address="944 W. Fullerton")
        supplier.customers.set([restaurant])
        old_customers = supplier.customers.all()
        supplier.pk = None
        supplier.id = None
        supplier._state.adding = True
        supplier.save()
        supplier.customers.set(old_customers)
        supplier = Supplier.objects.get(pk=supplier.pk)
        self.assertCountEqual(supplier.customers.all(), old_customers)
        self.assertSequenceEqual(supplier.customers.all(), [restaurant])


class ModelInheritanceDataTests(TestCase):
    restaurant: Restaurant
    italian_restaurant: ItalianRestaurant

    @classmethod
    def setUpTestData(cls) -> None:
        cls.restaurant = Restaurant.objects.create(
            name="Demon Dogs", address="944 W. Fullerton", serves_hot_dogs=True, serves_pizza=False, rating=2
        )
        chef = Chef.objects.create(name="Albert")
        cls.italian_restaurant = ItalianRestaurant.objects.create(
            name="Ristorante Miron",
            address="1234 W. Ash",
            serves_hot_dogs=False,
            serves_pizza=False,
            serves_gnocchi=True,
            rating=4,
            chef=chef,
        )

    def test_update_inherited_model(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceDataTests::test_update_inherited_model"""
        self.italian_restaurant.address = "1234 W. Elm"
        self.italian_restaurant.save()
        self.assertQuerySetEqual(
            ItalianRestaurant.objects.filter(address="1234 W. Elm"), ["Ristorante Miron"], attrgetter("name")
        )

    @pytest.mark.skipif(django.VERSION < (6, 0), reason="Django 6.0+ (Model.NotUpdated)")
    def test_inherited_not_updated_exception(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceDataTests::test_inherited_not_updated_exception (6.1 suite, 6.0+ API)"""  # noqa: E501
        # NotUpdated is also inherited.
        obj = Restaurant(id=999)
        with self.assertRaises(Place.NotUpdated):  # type: ignore[attr-defined]
            obj.save(update_fields={"name"})

    def test_related_objects_for_inherited_models(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceDataTests::test_related_objects_for_inherited_models"""  # noqa: E501
        s1 = Supplier.objects.create(name="Joe's Chickens", address="123 Sesame St")
        s1.customers.set([self.restaurant, self.italian_restaurant])
        s2 = Supplier.objects.create(name="Luigi's Pasta", address="456 Sesame St")
        s2.customers.set([self.italian_restaurant])
        # This won't work because the Place we select is not a Restaurant (it's a Supplier).
        p = Place.objects.get(name="Joe's Chickens")
        with self.assertRaises(Restaurant.DoesNotExist):
            p.restaurant  # noqa: B018
        self.assertEqual(p.supplier, s1)
        self.assertQuerySetEqual(
            self.italian_restaurant.provider.order_by("-name"), ["Luigi's Pasta", "Joe's Chickens"], attrgetter("name")
        )
        self.assertQuerySetEqual(
            Restaurant.objects.filter(provider__name__contains="Chickens"),
            ["Ristorante Miron", "Demon Dogs"],
            attrgetter("name"),
        )
        self.assertQuerySetEqual(
            ItalianRestaurant.objects.filter(provider__name__contains="Chickens"),
            ["Ristorante Miron"],
            attrgetter("name"),
        )
        ParkingLot.objects.create(name="Main St", address="111 Main St", main_site=s1)
        ParkingLot.objects.create(name="Well Lit", address="124 Sesame St", main_site=self.italian_restaurant)
        self.assertEqual(Restaurant.objects.get(lot__name="Well Lit").name, "Ristorante Miron")

    def test_parent_cache_reuse(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceDataTests::test_parent_cache_reuse"""
        place = Place.objects.create()
        GrandChild.objects.create(place=place)
        grand_parent = GrandParent.objects.latest("pk")
        with self.assertNumQueries(1):
            self.assertEqual(grand_parent.place, place)
        parent = grand_parent.parent  # type: ignore[attr-defined]
        with self.assertNumQueries(0):
            self.assertEqual(parent.place, place)
        child = parent.child
        with self.assertNumQueries(0):
            self.assertEqual(child.place, place)
        grandchild = child.grandchild
        with self.assertNumQueries(0):
            self.assertEqual(grandchild.place, place)


class ModelInheritanceQueryCountTests(OutsideTransaction):
    """Django's ``ModelInheritanceDataTests`` counts, outside a transaction."""

    @on_sqlite_version_source
    def test_update_query_counts(self) -> None:
        """Django: tests/model_inheritance/tests.py::ModelInheritanceDataTests::test_update_query_counts"""
        chef = Chef.objects.create(name="Albert")
        italian_restaurant = ItalianRestaurant.objects.create(
            name="Ristorante Miron", address="1234 W. Ash", serves_gnocchi=True, rating=4, chef=chef
        )
        # Update queries do not generate unnecessary queries (#18304).
        with self.assertNumQueries(3, sqlite_versions=1):
            italian_restaurant.save()
