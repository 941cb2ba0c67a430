"""A column's limits, each tested on both sides (issue 58): a value just inside is accepted, stored and
read back equal; a value just outside is refused with ``InvalidUpdate`` before any statement, and nothing
is written (neither the row nor the request log). Through ``update_if_newer()`` (plain and recorded in the
request log) and ``save()``.

The other side of each limit was tested alone (a huge positive duration, a real NUL in JSON, a ragged
array): a check that looked at one side only passed.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, models, transaction
from django.test.utils import isolate_apps

from safeupdates.exceptions import InvalidUpdate
from safeupdates.models import ProcessedRequest, SafeUpdateModel
from safeupdates.versions import next_version
from tests.test_hostile_values import refused, stored, write_paths
from tests.testapp.models import Document, Everything

pytestmark = pytest.mark.django_db

#: The ways a value reaches a row here: the guarded write, alone and recorded in the request log, and save().
PATHS = ("update_if_newer", "update_if_newer(request_id=)", "save")


@pytest.fixture(params=PATHS)
def entry(request: pytest.FixtureRequest) -> Callable[..., None]:
    return write_paths(Everything)[request.param]


@pytest.fixture
def pk() -> Any:
    return Everything.objects.create().pk


def written(entry: Callable[..., None], pk: Any, **changes: Any) -> dict[str, Any]:
    """Write ``changes`` through ``entry``; return the row as the database then holds it."""
    with transaction.atomic():
        entry(pk, **changes)
    return stored(pk)


# -- durations: a bigint of microseconds (SQLite's column; the portable bound on PostgreSQL's interval) -------

MICROSECOND = datetime.timedelta(microseconds=1)
LEAST, GREATEST = -(2**63), 2**63 - 1


@pytest.mark.parametrize("micros", [LEAST, LEAST + 1, -1, GREATEST], ids=["least", "least+1", "-1us", "greatest"])
def test_a_duration_just_inside_the_bigint_of_microseconds_is_stored(entry, pk, micros):
    took = micros * MICROSECOND
    assert written(entry, pk, took=took)["took"] == took


@pytest.mark.parametrize("micros", [LEAST - 1, GREATEST + 1], ids=["least-1", "greatest+1"])
def test_a_duration_just_outside_the_bigint_of_microseconds_is_refused(entry, pk, micros):
    with refused(pk, r"Everything\.took"):
        entry(pk, took=micros * MICROSECOND)


def test_the_least_duration_python_holds_is_refused(entry, pk):
    """``timedelta.min``: far past the negative end (as ``timedelta.max`` past the positive one)."""
    with refused(pk, r"Everything\.took"):
        entry(pk, took=datetime.timedelta.min)


# -- JSON: the six characters \u0000 are text; a NUL character is not storable ------------------------------

ESCAPE = "\\u0000"  # a backslash, then u0000: six characters, no NUL among them


@pytest.mark.parametrize(
    "data",
    [
        ESCAPE,
        {"note": f"a{ESCAPE}b"},
        {ESCAPE: [ESCAPE, {"deeper": "\\" + ESCAPE}]},  # as a key; after a backslash of its own
        ["\\\\\\u0000", "\\"],  # three backslashes then u0000; a lone backslash
    ],
    ids=["alone", "inside", "key and list", "backslashes"],
)
def test_json_text_holding_backslash_u0000_is_stored_as_it_is(entry, pk, data):
    assert "\x00" not in repr(data)
    assert written(entry, pk, data=data)["data"] == data


@pytest.mark.parametrize(
    "data",
    ["\x00", {"note": "a\x00b"}, {"\x00": 1}, ["\\\x00"], {"note": ESCAPE + "\x00"}],
    ids=["alone", "inside", "key", "after a backslash", "beside the six characters"],
)
def test_json_text_holding_a_nul_character_is_refused(entry, pk, data):
    with refused(pk, r"Everything\.data.*NUL"):
        entry(pk, data=data)


def test_text_holding_backslash_u0000_is_stored_as_it_is(entry, pk):
    """Not JSON, the same six characters: plain text."""
    assert written(entry, pk, text=f"a{ESCAPE}b")["text"] == f"a{ESCAPE}b"


# -- PostgreSQL arrays: the rows of a multidimensional array are all arrays, none NULL -----------------------


@pytest.fixture(scope="module")
def grid_model() -> Iterator[type[models.Model]]:
    from django.contrib.postgres.fields import ArrayField

    with isolate_apps("tests.testapp"):

        class Grid(SafeUpdateModel):
            """A two-dimensional array (its rows may be NULL in the model; PostgreSQL has no NULL row)."""

            cells = ArrayField(
                ArrayField(models.IntegerField(null=True, blank=True), null=True, blank=True),
                null=True,
                blank=True,
            )
            safe_update_fields = ("cells",)

            class Meta:
                app_label = "testapp"

            def __str__(self) -> str:
                return f"grid {self.pk}"

        yield Grid


@pytest.fixture
def grid(postgres_only: None, grid_model: Any) -> Any:
    """A table of ``Grid`` in the test's transaction (rolled back with it) and a row in it."""
    with connection.schema_editor() as editor:
        editor.create_model(grid_model)
    return grid_model.objects.create()


def grid_paths(model: Any) -> dict[str, Callable[..., None]]:
    def via_update(pk: Any, **changes: Any) -> None:
        model.objects.update_if_newer(pk, version=next_version(), **changes)

    def via_recorded_update(pk: Any, **changes: Any) -> None:
        model.objects.update_if_newer(pk, version=next_version(), request_id=uuid.uuid4(), **changes)

    def via_save(pk: Any, **changes: Any) -> None:
        instance = model.objects.get(pk=pk)
        for name, value in changes.items():
            setattr(instance, name, value)
        instance.save()

    return dict(zip(PATHS, (via_update, via_recorded_update, via_save), strict=True))


def cells_of(grid: Any) -> Any:
    return type(grid)._base_manager.filter(pk=grid.pk).values_list("cells", flat=True).get()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "cells",
    [[[1, 2], [None, 3]], [[None, None]], [[4], [5]], []],
    ids=["rows with nulls", "a row of nulls", "rows of one", "empty"],
)
def test_an_array_whose_rows_are_all_lists_is_stored(grid, path, cells):
    with transaction.atomic():
        grid_paths(type(grid))[path](grid.pk, cells=cells)
    assert cells_of(grid) == cells


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "cells",
    [[[1, 2], None], [None, [1, 2]], [[1], None, [2]], [[None], None]],
    ids=["list then null", "null then list", "null between", "a row of a null then null"],
)
def test_an_array_whose_rows_mix_lists_and_null_is_refused(grid, path, cells):
    before, logged = cells_of(grid), ProcessedRequest.objects.count()
    with transaction.atomic():
        with pytest.raises(InvalidUpdate, match=r"Grid\.cells"):
            grid_paths(type(grid))[path](grid.pk, cells=cells)
        Document.objects.create(title="after")  # the caller's transaction goes on
    assert cells_of(grid) == before
    assert ProcessedRequest.objects.count() == logged


# -- decimals: the whole digits its column holds (Everything.amount: max_digits=8, decimal_places=3) ---------


@pytest.mark.parametrize("given", ["99999.999", "-99999.999", "99999", "0.001"])
def test_a_decimal_with_all_the_whole_digits_its_column_holds_is_stored(entry, pk, given):
    assert written(entry, pk, amount=Decimal(given))["amount"] == Decimal(given)


@pytest.mark.parametrize("given", ["100000", "-100000", "100000.0"])
def test_a_decimal_with_one_whole_digit_more_is_refused(entry, pk, given):
    with refused(pk, r"Everything\.amount.* 5 digit(s|\(s\)) before the decimal point"):
        entry(pk, amount=Decimal(given))
