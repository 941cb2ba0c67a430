"""Values an update must refuse before anything is written, and values it must accept.

Every entry point validates through :mod:`safeupdates.validation`: ``update_if_newer``, ``enqueue_update``
and ``bulk_update_if_newer`` are each tested with every bad value, and each refusal is checked to leave
the row, the request log and the queue as they were.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import django_rq
import pytest
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Value
from django.db.models.functions import Lower
from django.test import override_settings

from safeupdates import enqueue_update
from safeupdates.exceptions import InvalidUpdate
from safeupdates.jobs import apply_update
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from safeupdates.write.validation import (
    clean_changes,
    clean_object_id,
    clean_pk,
    clean_synced_at,
    clean_version,
    short_message,
)
from tests.django_contract.models import GenericB1
from tests.testapp.models import Attachment, Bookmark, Document, Gadget, Profile, Shelter, Specimen, Stamp, Tag

pytestmark = pytest.mark.django_db


def row(model: type[models.Model], pk: Any) -> dict[str, Any]:
    return model._default_manager.filter(pk=pk).values().get()


@contextmanager
def refused(match: str, *objs: models.Model) -> Iterator[None]:
    """Expect ``InvalidUpdate`` matching ``match``; check that no row, log row or job was written."""
    before = [row(type(obj), obj.pk) for obj in objs]
    logged = ProcessedRequest.objects.count()
    queue = django_rq.get_queue("default")
    with pytest.raises(InvalidUpdate, match=match):
        yield
    assert [row(type(obj), obj.pk) for obj in objs] == before
    assert ProcessedRequest.objects.count() == logged
    assert queue.count == 0


def via_update(model: type[models.Model], pk: Any, **changes: Any) -> Any:
    return model._default_manager.update_if_newer(pk, version=next_version(), **changes)  # type: ignore[attr-defined]


def via_recorded_update(model: type[models.Model], pk: Any, **changes: Any) -> Any:
    return model._default_manager.update_if_newer(  # type: ignore[attr-defined]
        pk, version=next_version(), request_id="5f0b7c43-7f0e-4d1e-9c39-6a1f3b1f2a11", **changes
    )


def via_enqueue(model: type[models.Model], pk: Any, **changes: Any) -> Any:
    return enqueue_update(model, pk, **changes)


def via_bulk(model: type[models.Model], pk: Any, **changes: Any) -> Any:
    return model._default_manager.bulk_update_if_newer([(pk, next_version(), changes)])  # type: ignore[attr-defined]


ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "update_if_newer": via_update,
    "update_if_newer(request_id=)": via_recorded_update,
    "enqueue_update": via_enqueue,
    "bulk_update_if_newer": via_bulk,
}


@pytest.fixture(params=list(ENTRY_POINTS))
def update(request: pytest.FixtureRequest, redis: Any, django_capture_on_commit_callbacks: Any) -> Iterator[Any]:
    """Each public entry point; a job enqueued on commit would land in the (checked) queue."""
    with django_capture_on_commit_callbacks(execute=True):
        yield ENTRY_POINTS[request.param]


@pytest.fixture
def gadget() -> Gadget:
    return Gadget.objects.create(label="start", count=5, ratio=0.5, nickname="nick")


@pytest.fixture
def profile() -> Profile:
    return Profile.objects.create(name="start", score=5)


# ---------------------------------------------------------------------------------------------------------
# Primary keys


@pytest.mark.parametrize(
    ("offset", "match"),
    [
        (0.9, r"primary key .* is not a whole number"),
        (0.5, r"primary key .* is not a whole number"),
        (Decimal("0.1"), r"primary key .* is not a whole number"),
    ],
)
def test_a_fractional_primary_key_is_refused(update, profile, offset, match):
    with refused(match, profile):
        update(Profile, profile.pk + offset, active=True)


@pytest.mark.parametrize(
    ("pk", "match"),
    [
        (True, "primary key True is a bool"),
        (float("nan"), "primary key nan is not a whole number"),
        (float("inf"), "primary key inf is not a whole number"),
        (Decimal("NaN"), r"primary key Decimal\('NaN'\) is not a whole number"),
        (2**63, r"primary key 9223372036854775808 is out of range"),
        (-(2**63) - 1, r"primary key -9223372036854775809 is out of range"),
        (F("pk"), "primary key F\\(pk\\) is an expression"),
        (Value(1), "primary key Value\\(1\\) is an expression"),
    ],
)
def test_other_impossible_primary_keys_are_refused(update, profile, pk, match):
    with refused(match, profile):
        update(Profile, pk, active=True)


def test_an_integral_float_primary_key_is_the_integer(profile):
    # Converting 2.0 to 2 changes nothing, so it is accepted (a fraction is refused, never truncated).
    assert clean_pk(Profile, float(profile.pk)) == profile.pk
    assert clean_pk(Profile, Decimal(profile.pk)) == profile.pk
    assert clean_pk(Profile, str(profile.pk)) == profile.pk  # URL and request-log object ids are text
    assert via_update(Profile, float(profile.pk), score=7).applied
    assert row(Profile, profile.pk)["score"] == 7


def test_an_instance_and_another_rows_primary_key_are_refused(redis, profile, django_capture_on_commit_callbacks):
    # enqueue_update(instance, pk) would write pk's row, routed by the instance: whichever the caller meant,
    # one of the two is wrong, so neither is guessed.
    other = Profile.objects.create(name="other", score=1)
    with django_capture_on_commit_callbacks(execute=True):
        given = r"testapp.Profile: enqueue_update\(\) was given"
        whole = rf"{given} the instance pk={profile.pk} and pk={other.pk}, another row: pass the instance alone, or "
        with refused(whole + r"the model class and the key\.$", profile, other):
            enqueue_update(profile, other.pk, active=True)
        with refused(rf"{given} an unsaved instance and pk={other.pk}", other):
            enqueue_update(Profile(name="new"), other.pk, active=True)
        # The instance's own key, in any form the key field converts, names the same row: accepted.
        queued = enqueue_update(profile, str(profile.pk), active=True)
    assert queued.object_id == str(profile.pk)


def test_a_nul_character_in_a_char_primary_key_is_refused(update):
    tag = Tag.objects.create(code="a", label="x")
    with refused("NUL", tag):
        update(Tag, "a\x00", label="y")


def test_clean_object_id_refuses_a_primary_key_longer_than_the_request_log_column():
    assert clean_object_id(Tag, "t" * 255) == "t" * 255
    assert clean_object_id(Profile, "12") == "12"
    assert clean_object_id(Profile, 12.0) == "12"
    with pytest.raises(InvalidUpdate, match=r"testapp.Tag: primary key 't{10}\.\.\.' has 300 characters"):
        clean_object_id(Tag, "t" * 300)
    with pytest.raises(InvalidUpdate, match="not a whole number"):
        clean_object_id(Profile, 1.5)


@pytest.mark.parametrize("entry_point", ["update_if_newer(request_id=)", "enqueue_update"])
def test_a_primary_key_too_long_for_the_request_log_is_refused(redis, entry_point):
    tag = Tag.objects.create(code="t" * 300, label="x")
    with refused("has 300 characters", tag):
        ENTRY_POINTS[entry_point](Tag, tag.pk, label="y")


# ---------------------------------------------------------------------------------------------------------
# Integer fields


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (1.7, r"Gadget.count=1.7 is not a whole number"),
        (-0.5, r"Gadget.count=-0.5 is not a whole number"),
        (Decimal("2.5"), r"Gadget.count=Decimal\('2.5'\) is not a whole number"),
        (True, r"Gadget.count=True is a bool"),
        (float("inf"), r"Gadget.count=inf is not a whole number"),
        (float("nan"), r"Gadget.count=nan is not a whole number"),
        (
            2**31,
            r"Gadget.count=2147483648 is out of range: a IntegerField column holds -2147483648 to 2147483647; "
            r"use a wider field \(BigIntegerField\) if the value is right\.",
        ),
        (-(2**31) - 1, r"Gadget.count=-2147483649 is out of range"),
        (2**63, r"Gadget.count=9223372036854775808 is out of range"),
        (-(2**63) - 1, r"Gadget.count=-9223372036854775809 is out of range"),
        (2.0**70, r"is out of range"),
    ],
)
def test_integer_field_values_that_would_be_changed_are_refused(update, gadget, value, match):
    with refused(match, gadget):
        update(Gadget, gadget.pk, count=value)


def test_integer_field_bounds_and_whole_numbers_are_accepted(gadget):
    for value, stored in [(2**31 - 1, 2**31 - 1), (-(2**31), -(2**31)), (3.0, 3), (Decimal("4"), 4), ("6", 6)]:
        assert via_update(Gadget, gadget.pk, count=value).applied
        assert row(Gadget, gadget.pk)["count"] == stored


# ---------------------------------------------------------------------------------------------------------
# Floats


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), float("-inf"), Decimal("NaN"), Decimal("-Infinity"), "nan", "inf"]
)
def test_nan_and_infinity_are_refused_for_a_float_field(update, gadget, value):
    whole = (
        r"Gadget.ratio=.* is not a finite number: NaN and infinity cannot be carried by the request log's JSON "
        r"nor compared; pass a finite number \(or None, for a nullable field\)\."
    )
    with refused(whole, gadget):
        update(Gadget, gadget.pk, ratio=value)


def test_a_bool_is_refused_for_a_float_field(update, gadget):
    with refused(r"Gadget.ratio=False is a bool", gadget):
        update(Gadget, gadget.pk, ratio=False)


# ---------------------------------------------------------------------------------------------------------
# Expressions and text


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"label": F("label")}, r"Gadget.label=F\(label\) is an expression"),
        ({"count": F("count") + 1}, r"Gadget.count=.* is an expression"),
        ({"label": Lower("label")}, r"Gadget.label=.* is an expression"),
        ({"ratio": Value(1.5)}, r"Gadget.ratio=Value\(1.5\) is an expression"),
        ({"nickname": F("label")}, r"Gadget.nickname=F\(label\) is an expression"),
    ],
)
def test_expressions_are_refused_for_every_field(update, gadget, changes, match):
    with refused(match, gadget):
        update(Gadget, gadget.pk, **changes)


def test_a_nul_character_in_text_is_refused(update, gadget, profile):
    with refused(r"Gadget.label='a\\x00b' contains a NUL character", gadget):
        update(Gadget, gadget.pk, label="a\x00b")
    with refused(r"Profile.name='\\x00' contains a NUL character", profile):
        update(Profile, profile.pk, name="\x00")


# ---------------------------------------------------------------------------------------------------------
# None


@pytest.mark.parametrize("path", ["update_if_newer", "update_if_newer(request_id=)", "bulk_update_if_newer"])
def test_none_is_accepted_for_a_nullable_field_and_written_as_null(gadget, path):
    ENTRY_POINTS[path](Gadget, gadget.pk, nickname=None)
    assert row(Gadget, gadget.pk)["nickname"] is None


@pytest.mark.django_db(transaction=True)
def test_none_through_the_job_path_is_written_as_null(redis, gadget):
    request = enqueue_update(gadget, nickname=None)
    assert request.changes == {"nickname": None}
    apply_update(str(request.request_id))
    assert row(Gadget, gadget.pk)["nickname"] is None
    assert ProcessedRequest.objects.get().status == "applied"


def test_none_is_still_refused_where_the_column_is_not_null(update, gadget):
    with refused(r"Gadget.label=None is invalid: This field cannot be null", gadget):
        update(Gadget, gadget.pk, label=None)


def test_clean_changes_keeps_good_values():
    assert clean_changes(Gadget, {"label": "ok", "count": 2**31 - 1, "ratio": 1e308, "nickname": None}) == {
        "label": "ok",
        "count": 2**31 - 1,
        "ratio": 1e308,
        "nickname": None,
    }
    assert math.isclose(clean_changes(Gadget, {"ratio": Decimal("0.25")})["ratio"], 0.25)


def test_messages_never_echo_a_whole_huge_input(gadget):
    from safeupdates.write.validation import clean_request_id

    for call in [
        lambda: clean_request_id("x" * 100_000),
        lambda: clean_changes(Gadget, {"label": "y" * 100_000}),
        lambda: clean_pk(Gadget, "9" * 100_000),
    ]:
        with pytest.raises(InvalidUpdate) as excinfo:
            call()
        assert len(str(excinfo.value)) < 300, str(excinfo.value)[:300]


def test_long_values_and_messages_are_cut_at_their_limits():
    """A value is shown whole up to 60 characters of its repr, a message of Django's up to 150; longer,
    cut to that length, the ellipsis included (``Truncator.chars()``)."""
    with pytest.raises(InvalidUpdate) as excinfo:
        clean_changes(Attachment, {"kind": "x" * 58})
    assert str(excinfo.value) == (
        f"testapp.Attachment.kind='{'x' * 58}' is invalid: Value '{'x' * 58}' is not a valid choice."
    )
    with pytest.raises(InvalidUpdate) as excinfo:
        clean_changes(Attachment, {"kind": "x" * 119})  # Django's message: 150 characters
    assert str(excinfo.value) == (
        f"testapp.Attachment.kind='{'x' * 56}... is invalid: Value '{'x' * 119}' is not a valid choice."
    )
    with pytest.raises(InvalidUpdate) as excinfo:
        clean_changes(Attachment, {"kind": "x" * 120})  # 151 characters
    assert str(excinfo.value) == (
        f"testapp.Attachment.kind='{'x' * 56}... is invalid: Value '{'x' * 120}' is not a valid cho..."
    )


def test_each_refusal_of_a_field_or_key_says_what_was_wrong():
    """The whole message of each refusal (``clean_changes`` 22; ``clean_pk`` 29, 31; ``writable_field``
    18: a message lost, the key not shown, the field names not listed as the text says; and below)."""
    cases: list[tuple[Callable[[], Any], str]] = [
        (
            lambda: clean_changes(Bookmark, {"document": None, "document_id": None}),
            "testapp.Bookmark.document is given twice.",
        ),
        (lambda: clean_pk(Profile, None), "testapp.Profile: a primary key is required."),
        (
            lambda: clean_pk(Stamp, [1]),  # a DateTimeField's to_python() raises TypeError, not ValidationError
            "testapp.Stamp: invalid primary key [1]: fromisoformat: argument must be str",
        ),
        (
            lambda: clean_changes(Bookmark, {"nope": 1}),
            "testapp.Bookmark has no field 'nope'; fields that can be updated: document, label.",
        ),
        (  # a reverse relation (``writable_field`` 31)
            lambda: clean_changes(Document, {"chapters": 1}),
            "testapp.Document.chapters is not a concrete column and cannot be updated.",
        ),
        (  # a model field with no column (``writable_field`` 28)
            lambda: clean_changes(GenericB1, {"generic_delete_top": None}),
            "django_contract.GenericB1.generic_delete_top is not a concrete column and cannot be updated.",
        ),
        (  # a value two validators refuse: both messages (``_messages`` 2)
            lambda: clean_changes(Shelter, {"slug": "not a slug!"}),
            "testapp.Shelter.slug='not a slug!' is invalid: Enter a valid “slug” consisting of letters, numbers, "
            "underscores or hyphens. Ensure this value has at most 8 characters (it has 11).",
        ),
        (  # a naive datetime where no datetime column is (``_refuse_after_conversion`` 16)
            lambda: clean_changes(Specimen, {"data": datetime.datetime(2026, 1, 2, 3, 4)}),
            "testapp.Specimen.data=datetime.datetime(2026, 1, 2, 3, 4) is invalid: Value must be valid JSON.",
        ),
        (  # a foreign key holds its target's key, a number: True is no row (``_value_field`` 2: True was row 1)
            lambda: clean_changes(Bookmark, {"document": True}),
            "testapp.Bookmark.document=True is a bool, and the column holds numbers; pass a number (1 or 0, if you "
            "mean it).",
        ),
        (
            lambda: clean_changes(Gadget, {"label": F("label")}),
            "testapp.Gadget.label=F(label) is an expression; an update writes values, with a version each: "
            "compute the value first (or write expressions with QuerySet.update(), outside safeupdates).",
        ),
        (
            lambda: clean_changes(Gadget, {"count": 2.5}),
            "testapp.Gadget.count=2.5 is not a whole number, and the column holds integers: it would be "
            "truncated. Pass an int (round it yourself if that is what you mean).",
        ),
        (
            lambda: clean_changes(Gadget, {"label": [1]}),
            "testapp.Gadget.label=[1] is a list, and the column holds text: it would be stored as its str(); "
            "pass a str.",
        ),
        (
            lambda: clean_changes(Gadget, {"seen_at": datetime.date(2026, 1, 2)}),
            "testapp.Gadget.seen_at=datetime.date(2026, 1, 2) is a date, and the column holds datetimes while "
            "USE_TZ=True; pass an aware datetime (for example datetime(2026, 1, 2, tzinfo=timezone.utc)).",
        ),
        (  # a repr of 61 characters is cut (``_shown`` 6: cut from 62)
            lambda: clean_changes(Gadget, {"label": "x" * 59}),
            f"testapp.Gadget.label='{'x' * 56}... is invalid: Ensure this value has at most 40 characters (it has 59).",
        ),
    ]
    for call, message in cases:
        with pytest.raises(InvalidUpdate) as excinfo:
            call()
        assert str(excinfo.value) == message


def test_a_field_may_be_named_by_its_attname():
    """``document_id`` names the foreign key ``document``: Django's ``get_field()`` finds an attname too."""
    assert clean_changes(Bookmark, {"document_id": None}) == {"document": None}


def test_a_missing_foreign_key_target_is_refused_with_djangos_own_error():
    """Checked on the database given (``using``), the target's absence raises the error Django's own
    ``ForeignKey.validate()`` raises: its message, code and parameters (a custom message may use them)."""
    field = Specimen._meta.get_field("document")
    with pytest.raises(ValidationError) as django_error:
        field.validate(10**9, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidUpdate) as excinfo:
        clean_changes(Specimen, {"document": 10**9}, using="default")
    assert str(excinfo.value) == f"testapp.Specimen.document=1000000000 is invalid: {django_error.value.messages[0]}"
    assert "document instance with id 1000000000 is not a valid choice" in str(excinfo.value)
    cause = excinfo.value.__cause__
    assert isinstance(cause, ValidationError)
    assert (cause.code, cause.params) == (django_error.value.code, django_error.value.params)


@pytest.mark.parametrize(
    "value",
    [[1], ("a",), {"a": 1}, {"a"}, b"abc", bytearray(b"abc"), True],
    ids=["list", "tuple", "dict", "set", "bytes", "bytearray", "bool"],
)
def test_a_value_that_is_no_text_is_refused_for_a_text_column(update, gadget, value):
    """Django's CharField and TextField store ``str(value)`` of anything: ``"[1]"``, ``"b'abc'"``,
    ``"True"``. A number is text of itself, and stays accepted, as in Django and DRF."""
    kind = type(value).__name__
    with refused(rf"Gadget.label=.* is a {kind}, and the column holds text", gadget):
        update(Gadget, gadget.pk, label=value)
    with pytest.raises(InvalidUpdate, match=rf"testapp.Specimen.text=.* is a {kind}, and the column holds text"):
        clean_changes(Specimen, {"text": value})
    with pytest.raises(InvalidUpdate, match=rf"primary key .* is a {kind}, and the column holds text"):
        clean_pk(Tag, value)


def test_numbers_and_text_of_a_field_of_its_own_stay_accepted_for_a_text_column():
    """A number is text of itself; a field whose own ``to_python()`` takes other values decides for them."""

    class Joined(models.CharField):  # type: ignore[type-arg]
        def to_python(self, value: Any) -> Any:
            return ",".join(value) if isinstance(value, list) else super().to_python(value)

    assert clean_changes(Gadget, {"label": 5, "nickname": Decimal("1.5")}) == {"label": "5", "nickname": "1.5"}
    field = Joined(max_length=20)
    field.set_attributes_from_name("joined")
    field.model = Gadget
    from safeupdates.write.validation import _refuse_before_conversion

    _refuse_before_conversion(field, ["a", "b"], "joined")  # refuses nothing


# ---------------------------------------------------------------------------------------------------------
# Datetimes: the time zone rule of synced_at, for values too


def test_a_naive_datetime_is_refused_under_use_tz(update, gadget):
    with refused(r"Gadget.seen_at=.* is naive while USE_TZ=True; attach a timezone", gadget):
        update(Gadget, gadget.pk, seen_at=datetime.datetime(2026, 1, 2, 3, 4))
    with refused(r"Gadget.seen_at='2026-01-02T03:04' is naive while USE_TZ=True", gadget):
        update(Gadget, gadget.pk, seen_at="2026-01-02T03:04")


def test_a_date_for_a_datetime_is_refused_under_use_tz(update, gadget):
    """Django takes a date as midnight in TIME_ZONE, with a RuntimeWarning: a naive datetime by another
    road."""
    with refused(r"Gadget.seen_at=datetime.date\(2026, 1, 2\) is a date, and the column holds datetimes", gadget):
        update(Gadget, gadget.pk, seen_at=datetime.date(2026, 1, 2))
    with pytest.raises(InvalidUpdate, match="is a date, and the column holds datetimes"):
        clean_pk(Stamp, datetime.date(2026, 1, 2))
    with override_settings(USE_TZ=False):  # no time zone to guess: midnight, as Django takes it
        assert clean_changes(Gadget, {"seen_at": datetime.date(2026, 1, 2)}) == {
            "seen_at": datetime.datetime(2026, 1, 2)
        }


def test_a_nullable_datetime_is_cleared_with_none(gadget):
    gadget.seen_at = datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.UTC)
    gadget.save()
    assert via_update(Gadget, gadget.pk, seen_at=None).applied
    assert row(Gadget, gadget.pk)["seen_at"] is None


def test_an_aware_datetime_is_refused_without_use_tz(update, gadget):
    """SQLite raised a raw ValueError; PostgreSQL stored it converted to the session's time zone."""
    with override_settings(USE_TZ=False), refused(r"Gadget.seen_at=.* is aware while USE_TZ=False", gadget):
        update(Gadget, gadget.pk, seen_at=datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.UTC))


def test_synced_at_is_accepted_up_to_the_clock_skew_and_refusals_say_what_to_do():
    now = datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.UTC)
    skew = datetime.timedelta(minutes=5)  # SAFEUPDATES_MAX_CLOCK_SKEW's default
    assert clean_synced_at(now + skew, now=now) == now + skew
    with pytest.raises(InvalidUpdate) as excinfo:
        clean_synced_at(now + skew + datetime.timedelta(microseconds=1), now=now)
    assert str(excinfo.value) == (
        "synced_at=2026-01-02T03:09:00.000001+00:00 lies more than 0:05:00 in the future; it would freeze the "
        "record. Check the client's clock or raise SAFEUPDATES_MAX_CLOCK_SKEW."
    )
    with pytest.raises(InvalidUpdate) as excinfo:
        clean_synced_at(datetime.datetime(2026, 1, 2, 3, 4), now=now)
    assert str(excinfo.value) == (
        "synced_at=2026-01-02T03:04:00 is naive while USE_TZ=True; attach a timezone "
        "(for example datetime.now(timezone.utc))."
    )


def test_datetimes_of_the_right_kind_are_accepted(gadget):
    aware = datetime.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    assert via_update(Gadget, gadget.pk, seen_at=aware).applied
    assert row(Gadget, gadget.pk)["seen_at"] == aware
    assert via_update(Gadget, gadget.pk, seen_at="2026-02-03T04:05:06Z").applied
    with override_settings(USE_TZ=False):
        assert via_update(Gadget, gadget.pk, seen_at=datetime.datetime(2026, 1, 2, 3, 4)).applied
        assert row(Gadget, gadget.pk)["seen_at"] == datetime.datetime(2026, 1, 2, 3, 4)


@pytest.mark.parametrize("data", [{"k": "a\x00"}, {"a\x00": 1}, [{"k": ["\x00"]}], ("x", {"k": {"j": "\x00"}})])
def test_a_nul_character_anywhere_in_json_is_refused(data):
    """PostgreSQL's jsonb cannot store ``\\u0000`` either: a NUL in a key, a value or an item, at any depth,
    is refused before anything is written (``_has_nul`` 6 looked at a mapping's keys only)."""
    from safeupdates.write.validation import clean_changes
    from tests.testapp.models import Specimen

    with pytest.raises(InvalidUpdate, match=r"^testapp\.Specimen\.data=.* contains a NUL character \(\\x00\)"):
        clean_changes(Specimen, {"data": data})


@pytest.mark.parametrize("version", [0, -1, 2**63, True, 7.0, "7"])
def test_a_version_that_is_no_positive_64_bit_integer_is_refused_with_what_to_do(redis, profile, version):
    """Just outside each limit (0, one past the column's range), a bool and an integral float or text: the
    refusal names the range and what to call, and nothing is written."""
    message = (
        f"version must be a positive integer of at most 9223372036854775807, got {version!r}; allocate one "
        "with safeupdates.versions.next_version()."
    )
    with refused(f"^{re.escape(message)}$", profile):
        Profile.objects.update_if_newer(profile.pk, version=version, active=True)


@pytest.mark.parametrize("version", [1, 2**63 - 1])
def test_a_version_just_inside_the_range_is_clean(version):
    """1 and the largest ``bigint``: whether the version source issued it is asked later, of the database."""
    assert clean_version(version) == version and type(clean_version(version)) is int


def test_a_refusals_quoted_message_is_cut_past_150_characters_and_an_unprintable_one_named():
    """The message of a database's or an encoder's error is quoted in a refusal: whole up to 150
    characters, cut to 150 with "..." past that (Django's Truncator); one that cannot even be printed (it
    quotes an integer past Python's int-to-str limit), named by its type."""

    class HugeValueError(ValueError):
        def __str__(self) -> str:
            return str(10**5000)  # Python refuses to print it: ValueError

    assert short_message(ValueError("x" * 150)) == "x" * 150
    assert short_message(ValueError("y" * 151)) == "y" * 147 + "..."
    assert short_message(HugeValueError()) == (
        "HugeValueError (its message quotes the value, which is too large to print)"
    )
