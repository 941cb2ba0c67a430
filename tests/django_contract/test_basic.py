"""Django's ``tests/basic/tests.py`` on models with ``LockVersionMixin``: creating, saving, refreshing.

Django's basic tests use naive datetimes (its test settings have ``USE_TZ = False``); so do these.
Run outside a transaction where Django counts statements (see :class:`.support.OutsideTransaction`).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import django
import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models.functions import Now
from django.test import override_settings, skipUnlessDBFeature

from safeupdates.exceptions import NeverLoadedError, StaleObjectError

from .models import (
    Article,
    ArticleSelectOnSave,
    ChildPrimaryKeyWithDefault,
    PrimaryKeyWithDbDefault,
    PrimaryKeyWithDefault,
    PrimaryKeyWithFalseyDbDefault,
    PrimaryKeyWithFalseyDefault,
    SelfRef,
)
from .support import EmptiedAfter, OutsideTransaction, difference, never_loaded, on_sqlite_version_source

DJANGO_6 = django.VERSION >= (6, 0)


@override_settings(USE_TZ=False)
class ModelInstanceCreationTests(OutsideTransaction):
    def test_object_is_not_written_to_database_until_save_was_called(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_object_is_not_written_to_database_until_save_was_called"""  # noqa: E501
        a = Article(id=None, headline="Parrot programs in Python", pub_date=datetime(2005, 7, 28))
        self.assertIsNone(a.id)
        self.assertEqual(Article.objects.count(), 0)
        # Save it into the database. You have to call save() explicitly.
        a.save()
        self.assertIsNotNone(a.id)
        self.assertEqual(Article.objects.count(), 1)

    def test_can_initialize_model_instance_using_positional_arguments(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_can_initialize_model_instance_using_positional_arguments"""  # noqa: E501
        a = Article(None, "Second article", datetime(2005, 7, 29))
        a.save()
        self.assertEqual(a.headline, "Second article")
        self.assertEqual(a.pub_date, datetime(2005, 7, 29, 0, 0))

    def test_can_mix_and_match_position_and_kwargs(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_can_mix_and_match_position_and_kwargs"""
        # You can also mix and match position and keyword arguments, but be sure not to duplicate field
        # information.
        a = Article(None, "Fourth article", pub_date=datetime(2005, 7, 31))
        a.save()
        self.assertEqual(a.headline, "Fourth article")

    def test_can_create_instance_using_kwargs(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_can_create_instance_using_kwargs"""
        a = Article(id=None, headline="Third article", pub_date=datetime(2005, 7, 30))
        a.save()
        self.assertEqual(a.headline, "Third article")
        self.assertEqual(a.pub_date, datetime(2005, 7, 30, 0, 0))

    def test_autofields_generate_different_values_for_each_instance(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_autofields_generate_different_values_for_each_instance"""  # noqa: E501
        a1 = Article.objects.create(headline="First", pub_date=datetime(2005, 7, 30, 0, 0))
        a2 = Article.objects.create(headline="First", pub_date=datetime(2005, 7, 30, 0, 0))
        a3 = Article.objects.create(headline="First", pub_date=datetime(2005, 7, 30, 0, 0))
        self.assertNotEqual(a3.id, a1.id)
        self.assertNotEqual(a3.id, a2.id)

    def test_can_leave_off_value_for_autofield_and_it_gets_value_on_save(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_can_leave_off_value_for_autofield_and_it_gets_value_on_save"""  # noqa: E501
        a = Article(headline="Article 5", pub_date=datetime(2005, 7, 31))
        a.save()
        self.assertEqual(a.headline, "Article 5")
        self.assertIsNotNone(a.id)

    def test_leaving_off_a_field_with_default_set_the_default_will_be_saved(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_leaving_off_a_field_with_default_set_the_default_will_be_saved"""  # noqa: E501
        a = Article(pub_date=datetime(2005, 7, 31))
        a.save()
        self.assertEqual(a.headline, "Default headline")
        self.assertEqual(Article.objects.get(pk=a.pk).headline, "Default headline")

    def test_for_datetimefields_saves_as_much_precision_as_was_given(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_for_datetimefields_saves_as_much_precision_as_was_given"""  # noqa: E501
        a1 = Article(headline="Article 7", pub_date=datetime(2005, 7, 31, 12, 30))
        a1.save()
        self.assertEqual(Article.objects.get(id__exact=a1.id).pub_date, datetime(2005, 7, 31, 12, 30))
        a2 = Article(headline="Article 8", pub_date=datetime(2005, 7, 31, 12, 30, 45))
        a2.save()
        self.assertEqual(Article.objects.get(id__exact=a2.id).pub_date, datetime(2005, 7, 31, 12, 30, 45))

    def test_saving_an_object_again_does_not_create_a_new_object(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_saving_an_object_again_does_not_create_a_new_object"""  # noqa: E501
        a = Article(headline="original", pub_date=datetime(2014, 5, 16))
        a.save()
        current_id = a.id
        a.save()
        self.assertEqual(a.id, current_id)
        a.headline = "Updated headline"
        a.save()
        self.assertEqual(a.id, current_id)
        self.assertEqual(Article.objects.get().headline, "Updated headline")

    def test_querysets_checking_for_membership(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_querysets_checking_for_membership"""
        some_pub_date = datetime(2014, 5, 16, 12, 1)
        for headline in ["Parrot programs in Python", "Second article", "Third article"]:
            Article(headline=headline, pub_date=some_pub_date).save()
        a = Article(headline="Some headline", pub_date=some_pub_date)
        a.save()
        self.assertIn(a, Article.objects.all())
        self.assertTrue(Article.objects.filter(id=a.id).exists())

    @on_sqlite_version_source
    def test_save_primary_with_default(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_save_primary_with_default"""
        # An UPDATE attempt is skipped when a primary key has default.
        with self.assertNumQueries(1, sqlite_versions=1):
            PrimaryKeyWithDefault().save()

    @difference
    @on_sqlite_version_source
    def test_save_primary_with_default_force_update(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_save_primary_with_default_force_update

        Difference: a new instance never loaded the row its key names, so the UPDATE asked for is refused
        (NeverLoadedError) and writes nothing; Django's writes over the row."""
        # An UPDATE attempt is made if explicitly requested.
        obj = PrimaryKeyWithDefault.objects.create()
        with (
            self.assertNumQueries(1, sqlite_versions=1),
            self.assertRaisesMessage(NeverLoadedError, never_loaded(PrimaryKeyWithDefault, obj.pk)),
        ):
            PrimaryKeyWithDefault(uuid=obj.pk).save(force_update=True)
        self.assertEqual(PrimaryKeyWithDefault.objects.get(pk=obj.pk).lock_version, obj.lock_version)

    @on_sqlite_version_source
    def test_save_primary_with_db_default(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_save_primary_with_db_default"""
        # An UPDATE attempt is skipped when a primary key has db_default.
        with self.assertNumQueries(1, sqlite_versions=1):
            PrimaryKeyWithDbDefault().save()

    @on_sqlite_version_source
    def test_save_parent_primary_with_default(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_save_parent_primary_with_default"""
        # An UPDATE attempt is skipped when an inherited primary key has default.
        with self.assertNumQueries(2, sqlite_versions=1):
            ChildPrimaryKeyWithDefault().save()

    @on_sqlite_version_source
    def test_save_primary_with_falsey_default(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_save_primary_with_falsey_default"""
        with self.assertNumQueries(1, sqlite_versions=1):
            PrimaryKeyWithFalseyDefault().save()

    @on_sqlite_version_source
    def test_save_primary_with_falsey_db_default(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_save_primary_with_falsey_db_default"""
        with self.assertNumQueries(1, sqlite_versions=1):
            PrimaryKeyWithFalseyDbDefault().save()

    @pytest.mark.skipif(not DJANGO_6, reason="Django 6.0+ (the auto field refreshed from the INSERT)")
    def test_auto_field_with_value_refreshed(self) -> None:
        """Django: tests/basic/tests.py::ModelInstanceCreationTests::test_auto_field_with_value_refreshed (6.0+)"""
        a = Article.objects.create(pk="123456", pub_date=datetime(2025, 9, 16))
        self.assertEqual(a.pk, 123456)


@override_settings(USE_TZ=False)
class ModelTest(OutsideTransaction):
    def test_not_equal_and_equal_operators_behave_as_expected_on_instances(self) -> None:
        """Django: tests/basic/tests.py::ModelTest::test_not_equal_and_equal_operators_behave_as_expected_on_instances"""  # noqa: E501
        some_pub_date = datetime(2014, 5, 16, 12, 1)
        a1 = Article.objects.create(headline="First", pub_date=some_pub_date)
        a2 = Article.objects.create(headline="Second", pub_date=some_pub_date)
        self.assertNotEqual(a1, a2)
        self.assertEqual(a1, Article.objects.get(id__exact=a1.id))
        self.assertNotEqual(Article.objects.get(id__exact=a1.id), Article.objects.get(id__exact=a2.id))

    def test_microsecond_precision(self) -> None:
        """Django: tests/basic/tests.py::ModelTest::test_microsecond_precision"""
        a9 = Article(headline="Article 9", pub_date=datetime(2005, 7, 31, 12, 30, 45, 180))
        a9.save()
        self.assertEqual(Article.objects.get(pk=a9.pk).pub_date, datetime(2005, 7, 31, 12, 30, 45, 180))

    def test_manually_specify_primary_key(self) -> None:
        """Django: tests/basic/tests.py::ModelTest::test_manually_specify_primary_key"""
        a101 = Article(id=101, headline="Article 101", pub_date=datetime(2005, 7, 31, 12, 30, 45))
        a101.save()
        a101 = Article.objects.get(pk=101)
        self.assertEqual(a101.headline, "Article 101")

    def test_create_method(self) -> None:
        """Django: tests/basic/tests.py::ModelTest::test_create_method"""
        a10 = Article.objects.create(headline="Article 10", pub_date=datetime(2005, 7, 31, 12, 30, 45))
        self.assertEqual(Article.objects.get(headline="Article 10"), a10)

    def test_unicode_data(self) -> None:
        """Django: tests/basic/tests.py::ModelTest::test_unicode_data"""
        a = Article(headline="\u6797\u539f \u3081\u3050\u307f", pub_date=datetime(2005, 7, 28))
        a.save()
        self.assertEqual(Article.objects.get(pk=a.id).headline, "\u6797\u539f \u3081\u3050\u307f")

    def test_ticket_20278(self) -> None:
        """Django: tests/basic/tests.py::ModelTest::test_ticket_20278"""
        sr = SelfRef.objects.create()
        with self.assertRaises(SelfRef.DoesNotExist):
            SelfRef.objects.get(selfref=sr)

    def test_delete_and_access_field(self) -> None:
        """Django: tests/basic/tests.py::ModelTest::test_delete_and_access_field"""
        # Accessing a field after it's deleted from a model reloads its value.
        pub_date = datetime.now()
        article = Article.objects.create(headline="foo", pub_date=pub_date)
        new_pub_date = article.pub_date + timedelta(days=10)
        article.headline = "bar"
        article.pub_date = new_pub_date
        del article.headline
        with self.assertNumQueries(1):
            self.assertEqual(article.headline, "foo")
        # Fields that weren't deleted aren't reloaded.
        self.assertEqual(article.pub_date, new_pub_date)

    def test_is_pk_set(self) -> None:
        """Django: tests/basic/tests.py::ModelTest::test_is_pk_set"""

        def new_instance() -> Article:
            a = Article(pub_date=datetime.today())
            a.save()
            return a

        cases = [Article(id=1), Article(id=0), Article.objects.create(pub_date=datetime.today()), new_instance()]
        for case in cases:
            with self.subTest(case=case):
                self.assertIs(case._is_pk_set(), True)

    @pytest.mark.skipif(not DJANGO_6, reason="Django 6.0+ (expressions returned by INSERT/UPDATE ... RETURNING)")
    def test_save_expressions(self) -> None:
        """Django: tests/basic/tests.py::ModelTest::test_save_expressions (6.0+)"""
        article = Article(pub_date=Now())
        article.save()
        expected_num_queries = 0 if connection.features.can_return_columns_from_insert else 1
        with self.assertNumQueries(expected_num_queries):
            article_pub_date = article.pub_date
        self.assertIsInstance(article_pub_date, datetime)
        # Sleep slightly to ensure a different database level NOW().
        time.sleep(0.1)
        article.pub_date = Now()
        article.save()
        expected_num_queries = 0 if connection.features.can_return_rows_from_update else 1
        with self.assertNumQueries(expected_num_queries):
            self.assertIsInstance(article.pub_date, datetime)
        self.assertGreater(article.pub_date, article_pub_date)


@override_settings(USE_TZ=False)
class ConcurrentSaveTests(EmptiedAfter):
    @skipUnlessDBFeature("test_db_allows_multiple_connections")
    @difference
    def test_concurrent_delete_with_save(self) -> None:
        """Django: tests/basic/tests.py::ConcurrentSaveTests::test_concurrent_delete_with_save

        Difference: Django inserts the row again; the row was deleted after the instance was loaded, so
        its save raises StaleObjectError and does not bring it back. force_insert=True does, on purpose."""
        a = Article.objects.create(headline="foo", pub_date=datetime.now())
        exceptions = []

        def deleter() -> None:
            try:
                # Do not delete a directly - doing so alters its state.
                Article.objects.filter(pk=a.pk).delete()
            except Exception as e:
                exceptions.append(e)
            finally:
                connections[DEFAULT_DB_ALIAS].close()

        t = threading.Thread(target=deleter)
        t.start()
        t.join()
        self.assertEqual(exceptions, [])
        with self.assertRaisesMessage(StaleObjectError, "was deleted after it was loaded"):
            a.save()
        self.assertFalse(Article.objects.filter(pk=a.pk).exists())
        a.save(force_insert=True)
        self.assertEqual(Article.objects.get(pk=a.pk).headline, "foo")


@override_settings(USE_TZ=False)
class SelectOnSaveTests(OutsideTransaction):
    @difference
    @on_sqlite_version_source
    def test_select_on_save(self) -> None:
        """Django: tests/basic/tests.py::SelectOnSaveTests::test_select_on_save

        Differences: the checked UPDATE decides whether the row is there, so select_on_save's SELECT is
        not sent (1 statement, Django 2); a save after the row was deleted raises StaleObjectError."""
        a1 = Article.objects.create(pub_date=datetime.now())
        with self.assertNumQueries(1, sqlite_versions=1):
            a1.save()
        asos = ArticleSelectOnSave.objects.create(pub_date=datetime.now())
        with self.assertNumQueries(1, sqlite_versions=1):
            asos.save()
        with self.assertNumQueries(1, sqlite_versions=1):
            asos.save(force_update=True)
        Article.objects.all().delete()
        with self.assertRaisesMessage(StaleObjectError, "was deleted after it was loaded"):
            asos.save(force_update=True)


@override_settings(USE_TZ=False)
class ModelRefreshTests(OutsideTransaction):
    def test_refresh(self) -> None:
        """Django: tests/basic/tests.py::ModelRefreshTests::test_refresh"""
        a = Article.objects.create(pub_date=datetime.now())
        Article.objects.create(pub_date=datetime.now())
        Article.objects.filter(pk=a.pk).update(headline="new headline")
        with self.assertNumQueries(1):
            a.refresh_from_db()
            self.assertEqual(a.headline, "new headline")
        orig_pub_date = a.pub_date
        new_pub_date = a.pub_date + timedelta(10)
        Article.objects.update(headline="new headline 2", pub_date=new_pub_date)
        with self.assertNumQueries(1):
            a.refresh_from_db(fields=["headline"])
            self.assertEqual(a.headline, "new headline 2")
            self.assertEqual(a.pub_date, orig_pub_date)
        with self.assertNumQueries(1):
            a.refresh_from_db()
            self.assertEqual(a.pub_date, new_pub_date)

    def test_refresh_fk(self) -> None:
        """Django: tests/basic/tests.py::ModelRefreshTests::test_refresh_fk"""
        s1 = SelfRef.objects.create()
        s2 = SelfRef.objects.create()
        s3 = SelfRef.objects.create(selfref=s1)
        s3_copy = SelfRef.objects.get(pk=s3.pk)
        s3_copy.selfref.touched = True  # type: ignore[union-attr]
        s3.selfref = s2
        s3.save()
        with self.assertNumQueries(1):
            s3_copy.refresh_from_db()
        with self.assertNumQueries(1):
            # The old related instance was thrown away (the selfref_id has changed). It needs to be
            # reloaded on access, so one query executed.
            self.assertFalse(hasattr(s3_copy.selfref, "touched"))
            self.assertEqual(s3_copy.selfref, s2)
        # And the refreshed copy saves: it carries the row's lock_version now.
        s3_copy.save()

    def test_refresh_null_fk(self) -> None:
        """Django: tests/basic/tests.py::ModelRefreshTests::test_refresh_null_fk"""
        s1 = SelfRef.objects.create()
        s2 = SelfRef.objects.create(selfref=s1)
        s2.selfref = None
        s2.refresh_from_db()
        self.assertEqual(s2.selfref, s1)

    def test_refresh_unsaved(self) -> None:
        """Django: tests/basic/tests.py::ModelRefreshTests::test_refresh_unsaved"""
        pub_date = datetime.now()
        a = Article.objects.create(pub_date=pub_date)
        a2 = Article(id=a.pk)
        with self.assertNumQueries(1):
            a2.refresh_from_db()
        self.assertEqual(a2.pub_date, pub_date)
        self.assertEqual(a2._state.db, "default")

    def test_refresh_fk_on_delete_set_null(self) -> None:
        """Django: tests/basic/tests.py::ModelRefreshTests::test_refresh_fk_on_delete_set_null"""
        a = Article.objects.create(headline="Parrot programs in Python", pub_date=datetime(2005, 7, 28))
        s1 = SelfRef.objects.create(article=a)
        a.delete()
        s1.refresh_from_db()
        self.assertIsNone(s1.article_id)
        self.assertIsNone(s1.article)

    def test_refresh_no_fields(self) -> None:
        """Django: tests/basic/tests.py::ModelRefreshTests::test_refresh_no_fields"""
        a = Article.objects.create(pub_date=datetime.now())
        with self.assertNumQueries(0):
            a.refresh_from_db(fields=[])
