"""``save()`` refuses, before any statement, only what the database would refuse: a value Django's own
``save()`` writes (a custom field's value, a Decimal with more places than its column keeps, a new file
whose name the storage shortens) is written as Django writes it, and a value an array's or range's
items refuse is an InvalidUpdate, never a bare ValidationError or OverflowError."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.db import models
from django.test.utils import isolate_apps

from safeupdates.exceptions import InvalidUpdate
from safeupdates.models import SafeUpdateModel
from safeupdates.write.validation import check_saved
from tests.testapp.models import Everything


class CommaSeparated(models.TextField):
    """A custom field as projects write them: a list in Python, a text in the column, and Django's
    default ``value_to_string()`` (``str()``), which does not read back through ``to_python()``."""

    def to_python(self, value: Any) -> Any:
        return value.split(",") if isinstance(value, str) else value

    def get_prep_value(self, value: Any) -> Any:
        return None if value is None else ",".join(value)


@isolate_apps("tests.testapp")
def test_a_custom_field_whose_text_form_does_not_read_back_is_saved():
    class Tagged(SafeUpdateModel):
        tags = CommaSeparated(default="")

        class Meta:
            app_label = "testapp"

    assert check_saved(Tagged(tags=["a", "b"]), None) is False
    assert check_saved(Tagged(), None) is False


@pytest.mark.django_db
def test_a_decimal_with_more_places_than_its_column_is_rounded_as_django_rounds_it():
    """A price times a tax rate: the column keeps 3 places, and the database rounds, as with Django."""
    row = Everything(amount=Decimal("19.99") * Decimal("1.0825"))
    row.save()
    row.refresh_from_db()
    assert row.amount == Decimal("21.639")


@pytest.mark.django_db
@pytest.mark.parametrize("amount", [Decimal("123456.7"), Decimal("99999.9999")])
def test_a_decimal_too_large_for_its_column_is_refused(amount):
    """8 digits, 3 of them places: 5 before the point, counted after the rounding the database does."""
    with pytest.raises(InvalidUpdate, match="amount"):
        Everything(amount=amount).save()
    assert not Everything.objects.exists()


def test_a_new_file_whose_name_the_storage_shortens_is_saved():
    """Django saves a new file under a name the storage makes fit ``max_length``; only a stored file's
    name is the column's value."""
    row = Everything(file=ContentFile(b"hi", name="report-" + "q" * 50 + ".pdf"))
    assert check_saved(row, ["file"]) is False


@isolate_apps("tests.testapp")
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("numbers", ["x"]),
        ("ratios", [10**400]),
    ],
)
def test_an_item_its_array_refuses_is_an_invalid_update(field, value):
    from django.contrib.postgres.fields import ArrayField

    class Series(SafeUpdateModel):
        numbers = ArrayField(models.IntegerField(), default=list)
        ratios = ArrayField(models.FloatField(), default=list)

        class Meta:
            app_label = "testapp"

    with pytest.raises(InvalidUpdate, match=field):
        check_saved(Series(**{field: value}), [field])
