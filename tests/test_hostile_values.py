"""Hostile values: every entry point either writes a value that reads back as it was given, or raises
``InvalidUpdate`` naming the field before any statement runs, and the caller's transaction goes on.

The defects of issue 46 (item 1) first, each a plain test; the property test over every field of
:class:`~tests.testapp.models.Everything` follows.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import transaction

from safeupdates import enqueue_update
from safeupdates.exceptions import InvalidUpdate
from safeupdates.jobs import apply_update
from safeupdates.models import ProcessedRequest
from safeupdates.refusals import REFUSED_VALUE
from safeupdates.versions import next_version
from tests.testapp.models import Document, Everything, Point

pytestmark = pytest.mark.django_db


def stored(pk: Any) -> dict[str, Any]:
    values = Everything._base_manager.filter(pk=pk).values().get()
    values.pop("lock_version"), values.pop("field_versions")
    return values


def write_paths(model: Any) -> dict[str, Callable[..., None]]:
    """Each way a value reaches a row of ``model``, as ``path(pk, **changes)``: the guarded writes, the job
    of ``enqueue_update()`` (run as the worker runs it, in the test's transaction) and the checked save."""

    def via_update(pk: Any, **changes: Any) -> None:
        model.objects.update_if_newer(pk, version=next_version(), **changes)

    def via_recorded_update(pk: Any, **changes: Any) -> None:
        model.objects.update_if_newer(pk, version=next_version(), request_id=uuid.uuid4(), **changes)

    def via_timestamp(pk: Any, **changes: Any) -> None:
        from django.utils import timezone

        model.objects.update_if_newer(pk, synced_at=timezone.now(), request_id=uuid.uuid4(), **changes)

    def via_bulk(pk: Any, **changes: Any) -> None:
        model.objects.bulk_update_if_newer([(pk, next_version(), changes)])

    def via_enqueue(pk: Any, **changes: Any) -> None:
        request = enqueue_update(model, pk, **changes)
        apply_update(str(request.request_id))  # as the worker does, in this test's transaction
        request.refresh_from_db()
        assert request.status == "applied", request.error

    def via_save(pk: Any, **changes: Any) -> None:
        instance = model.objects.get(pk=pk)
        for name, value in changes.items():
            setattr(instance, name, value)
        instance.save()

    return {
        "update_if_newer": via_update,
        "update_if_newer(request_id=)": via_recorded_update,
        "update_if_newer(synced_at=)": via_timestamp,
        "bulk_update_if_newer": via_bulk,
        "enqueue_update": via_enqueue,
        "save": via_save,
    }


ENTRY_POINTS = write_paths(Everything)
via_save = ENTRY_POINTS["save"]


@pytest.fixture(params=list(ENTRY_POINTS))
def entry(request: pytest.FixtureRequest) -> Callable[..., None]:
    return ENTRY_POINTS[request.param]


@contextmanager
def refused(pk: Any, match: str) -> Iterator[None]:
    """Expect InvalidUpdate matching ``match`` inside the caller's transaction; then check that nothing was
    written and that the caller's transaction still takes a write."""
    before, logged = stored(pk), ProcessedRequest.objects.count()
    with transaction.atomic():
        with pytest.raises(InvalidUpdate, match=match):
            yield
        # The caller's next, unrelated write succeeds: its transaction was not broken.
        Document.objects.create(title="after")
    assert stored(pk) == before
    assert ProcessedRequest.objects.count() == logged


@pytest.fixture
def pk() -> Any:
    return Everything.objects.create().pk


def nested(depth: int, inner: Any) -> Any:
    value = inner
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [
        {"a": [1, {"b": float("nan")}]},
        {"a": [float("inf")]},
        [float("-inf")],
        {"a": "\ud800"},
        {"\udfff": 1},
        {"a": 10 ** (sys.get_int_max_str_digits() + 1)},
        {"a": ["x\x00"]},
        {"\x00": 1},
        nested(100_000, 1),
    ],
    ids=["nan", "inf", "-inf", "surrogate", "surrogate key", "huge int", "nul", "nul key", "deep"],
)
def test_a_json_value_that_cannot_be_stored_is_refused(entry, pk, value):
    with refused(pk, r"Everything\.data"):
        entry(pk, data=value)


@pytest.mark.parametrize("name", ["name", "text", "slug", "email", "url", "file"])
def test_a_lone_surrogate_in_text_is_refused(entry, pk, name):
    with refused(pk, rf"Everything\.{name}.*surrogate"):
        entry(pk, **{name: "a\ud800"})


def test_a_huge_int_in_a_number_field_is_refused_with_a_message(entry, pk):
    with refused(pk, r"Everything\.count.*out of range"):
        entry(pk, count=10 ** (sys.get_int_max_str_digits() + 1))


def test_a_file_name_longer_than_its_column_is_refused(entry, pk):
    with refused(pk, r"Everything\.file"):
        entry(pk, file="x" * 51)


def test_an_aware_time_is_refused(entry, pk):
    import datetime

    with refused(pk, r"Everything\.at"):
        entry(pk, at=datetime.time(12, tzinfo=datetime.UTC))


def test_a_datetime_out_of_range_in_utc_is_refused(entry, pk):
    import datetime

    far = datetime.datetime(1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=5)))
    with refused(pk, r"Everything\.happened_at"):
        entry(pk, happened_at=far)


def test_a_duration_beyond_a_bigint_of_microseconds_is_refused(entry, pk):
    import datetime

    with refused(pk, r"Everything\.took"):
        entry(pk, took=datetime.timedelta(days=999_999_999))


@pytest.mark.parametrize(
    ("name", "value", "back"),
    [
        ("blob", b"\x00\xff bytes", b"\x00\xff bytes"),
        ("blob", memoryview(b"\x01"), b"\x01"),
        ("spot", Point(3, 4), Point(3, 4)),
        ("file", "everything/a.txt", "everything/a.txt"),
    ],
    ids=["bytes", "memoryview", "custom", "file name"],
)
def test_a_value_json_cannot_encode_is_recorded_and_written(entry, pk, name, value, back):
    entry(pk, **{name: value})
    got = getattr(Everything.objects.get(pk=pk), name)
    assert (bytes(got) if isinstance(got, memoryview) else got) == back


# -- the HTTP surfaces: a client's JSON, as json.loads() makes it, is a 400, never a 500 --------------------

HOSTILE_BODIES = {
    "nan in json": '{"data": {"a": [NaN]}}',
    "infinity in json": '{"data": Infinity}',
    "surrogate in text": '{"name": "\\ud800"}',
    "surrogate in a json key": '{"data": {"\\udfff": 1}}',
    "nul in json": '{"data": ["\\u0000"]}',
    "nul in text": '{"text": "a\\u0000"}',
    "huge count": '{"count": 2147483648}',
}


@pytest.mark.urls("tests.http_urls")
@pytest.mark.parametrize("body", list(HOSTILE_BODIES.values()), ids=list(HOSTILE_BODIES))
@pytest.mark.parametrize("url", ["/everything/{}/", "/cbv-everything/{}/"], ids=["conditional", "ConditionalMixin"])
def test_a_hostile_json_body_is_a_400_with_a_json_error(client, pk, url, body):
    before = stored(pk)
    with transaction.atomic():
        response = client.put(url.format(pk), body, content_type="application/json")
        Document.objects.create(title="after")  # the caller's transaction goes on
    assert response.status_code == 400, response.content
    # The views declare no conflict_fields: the 400 names no field and quotes no value (tests/test_http_refused.py).
    assert response.json() == {"detail": REFUSED_VALUE}
    assert stored(pk) == before


DRF_BODIES = {k: v for k, v in HOSTILE_BODIES.items() if "nan" not in k and "infinity" not in k and k != "nul in text"}


@pytest.mark.urls("tests.drf_urls")
@pytest.mark.parametrize("body", list(DRF_BODIES.values()), ids=list(DRF_BODIES))
@pytest.mark.parametrize("method", ["patch", "post"])
def test_a_hostile_json_body_is_a_400_with_a_json_error_in_drf(client, pk, method, body):
    before, count = stored(pk), Everything.objects.count()
    url = f"/everything/{pk}/" if method == "patch" else "/everything/"
    with transaction.atomic():
        response = getattr(client, method)(url, body, content_type="application/json")
        Document.objects.create(title="after")
    assert response.status_code == 400, response.content
    assert response.json()
    assert stored(pk) == before
    assert Everything.objects.count() == count


@pytest.mark.parametrize(
    ("field", "posted"),
    [
        ("data", '{"a": NaN}'),
        ("data", '["\\ud800"]'),
        ("data", '{"a": "\\u0000"}'),
        ("data", "[" * 200 + "]" * 200),
    ],
    ids=["nan", "surrogate", "nul", "deep"],
)
def test_a_form_refuses_a_value_no_column_can_hold_as_a_field_error(pk, field, posted):
    from django import forms as django_forms

    from safeupdates.forms import TOKEN_FIELD, SafeUpdateModelForm

    class EverythingForm(SafeUpdateModelForm):
        class Meta:
            model = Everything
            fields = ["name", "data"]

        data = django_forms.JSONField(required=False)

    record = Everything.objects.get(pk=pk)
    token = EverythingForm(instance=record).initial[TOKEN_FIELD]
    form = EverythingForm({"name": "x", field: posted, TOKEN_FIELD: token}, instance=record)
    assert not form.is_valid()
    assert field in form.errors, form.errors


@pytest.mark.parametrize(("name", "value"), [("small", -(2**15)), ("count", -(2**31)), ("big", -(2**63))])
def test_the_least_integer_of_a_column_is_written(entry, pk, name, value):
    """PostgreSQL reads ``-32768::smallint`` as ``-(32768::smallint)``, out of range: a client-side bound
    parameter (Django's default binding) must be cast in parentheses."""
    entry(pk, **{name: value})
    assert stored(pk)[name] == value


@pytest.mark.parametrize(("name", "value"), [("took", ""), ("took", "1 day"), ("blob", "AAAA"), ("blob", "")])
def test_save_refuses_a_value_its_field_would_pass_on_unconverted(pk, name, value):
    """Django's save converts neither: the text would reach the database as it is (PostgreSQL parses an
    interval its own way, or refuses it; psycopg refuses a text for bytea)."""
    with refused(pk, rf"Everything\.{name}="):
        via_save(pk, **{name: value})


def test_a_save_of_none_for_a_not_null_column_leaves_the_callers_transaction_usable(pk):
    """A pre_save receiver may fill it in, so it is not refused up front: the save runs in a savepoint,
    and the database's IntegrityError leaves the caller's transaction as it was."""
    from django.db import IntegrityError

    before = stored(pk)
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            via_save(pk, amount=None)
        Document.objects.create(title="after")
    assert stored(pk) == before


def test_a_pre_save_receiver_may_fill_in_a_not_null_column(pk):
    from decimal import Decimal

    from django.db.models.signals import pre_save

    def fill(sender: Any, instance: Everything, **kwargs: Any) -> None:
        instance.amount = Decimal("1.5") if instance.amount is None else instance.amount

    pre_save.connect(fill, sender=Everything)
    try:
        via_save(pk, amount=None)
    finally:
        pre_save.disconnect(fill, sender=Everything)
    assert stored(pk)["amount"] == Decimal("1.5")


def test_json_nested_to_the_limit_is_written_and_one_deeper_is_refused(entry, pk):
    from safeupdates.write.validation import MAX_JSON_DEPTH

    entry(pk, data=nested(MAX_JSON_DEPTH - 1, {"a": 1}))  # 99 lists around an object: 100 levels
    assert Everything.objects.get(pk=pk).data == nested(MAX_JSON_DEPTH - 1, {"a": 1})
    with refused(pk, rf"Everything\.data.*at most {MAX_JSON_DEPTH} levels"):
        entry(pk, data=nested(MAX_JSON_DEPTH, {"a": 1}))


def test_json_at_the_limit_with_more_brackets_than_levels_is_written(entry, pk):
    """The brackets are counted first (a cheap bound on the depth): a value of 100 levels with siblings
    has more than 100 of them, and its depth decides, at the limit itself."""
    from safeupdates.write.validation import MAX_JSON_DEPTH

    value = [nested(MAX_JSON_DEPTH - 2, {"a": 1}), [], {}]  # 1 + 98 lists + an object: 100 levels
    entry(pk, data=value)
    assert Everything.objects.get(pk=pk).data == value
    with refused(pk, rf"Everything\.data.*at most {MAX_JSON_DEPTH} levels"):
        entry(pk, data=[nested(MAX_JSON_DEPTH - 1, {"a": 1}), [], {}])
