"""The seam over Django's internals: the same behaviour on Django 5.2 and 6.x (``safeupdates.internals``)."""

from __future__ import annotations

import django
import pytest
from django.db import DatabaseError
from django.db.models import F

from safeupdates.database.internals import UPDATE_RETURNS_ROWS, bound_values, update_returning
from safeupdates.exceptions import StaleObjectError
from tests.testapp.models import Invoice, Profile, Refund

pytestmark = pytest.mark.django_db


def test_the_seam_knows_the_django_version():
    assert UPDATE_RETURNS_ROWS is (django.VERSION >= (6, 0))


def test_update_returning_returns_converted_values():
    profile = Profile.objects.create(name="a")
    fields = [Profile._meta.get_field(name) for name in ("name", "field_versions")]
    rows = update_returning(Profile.objects.filter(pk=profile.pk), [(fields[0], None, "b")], fields)
    assert rows == [("b", profile.field_versions)]  # JSON decoded, as the ORM would
    assert update_returning(Profile.objects.filter(pk=-1), [(fields[0], None, "c")], fields) == []


def test_a_generated_field_is_refreshed_after_save_where_django_does():
    invoice = Invoice.objects.create(net=5)
    invoice.refresh_from_db()
    invoice.net = 10
    invoice.save()
    if UPDATE_RETURNS_ROWS:
        assert invoice.gross == 20  # Django 6: returned by the checked UPDATE itself
    invoice.refresh_from_db()
    assert invoice.gross == 20


@pytest.mark.parametrize("update_fields", [None, ["fee"]])
def test_a_childs_generated_field_is_refreshed_after_save_where_django_does(update_fields):
    """A multi-table child's table asks for its generated column back (Django 6): its UPDATE returns it."""
    refund = Refund.objects.create(net=5, fee=1)
    refund.refresh_from_db()
    refund.fee = 4
    refund.save(update_fields=update_fields)
    if UPDATE_RETURNS_ROWS:
        assert "total" not in refund.get_deferred_fields() and refund.total == 12
    refund.refresh_from_db()
    assert (refund.total, refund.gross) == (12, 10)


def test_an_expression_assigned_before_save_is_applied_and_checked():
    invoice = Invoice.objects.create(net=5)
    stale = Invoice.objects.get(pk=invoice.pk)
    invoice.net = F("net") + 1
    invoice.save()
    if UPDATE_RETURNS_ROWS:
        assert invoice.net == 6
    assert Invoice.objects.get(pk=invoice.pk).net == 6
    stale.net = F("net") + 100
    with pytest.raises(StaleObjectError):
        stale.save()
    assert Invoice.objects.get(pk=invoice.pk).net == 6


def test_another_mixins_do_update_wraps_ours():
    invoice = Invoice.objects.create(net=1)
    before = Invoice.updates_seen
    invoice.net = 2
    invoice.save()
    assert Invoice.updates_seen == before + 1
    stale = Invoice.objects.get(pk=invoice.pk)
    invoice.save()
    with pytest.raises(StaleObjectError):
        stale.save()
    assert Invoice.updates_seen == before + 3


def test_update_fields_on_a_missing_row_raises_djangos_error():
    profile = Profile(pk=10**9, name="b")  # never loaded: not stale, just not there
    expected = getattr(Profile, "NotUpdated", DatabaseError)  # Model.NotUpdated is new in Django 6.0
    with pytest.raises(expected, match="did not affect any rows"):
        profile.save(update_fields=["name"])


def test_update_fields_on_a_row_deleted_since_it_was_loaded_is_stale():
    profile = Profile.objects.create(name="a")
    Profile.objects.filter(pk=profile.pk).delete()
    profile.name = "b"
    with pytest.raises(StaleObjectError, match="deleted after it was loaded"):
        profile.save(update_fields=["name"])


def test_fields_with_a_placeholder_of_their_own_take_the_compilers_path():
    """Django 5.2 names it get_placeholder, 6.x get_placeholder_sql: either way the ORM binds the value."""
    from django.contrib.postgres.fields import ArrayField
    from django.db import connection, models

    class CastBinary(models.BinaryField):
        def get_placeholder(self, value, compiler, connection):  # a placeholder of its own
            return "decode(%s, 'hex')"

        def get_placeholder_sql(self, value, compiler, connection):
            return "decode(%s, 'hex')", (value,)

    assert bound_values(connection, [(ArrayField(models.IntegerField()), None, [1, 2])]) is None
    assert bound_values(connection, [(CastBinary(), None, b"ab")]) is None
    assert bound_values(connection, [(models.IntegerField(), None, F("x"))]) is None
    plain = bound_values(connection, [(models.BinaryField(), None, b"ab"), (models.IntegerField(), None, "7")])
    assert plain is not None and len(plain) == 2 and plain[1] == 7  # prepared: "7" is the int 7


def test_the_request_log_model_is_looked_up_once_and_again_after_installed_apps_change() -> None:
    from django.apps import apps
    from django.test import override_settings

    from safeupdates.database import registry
    from safeupdates.models import ProcessedRequest

    assert registry.request_log() is ProcessedRequest
    assert registry._request_log == [ProcessedRequest]  # kept: the write path asks on every call
    installed = [app.name for app in apps.get_app_configs()]
    with override_settings(INSTALLED_APPS=installed):
        assert registry._request_log == []  # the app registry was rebuilt: looked up again
        assert registry.request_log() is apps.get_model("safeupdates", "ProcessedRequest")
    assert registry._request_log == []
    assert registry.request_log() is ProcessedRequest
