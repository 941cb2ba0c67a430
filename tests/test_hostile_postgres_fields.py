"""PostgreSQL's own fields (arrays, ranges) through the one check of values: each item and bound is
decided by its base field, and what the request log records of a value reads back as that value.

The model is defined in an isolated app registry (no table): the check needs none, and
``enqueue_update()``'s job reads the recorded changes back through ``clean_changes()``, as here.
"""

from __future__ import annotations

import datetime
import json
import sys
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.postgres.fields import (
    ArrayField,
    DateTimeRangeField,
    DecimalRangeField,
    HStoreField,
    IntegerRangeField,
)
from django.db import models
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange, NumericRange
from django.test.utils import isolate_apps
from hypothesis import given, settings
from hypothesis import strategies as st

from safeupdates.exceptions import InvalidUpdate
from safeupdates.models import ChangesEncoder
from safeupdates.write.validation import clean_changes, recorded_changes

UTC = datetime.UTC


@pytest.fixture(scope="module")
def model() -> Any:
    with isolate_apps("tests.testapp"):

        class Shapes(models.Model):  # noqa: DJ008
            numbers = ArrayField(models.IntegerField(), default=list, blank=True)
            grid = ArrayField(ArrayField(models.SmallIntegerField(), blank=True), default=list, blank=True)
            words = ArrayField(models.CharField(max_length=5, blank=True), default=list, blank=True)
            ratios = ArrayField(models.FloatField(), default=list, blank=True)
            blobs = ArrayField(models.BinaryField(blank=True), default=list, blank=True)
            documents = ArrayField(models.JSONField(null=True, blank=True), default=list, blank=True)
            tags = HStoreField(null=True, blank=True)
            span = IntegerRangeField(null=True)
            amounts = DecimalRangeField(null=True)
            during = DateTimeRangeField(null=True)

            class Meta:
                app_label = "testapp"

        yield Shapes


def through_the_log(model: Any, cleaned: dict[str, Any]) -> dict[str, Any]:
    """What the job reads back of ``cleaned`` recorded in the request log."""
    return clean_changes(model, json.loads(json.dumps(recorded_changes(model, cleaned), cls=ChangesEncoder)))


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("numbers", [1, 2**31], "out of range"),
        ("numbers", [1, True], "bool"),
        ("numbers", [10 ** (sys.get_int_max_str_digits() + 1)], "out of range"),
        ("grid", [[1, 2], [3]], "not rectangular"),
        ("grid", [[1, 2], 3], "takes a list"),
        ("words", ["a\ud800"], "surrogate"),
        ("words", ["a\x00"], "NUL"),
        ("ratios", [1.0, float("nan")], "not a finite number"),
        ("ratios", "[1.0, NaN]", "not a finite number"),
        ("span", NumericRange(5, 1), "lower bound above"),
        ("span", NumericRange(0, 2**31), "out of range"),
        ("span", (0, "x"), "invalid"),
        ("amounts", NumericRange(Decimal("NaN"), None), "decimal number"),
        ("during", DateTimeTZRange(datetime.datetime(2026, 1, 1), None), "naive"),
        ("during", 5, "takes a Range"),
        ("documents", [{"a": [1.0, float("nan")]}], "NaN"),
        ("documents", [["\x00"]], "NUL"),
        ("tags", {"a": "b\x00"}, "NUL"),
        ("tags", {"a\x00": "b"}, "NUL"),
        ("tags", {"a": "b\ud800"}, "surrogate"),
        ("tags", {"a\ud800": "b"}, "surrogate"),
        ("tags", ["a"], "takes a dict"),
        ("tags", {"a": 1}, "not a string"),
    ],
)
def test_an_item_or_bound_its_base_field_refuses_is_refused(model, name, value, why):
    with pytest.raises(InvalidUpdate, match=rf"Shapes\.{name}.*{why}"):
        clean_changes(model, {name: value})


@settings(max_examples=100, deadline=None)
@given(
    numbers=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4),
    grid=st.integers(0, 3).flatmap(
        lambda width: st.lists(st.lists(st.integers(-(2**15), 2**15 - 1), min_size=width, max_size=width), max_size=3)
    ),
    words=st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=5), max_size=3),
    blobs=st.lists(st.binary(max_size=8), max_size=3),
    span=st.tuples(st.integers(-100, 100), st.integers(0, 100)).map(lambda t: NumericRange(t[0], t[0] + t[1])),
    amounts=st.tuples(st.decimals(-100, 100, places=2), st.decimals(0, 100, places=2)).map(
        lambda t: NumericRange(t[0], t[0] + t[1], "[]")
    ),
    during=st.datetimes(
        min_value=datetime.datetime(1900, 1, 1), max_value=datetime.datetime(2100, 1, 1), timezones=st.just(UTC)
    ).map(lambda start: DateTimeTZRange(start, start + datetime.timedelta(hours=1))),
)
def test_what_the_log_records_reads_back_as_the_value(model, numbers, grid, words, blobs, span, amounts, during):
    values = {"numbers": numbers, "grid": grid, "words": words, "blobs": blobs, "span": span}
    values |= {"amounts": amounts, "during": during}
    cleaned = clean_changes(model, values)
    back = through_the_log(model, cleaned)
    assert {k: [bytes(b) for b in v] if k == "blobs" else v for k, v in back.items()} == values


@pytest.mark.parametrize(
    "documents",
    [[[1, 2], [3]], [[1], "x", {"a": [1, 2]}], [[], [[1]]], [None, [1, 2]], [{"k": [[1], [2, 3]]}]],
    ids=["lists-of-two-lengths", "a-list-beside-others", "nested-lists", "a-null-beside-a-list", "in-an-object"],
)
def test_an_array_of_json_takes_any_json_value_as_its_item(model, documents):
    """An item of ``ArrayField(JSONField())`` is one ``jsonb`` value, a list included: PostgreSQL keeps the
    array one-dimensional, so its items need no common shape (only an array of arrays must be rectangular)."""
    cleaned = clean_changes(model, {"documents": documents})
    assert cleaned == {"documents": documents}
    assert through_the_log(model, cleaned) == cleaned


def test_an_hstore_value_reads_back_from_the_log(model):
    """hstore holds text keys and text or NULL values; a key that is no string is stored as its str()."""
    tags = {"colour": "red", "size": None, "note": "caf\u00e9 \u2603"}
    cleaned = clean_changes(model, {"tags": tags})
    assert cleaned == {"tags": tags}
    assert through_the_log(model, cleaned) == cleaned
