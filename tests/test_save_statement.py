"""``LockVersionMixin.save()`` runs its own UPDATE or INSERT (``statements.CheckedSave``,
``statements.VersionedInsert``), built once per shape of save, with the values bound as the ORM binds
them: it must store exactly what Django's ``save()`` stores, take its version in the statement, and
refuse what Django's base manager would not match (it runs prepared: ``test_prepared.py``)."""

from __future__ import annotations

import datetime
from typing import Any

import django
import pytest
from django.db import connection, models, transaction
from django.db.models import F, Value
from django.db.models.functions import Lower
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeupdates.database.statements import checked_save
from safeupdates.exceptions import StaleObjectError
from safeupdates.versions import next_version
from tests.testapp.models import Document, Level, PlainSpecimen, Profile, Restaurant, Shade, Shelved, Specimen, Tag

pytestmark = pytest.mark.django_db

FIELDS = [f.attname for f in PlainSpecimen._meta.concrete_fields if not f.primary_key]
#: ``auto_now`` takes the time of each save: compared on its own (it moves), not value for value.
MOVING = {"touched_at"}

#: JSON ``null``, as opposed to SQL NULL: an expression (Django 6.1's ``JSONNull``; before it, a ``Value``).
JSON_NULL = "json null"


def json_null() -> Any:
    null = getattr(models, "JSONNull", None)
    return null() if null is not None else Value(None, models.JSONField())


text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
values = st.fixed_dictionaries(
    {
        "amount": st.decimals(min_value=-(10**7), max_value=10**7, places=4, allow_nan=False, allow_infinity=False),
        "ratio": st.floats(allow_nan=False, allow_infinity=False, width=64),
        "big": st.integers(min_value=-(2**63), max_value=2**63 - 1),
        "text": text,
        "happened_at": st.none() | st.datetimes(timezones=st.just(datetime.UTC)),
        "day": st.none() | st.dates(),
        "at": st.none() | st.times(),
        "took": st.none()
        | st.timedeltas(min_value=datetime.timedelta(days=-9999), max_value=datetime.timedelta(days=9999)),
        "token": st.none() | st.uuids() | st.uuids().map(str) | st.uuids().map(lambda u: u.hex),
        "data": st.none()
        | st.just(JSON_NULL)
        | st.recursive(
            st.none() | st.booleans() | st.integers(-(2**53), 2**53) | text,
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
            max_leaves=6,
        ),
        "blob": st.none() | st.binary(max_size=20),
        "address": st.none() | st.ip_addresses().map(str),
        "with_document": st.booleans(),
        "shade": st.sampled_from([*Shade, *Shade.values]),  # a member, or its value
        "level": st.sampled_from([*Level, *Level.values]),
        "odd": text.map(lambda value: value[:20]),
        "shout": text.map(lambda value: value[:6]),  # upper case may lengthen it ("ß": "SS"), to 18 at most
    }
)


def stored(model: Any, pk: int) -> dict[str, Any]:
    row = model.objects.values(*(name for name in FIELDS if name not in MOVING)).get(pk=pk)
    if row["blob"] is not None:
        row["blob"] = bytes(row["blob"])  # memoryview on PostgreSQL, bytes on SQLite
    return row


def raw(model: Any, pk: int) -> dict[str, Any]:
    """The row's columns as the database driver returns them, no field converting them: SQL NULL and
    JSON null differ here, and so would a value bound in another form (a UUID as text on SQLite)."""
    quote = connection.ops.quote_name
    kept = [name for name in FIELDS if name not in MOVING]
    columns = {f.attname: f.column for f in model._meta.concrete_fields if f.attname in kept}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(quote(column) for column in columns.values())} FROM {quote(model._meta.db_table)}"
            f" WHERE {quote(model._meta.pk.column)} = %s",
            [pk],
        )
        row = cursor.fetchone()
    return {
        name: bytes(value) if isinstance(value, memoryview) else value for name, value in zip(columns, row, strict=True)
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=values, second=values)
def test_a_save_stores_every_kind_of_value_as_djangos_own_save(first: dict[str, Any], second: dict[str, Any]) -> None:
    document = Document.objects.create(title="d")
    plain, ours = PlainSpecimen(), Specimen()
    statements = checked_save.cache_info()
    for change in (first, second):  # the first save inserts, the second updates
        for instance in (plain, ours):
            for name, value in change.items():
                if name == "with_document":
                    instance.document = document if value else None
                elif value is JSON_NULL:
                    instance.data = json_null()
                else:
                    setattr(instance, name, value)
            before = instance.touched_at
            instance.save()
            assert instance.touched_at is not None and (before is None or instance.touched_at >= before)
        assert raw(Specimen, ours.pk) == raw(PlainSpecimen, plain.pk)
        assert stored(Specimen, ours.pk) == stored(PlainSpecimen, plain.pk)
        saved = Specimen.objects.get(pk=ours.pk)
        assert saved.lock_version == ours.lock_version
        assert saved.touched_at == ours.touched_at  # auto_now: the value the instance took is the one stored
    now = checked_save.cache_info()
    # The update ran a CheckedSave (an expression, JSON null, takes the ORM's path).
    assert now.hits + now.misses == statements.hits + statements.misses + (second["data"] is not JSON_NULL)


def test_a_save_with_update_fields_merges_the_versions_and_returns_them() -> None:
    ours = Specimen.objects.create(text="a")
    first = ours.lock_version
    ours.text, ours.big = "b", 7
    ours.save(update_fields=["text"])
    row = Specimen.objects.get(pk=ours.pk)
    assert (row.text, row.big) == ("b", 0)
    assert ours.lock_version > first and row.lock_version == ours.lock_version
    assert ours.field_versions == row.field_versions == {"*": first, "text": ours.lock_version}


def test_expressions_take_the_orms_path_with_the_same_check() -> None:
    ours = Specimen.objects.create(big=1, text="a")
    stale = Specimen.objects.get(pk=ours.pk)
    ours.big, ours.text = F("big") + 41, Value("b")
    ours.save()
    ours.refresh_from_db()
    assert (ours.big, ours.text) == (42, "b")
    stale.big = F("big") + 1
    with pytest.raises(StaleObjectError):
        stale.save()
    ours.lock_version, ours.big = None, F("big") + 1  # no row carries lock_version None
    with pytest.raises(StaleObjectError):
        ours.save()
    assert Specimen.objects.get(pk=ours.pk).big == 42


@pytest.mark.skipif(django.VERSION < (6, 0), reason="Django 6.0 returns an expression's value from the UPDATE")
@pytest.mark.parametrize("update_fields", [None, ["score"]], ids=["whole", "update_fields"])
def test_an_expressions_value_comes_back_from_the_save_itself_as_djangos_does(update_fields: Any) -> None:
    """Django 6 asks the UPDATE to return what an expression stored; the checked save returns it after
    its versions, so the instance holds the value with no query more (else Django defers the field)."""
    profile = Profile.objects.create(name="p", score=1)
    profile.score = F("score") + 1
    profile.save(update_fields=update_fields)
    with CaptureQueriesContext(connection) as after:
        assert profile.score == 2
    assert after.captured_queries == []


def test_a_whole_save_with_an_expression_writes_every_field_at_its_version() -> None:
    """The ORM's path of a save of the whole row leaves ``{"*": version}``, as CheckedSave does: a
    field's older entry of its own must not stay below the save's version (a mutation survivor: merging
    the entries into the map instead went unnoticed), or an older request wins the field after it."""
    profile = Profile.objects.create(name="p", score=1)
    assert Profile.objects.update_if_newer(profile.pk, version=next_version(), active=True).applied
    between = next_version()  # newer than the field's own entry, older than the save
    profile.refresh_from_db()
    profile.score = F("score") + 1
    profile.save()
    row = Profile.objects.get(pk=profile.pk)
    assert (row.score, row.field_versions) == (2, {"*": row.lock_version})
    assert Profile.objects.update_if_newer(profile.pk, version=between, active=False).outcome == "stale"
    assert Profile.objects.get(pk=profile.pk).active is True


def test_a_row_the_base_manager_hides_is_not_written() -> None:
    """Django's save() matches only rows its base manager returns; so does the checked save."""
    book = Shelved.objects.create(title="a")
    Shelved.objects.filter(pk=book.pk).update(shelved=True)
    book.title = "b"
    with pytest.raises(StaleObjectError), transaction.atomic():
        book.save()
    assert Shelved.objects.get(pk=book.pk).title == "a"
    visible = Shelved.objects.create(title="c")
    visible.title = "d"
    visible.save()
    assert Shelved.objects.get(pk=visible.pk).title == "d"


def test_logged_queries_show_the_save_with_its_values() -> None:
    profile = Profile.objects.create(name="p")
    profile.name = "logged-name"
    with CaptureQueriesContext(connection) as queries:
        profile.save()
    [statement] = [q["sql"] for q in queries.captured_queries if "logged-name" in q["sql"]]
    assert "UPDATE" in statement and '"lock_version" = ' in statement


def test_a_save_of_a_row_with_a_text_primary_key_is_checked() -> None:
    tag = Tag.objects.create(code="a b/ü'", label="x")
    stale = Tag.objects.get(pk="a b/ü'")
    tag.label = "y"
    tag.save()
    stale.label = "z"
    with pytest.raises(StaleObjectError), transaction.atomic():
        stale.save()
    assert Tag.objects.get(pk="a b/ü'").label == "y"


def test_a_create_takes_its_version_in_its_insert(postgres_only: None) -> None:
    """One statement, as Django's own create(): the version comes from the sequence inside the INSERT."""
    before = next_version()
    with CaptureQueriesContext(connection) as queries:
        profile = Profile.objects.create(name="new")
    statements = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert len(statements) == 1 and statements[0].startswith("WITH safeupdates_save")
    row = Profile.objects.get(pk=profile.pk)
    assert profile.lock_version == row.lock_version > before
    assert profile.field_versions == row.field_versions == {"*": profile.lock_version}
    assert profile.pk is not None and not profile._state.adding


def test_a_create_with_values_that_need_the_compiler_takes_a_version_first() -> None:
    specimen = Specimen.objects.create(text=Lower(Value("ABC")), big=7)
    row = Specimen.objects.get(pk=specimen.pk)
    assert (row.text, row.big) == ("abc", 7)
    assert specimen.lock_version == row.lock_version > 0 and row.field_versions == {"*": row.lock_version}


def test_a_created_child_of_multi_table_inheritance_has_its_versions() -> None:
    restaurant = Restaurant.objects.create(name="r", seats=3)
    row = Restaurant.objects.get(pk=restaurant.pk)
    assert (row.name, row.seats) == ("r", 3)
    assert restaurant.lock_version == row.lock_version > 0 and row.field_versions == {"*": row.lock_version}
    stale = Restaurant.objects.get(pk=restaurant.pk)
    restaurant.seats = 4
    restaurant.save()
    stale.seats = 5
    with pytest.raises(StaleObjectError), transaction.atomic():
        stale.save()
    assert Restaurant.objects.get(pk=restaurant.pk).seats == 4


def test_a_created_row_supersedes_requests_allocated_before_it() -> None:
    """Re-created under a primary key of its own, a row carries a fresh version for every field."""
    older = next_version()
    Tag.objects.create(code="t", label="new")
    result = Tag.objects.update_if_newer("t", version=older, label="from an older request")
    assert not result.applied and Tag.objects.get(pk="t").label == "new"
