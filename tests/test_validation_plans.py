"""The plans of validation (what each field checks, found once per model and field) keep every check.

``clean_changes()``, ``clean_pk()`` and ``check_saved()`` keep, per model, what they check for each field
(:class:`safeupdates.write.validation._Plan`). These tests hold that a plan belongs to its model (two
models with a field of the same name and other rules each keep theirs), that a refusal is never kept,
that the fast path of a plain bool, int or str refuses what the full path refuses, and that what can
change between calls (the validators' list, a foreign key's target, the database) is asked each time.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.validators import MaxValueValidator, MinLengthValidator
from django.db import models
from django.test.utils import isolate_apps
from hypothesis import given, settings
from hypothesis import strategies as st

from safeupdates.exceptions import InvalidUpdate
from safeupdates.write import validation
from safeupdates.write.validation import check_saved, clean_changes, clean_pk
from tests.testapp.models import Bookmark, Document, Specimen


class Absolute(models.IntegerField):  # type: ignore[type-arg]
    """An integer field that converts values its own way (to their absolute value): no fast path for it."""

    def to_python(self, value: Any) -> Any:
        value = super().to_python(value)
        return None if value is None else abs(value)


@pytest.fixture
def two_models() -> Any:
    """Two models (no tables: validation needs none) with fields of the same names and other rules."""
    with isolate_apps("tests.testapp"):

        class Strict(models.Model):
            score = models.IntegerField(validators=[MaxValueValidator(10)])
            name = models.CharField(max_length=3, validators=[MinLengthValidator(2)])
            small = models.SmallIntegerField(default=0)
            absolute = Absolute(default=0)

            class Meta:
                app_label = "testapp"

            def __str__(self) -> str:
                return self.name

        class Loose(models.Model):
            score = models.IntegerField()
            name = models.CharField(max_length=30)
            small = models.BigIntegerField(default=0)
            absolute = models.IntegerField(default=0)

            class Meta:
                app_label = "testapp"

            def __str__(self) -> str:
                return self.name

        yield Strict, Loose


def test_plans_are_per_model(two_models: Any) -> None:
    strict, loose = two_models
    for _ in range(3):  # the first call makes the plans, the next ones use them; in turns
        with pytest.raises(InvalidUpdate, match=r"testapp\.Strict\.score=11 is invalid"):
            clean_changes(strict, {"score": 11})
        assert clean_changes(loose, {"score": 11}) == {"score": 11}
        with pytest.raises(InvalidUpdate, match=r"testapp\.Strict\.name='abcd' is invalid"):
            clean_changes(strict, {"name": "abcd"})
        with pytest.raises(InvalidUpdate, match=r"testapp\.Strict\.name='a' is invalid"):
            clean_changes(strict, {"name": "a"})
        assert clean_changes(loose, {"name": "abcd"}) == {"name": "abcd"}
        with pytest.raises(InvalidUpdate, match=r"testapp\.Strict\.small=40000 is out of range"):
            clean_changes(strict, {"small": 40000})
        assert clean_changes(loose, {"small": 40000}) == {"small": 40000}
        assert clean_changes(strict, {"absolute": -4}) == {"absolute": 4}  # its own to_python(), every time
        assert clean_changes(loose, {"absolute": -4}) == {"absolute": -4}


def test_save_plans_are_per_model(two_models: Any) -> None:
    strict, loose = two_models
    for _ in range(3):
        with pytest.raises(InvalidUpdate, match=r"testapp\.Strict\.name='abcd' has 4 characters"):
            check_saved(strict(score=1, name="abcd"), None)
        assert check_saved(loose(score=1, name="abcd"), None) is False
        with pytest.raises(InvalidUpdate, match=r"testapp\.Strict\.small=40000 is out of range"):
            check_saved(strict(score=1, name="ab", small=40000), None)
        assert check_saved(loose(score=1, name="ab", small=40000), None) is False
        # A NOT NULL column left None may still be filled in by a pre_save receiver: unsure, not refused.
        assert check_saved(strict(score=None, name="ab"), None) is True
        assert check_saved(strict(score=None, name="ab"), ("name",)) is False


def test_a_refusal_is_not_kept(two_models: Any) -> None:
    strict, _loose = two_models
    for _ in range(2):
        with pytest.raises(InvalidUpdate, match="has no field 'nope'"):
            clean_changes(strict, {"nope": 1})
        with pytest.raises(InvalidUpdate, match="managed by safeupdates"):
            clean_changes(strict, {"lock_version": 1})
    assert "nope" not in validation._plans.get(strict, {})
    assert clean_changes(strict, {"score": 1}) == {"score": 1}


def test_the_fast_path_refuses_what_the_full_path_refuses() -> None:
    """A plain str, int or bool, each a value the field's to_python() returns as it is, still meets the
    checks of its column and of its field (choices, validators), from the second call on too."""
    for _ in range(2):
        with pytest.raises(InvalidUpdate, match=r"contains a NUL character"):
            clean_changes(Specimen, {"text": "a\x00b"})
        with pytest.raises(InvalidUpdate, match=r"lone surrogate"):
            clean_changes(Specimen, {"text": "a\ud800b"})
        with pytest.raises(InvalidUpdate, match=r"Specimen\.shade='purple' is invalid"):
            clean_changes(Specimen, {"shade": "purple"})
        with pytest.raises(InvalidUpdate, match=r"Specimen\.level=3 is invalid"):
            clean_changes(Specimen, {"level": 3})
        with pytest.raises(InvalidUpdate, match=r"Specimen\.big=9223372036854775808 is out of range"):
            clean_changes(Specimen, {"big": 2**63})
        with pytest.raises(InvalidUpdate, match=r"is a bool, and the column holds numbers"):
            clean_changes(Specimen, {"big": True})
        with pytest.raises(InvalidUpdate, match=r"Specimen\.text=True is a bool, and the column holds text"):
            clean_changes(Specimen, {"text": True})
        with pytest.raises(InvalidUpdate, match=r"Document: primary key 9223372036854775808 is out of range"):
            clean_pk(Document, 2**63)
        with pytest.raises(InvalidUpdate, match=r"Document: primary key True is a bool"):
            clean_pk(Document, True)
        with pytest.raises(InvalidUpdate, match=r"Document: primary key 2\.5 is not a whole number"):
            clean_pk(Document, 2.5)
        assert clean_pk(Document, 7) == 7
        assert clean_pk(Document, "7") == 7
        assert clean_changes(Specimen, {"shade": "dark", "level": 2, "big": 5}) == {
            "shade": "dark",
            "level": 2,
            "big": 5,
        }


def test_validators_are_asked_on_every_call(two_models: Any) -> None:
    """The plan keeps the field, not its validators: a validator added later is run."""
    _strict, loose = two_models
    assert clean_changes(loose, {"score": 11}) == {"score": 11}
    field = loose._meta.get_field("score")
    field.validators.append(MaxValueValidator(10))
    try:
        with pytest.raises(InvalidUpdate, match=r"testapp\.Loose\.score=11 is invalid"):
            clean_changes(loose, {"score": 11})
    finally:
        field.validators.pop()


@pytest.mark.django_db
def test_a_foreign_key_target_is_looked_up_on_every_call() -> None:
    """The plan of a foreign key keeps no answer: a target deleted after a first call is refused, and
    each call asks the database it is given."""
    document = Document.objects.create(title="kept")
    assert clean_changes(Bookmark, {"document": document.pk}, using="default") == {"document": document.pk}
    pk = document.pk
    document.delete()
    with pytest.raises(InvalidUpdate, match=r"Bookmark\.document=.* is invalid"):
        clean_changes(Bookmark, {"document": pk}, using="default")
    with pytest.raises(Exception, match="nowhere"):
        # A database that does not exist is asked, not answered from the plan.
        clean_changes(Bookmark, {"document": pk}, using="nowhere")


def test_the_versions_model_is_kept_per_model() -> None:
    """``versions_model()`` (asked by every save) keeps one answer per model: a proxy's, a multi-table
    child's and a parent's each their own, in any order; a model without versions is never answered."""
    from django.core.exceptions import FieldDoesNotExist

    from safeupdates.database.registry import versions_model
    from safeupdates.write.mixins import _version_fields
    from tests.testapp.models import ActiveOnlyProfile, Place, Profile, Restaurant, Truck, Van

    for _ in range(2):
        assert versions_model(Restaurant) is Place
        assert versions_model(Place) is Place
        assert versions_model(ActiveOnlyProfile) is Profile
        assert versions_model(Truck) is Truck
        with pytest.raises(FieldDoesNotExist):
            versions_model(Van)
        assert [f.model for f in _version_fields(Restaurant)] == [Place, Place]
        assert [f.model for f in _version_fields(Truck)] == [Truck, Truck]


class Upper(models.CharField):  # type: ignore[type-arg]
    """A text field whose ``to_python()`` upper-cases text and fails its own way (AttributeError) on the rest."""

    def to_python(self, value: Any) -> Any:
        return value.upper()


@settings(max_examples=30, deadline=None)
@given(value=st.one_of(st.integers(), st.floats(allow_nan=False), st.lists(st.integers(), max_size=3)))
def test_what_a_field_raises_is_refused_alike_everywhere(value: Any) -> None:
    """Whatever a field's conversion raises (here an AttributeError), clean_changes(), clean_pk() and
    check_saved() refuse the value with one translation: an InvalidUpdate with the field's reason."""
    with isolate_apps("tests.testapp"):

        class Odd(models.Model):
            code = Upper(max_length=10, primary_key=True)
            name = Upper(max_length=10)

            class Meta:
                app_label = "testapp"

            def __str__(self) -> str:
                return self.name

    reason = f"{type(value).__name__!r} object has no attribute 'upper'"
    shown = validation.shown(value)
    with pytest.raises(InvalidUpdate) as refused:
        clean_changes(Odd, {"name": value})
    assert str(refused.value) == f"testapp.Odd.name={shown} is invalid: {reason}"
    assert (refused.value.field, refused.value.reason) == ("name", f"is invalid: {reason}")
    with pytest.raises(InvalidUpdate) as refused:
        check_saved(Odd(code="A", name=value), None)
    assert str(refused.value) == f"testapp.Odd.name={shown} is invalid: {reason}"
    with pytest.raises(InvalidUpdate) as refused:
        clean_pk(Odd, value)
    assert str(refused.value) == f"testapp.Odd: invalid primary key {shown}: {reason}"
