"""Validation of update arguments: field names, values, versions, timestamps and request ids.

Everything here raises :class:`~safeupdates.exceptions.InvalidUpdate` before anything is written.
"""

from __future__ import annotations

import functools
import json
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation, localcontext
from typing import TYPE_CHECKING, Any, NoReturn

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.core.validators import MaxLengthValidator
from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models.fields.files import FieldFile
from django.utils import timezone
from django.utils.text import Truncator

from safeupdates import conf
from safeupdates.database.internals import in_storage, range_bounds
from safeupdates.database.registry import request_log
from safeupdates.exceptions import InvalidUpdate
from safeupdates.versions import MAX_VERSION
from safeupdates.write.recording import is_array, is_custom, is_range, needs_text_form, value_field, written_out
from safeupdates.write.recording import recorded_changes as recorded_changes  # imported from here too

if TYPE_CHECKING:
    from safeupdates.models import ProcessedRequest

#: Fields that only safeupdates itself writes.
MANAGED_FIELDS = frozenset({"lock_version", "field_versions", "last_synced_at"})


def writable_field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    """Return the concrete, non-primary-key field ``name`` (or its attname) of ``model``."""
    label = model._meta.label
    if name == "pk":
        raise InvalidUpdate(f"{label}: the primary key cannot be updated; pass it as the first argument.")
    if name in MANAGED_FIELDS:
        raise InvalidUpdate(f"{label}.{name} is managed by safeupdates and cannot be set by an update.")
    found: Any
    try:
        found = model._meta.get_field(name)
    except FieldDoesNotExist:
        found = next((f for f in model._meta.concrete_fields if f.attname == name), None)
        if found is None:
            choices = ", ".join(
                sorted(
                    f.name for f in model._meta.concrete_fields if not f.primary_key and f.name not in MANAGED_FIELDS
                )
            )
            message = f"{label} has no field {shown(name)}; fields that can be updated: {choices}."
            raise InvalidUpdate(message) from None
    if not isinstance(found, models.Field) or not found.concrete or found.many_to_many or found.one_to_many:
        raise InvalidUpdate(f"{label}.{name} is not a concrete column and cannot be updated.")
    field: models.Field[Any, Any] = found
    if field.primary_key:
        raise InvalidUpdate(f"{label}.{name} is the primary key and cannot be updated.")
    if field.name in MANAGED_FIELDS:
        raise InvalidUpdate(f"{label}.{name} is managed by safeupdates and cannot be set by an update.")
    return field


def clean_changes(
    model: type[models.Model],
    changes: Mapping[str, Any],
    *,
    allowed: Iterable[str] | None = None,
    using: str | None = None,
) -> dict[str, Any]:
    """Validate ``changes`` against the model's fields; return ``{field name: python value}``.

    ``allowed`` restricts the field names (the job path passes ``safe_update_fields``). Values go through
    the field's ``clean()``, and more is refused: an expression (``F()``, anything with
    ``resolve_expression``), a bool for a number column, a fraction for an integer column (never
    truncated; ``3.0`` is ``3``), an integer outside the column's portable range (PostgreSQL's, on
    SQLite too), NaN and infinity, a NUL character in text, a value that is no text (a list, bytes, a
    bool) for a column Django's CharField or TextField converts by ``str()``, a naive datetime (or a
    date) under ``USE_TZ`` and an aware one without it (the rule of ``synced_at``). None is accepted for
    any ``null=True`` field.

    ``using`` is the database the changes will be written to: a foreign key's target must exist there
    (Django's own check asks ``router.db_for_read()``, which may be a lagging replica or another
    tenant's database); without it, Django's check runs as it is.
    """
    if not changes:
        raise InvalidUpdate(f"{model._meta.label}: an update needs at least one field=value change.")
    allowed_names = None if allowed is None else frozenset(allowed)
    plans = _plans.get(model)
    if plans is None:
        plans = _plans[model] = {}
    cleaned: dict[str, Any] = {}
    for name, value in changes.items():
        plan = plans.get(name)
        if plan is None:  # a refusal is not kept: it is raised again on every call
            plan = plans[name] = _Plan(model, writable_field(model, name))
        field = plan.field
        if allowed_names is not None and field.name not in allowed_names:
            label = model._meta.label
            raise InvalidUpdate(
                f"{label}.{field.name} is not in {label}.safe_update_fields "
                f"{tuple(sorted(allowed_names))}; add it there to let queued jobs change it."
            )
        if field.name in cleaned:
            raise InvalidUpdate(f"{model._meta.label}.{field.name} is given twice.")
        try:
            cleaned[field.name] = _clean_value(plan, value, using)
        except InvalidUpdate as exc:
            exc.located(model._meta.label, field.name, str(_Named(plan.prefix, value)))  # for a surface to tell
            raise
    return cleaned


class _Plan:
    """How one field of one model is checked, found once per model: the prefixes of its refusals, the
    check of :func:`storable` (less a custom field's reading back unless ``recorded``), how it validates,
    ``fast`` (:func:`_fast_type`), and for :func:`check_saved` what Django's save passes on unconverted,
    a CharField's ``max_length`` and whether None may fail the save (a NOT NULL column)."""

    __slots__ = (
        *("check", "fast", "field", "file", "invalid", "max_length", "prefix", "required", "unconverted"),
        "validation",
    )

    def __init__(
        self, model: type[models.Model], field: models.Field[Any, Any], *, recorded: bool = True, pk: bool = False
    ) -> None:
        label = model._meta.label
        self.field = field
        self.prefix = f"{label}: primary key " if pk else f"{label}.{field.name}="
        self.invalid = (f"{label}: invalid primary key ", ": ") if pk else (self.prefix, " is invalid: ")
        self.check = _checker(field, recorded=recorded)
        self.file = isinstance(field, models.FileField)
        self.unconverted = _PASSED_ON_UNCONVERTED.get(field.get_internal_type())
        self.fast = None if self.unconverted is not None or self.file else _fast_type(field)
        self.max_length = field.max_length if isinstance(field, models.CharField) else None
        self.required = not field.null and type(field).pre_save is models.Field.pre_save and not field.is_relation
        if pk:
            self.validation = _UNVALIDATED
        elif isinstance(field, models.ForeignKey):
            self.validation = _FOREIGN_KEY
        elif isinstance(field, models.JSONField) and type(field).validate is models.JSONField.validate:
            self.validation = _JSON
        else:
            self.validation = _VALIDATE


_VALIDATE, _FOREIGN_KEY, _JSON, _UNVALIDATED = range(4)
#: The plans of clean_changes(), by model and by the name given (a field's name or attname).
_plans: dict[type[models.Model], dict[str, _Plan]] = {}


def _fast_type(field: models.Field[Any, Any]) -> type | None:
    """The type whose values ``field``'s ``to_python()`` returns as they are and only :func:`storable`
    can refuse (a NUL character aside, checked first): a bool for a BooleanField, an int for an integer
    column, a str for Django's CharField and TextField; None for the others."""
    if field.is_relation or is_custom(field):
        return None
    to_python = type(field).to_python
    if to_python is models.BooleanField.to_python:
        return bool
    if to_python is models.IntegerField.to_python and isinstance(field, models.IntegerField):
        return int
    if to_python in _TEXT_BY_STR:
        return str
    return None


def _clean_value(plan: _Plan, value: Any, using: str | None = None) -> Any:
    """Return ``value`` converted by the field of ``plan``, or raise InvalidUpdate naming it.

    Beyond ``field.clean()``: refused when converting would change it (a fraction for an integer
    column), the column or the request log's JSON cannot hold it, or it is an expression. None is
    accepted where ``null=True``. A value of the plan's ``fast`` type skips the conversion and the
    checks around it (but a NUL character's).
    """
    field = plan.field
    what = _Named(plan.prefix, value)
    fast = type(value) is plan.fast
    if not fast:
        _refuse_before_conversion(field, value, what)
        if value is None and field.null:
            return None
    elif plan.fast is str and "\x00" in value:
        _refuse_before_conversion(field, value, what)
    try:
        if fast:
            python = plan.check(field, value, what)
        else:
            python = field.to_python(value)
            _refuse_after_conversion(field, python, what)
            python = None if python is None else plan.check(field, python, what)
        validation = plan.validation
        if validation == _UNVALIDATED:
            return python
        if validation == _FOREIGN_KEY and using is not None:
            _validate_foreign_key(field, python, using)  # type: ignore[arg-type]
        elif validation == _JSON:
            models.Field.validate(field, python, None)  # type: ignore[arg-type]
        else:
            field.validate(python, None)  # type: ignore[arg-type]
        if field.validators:
            field.run_validators(python)
    except InvalidUpdate:
        raise
    except _FIELD_ERRORS as exc:
        raise _refused(plan, value, exc) from exc
    return python


#: What a field's conversion or validation raises for a value it refuses (some to_python() raise more
#: than ValidationError; a custom field's get_prep_value() anything).
_FIELD_ERRORS = (ValidationError, TypeError, ValueError, AttributeError, OverflowError, ArithmeticError, RecursionError)


def _refused(plan: _Plan, value: Any, exc: Exception) -> InvalidUpdate:
    """The refusal of ``value`` for what its field raised (``exc``, one of :data:`_FIELD_ERRORS`)."""
    reason = _messages(exc) if isinstance(exc, ValidationError) else short_message(exc)
    head, tail = plan.invalid
    return InvalidUpdate(f"{head}{shown(value)}{tail}{reason}")


def _validate_foreign_key(field: models.ForeignKey[Any, Any], value: Any, using: str) -> None:
    """``ForeignKey.validate()``, with the target's existence checked on database ``using``."""
    if field.remote_field.parent_link:
        return
    models.Field.validate(field, value, None)  # type: ignore[arg-type]
    if value is None:
        return
    target: Any = field.remote_field.model
    rows = target._base_manager.using(using).filter(**{field.remote_field.field_name: value})
    if not rows.complex_filter(field.get_limit_choices_to()).exists():
        raise ValidationError(
            field.error_messages["invalid"],
            code="invalid",
            params={
                "model": target._meta.verbose_name,
                "pk": value,
                "field": field.remote_field.field_name,
                "value": value,
            },
        )


class _Named:
    """What a refusal names: ``prefix`` and the value, cut short (:func:`_shown`), put together only if a
    message is made (most values are fine, and ``repr()`` of each would cost every call)."""

    __slots__ = ("prefix", "value")

    def __init__(self, prefix: str, value: Any) -> None:
        self.prefix, self.value = prefix, value

    def __str__(self) -> str:
        return f"{self.prefix}{shown(self.value)}"


def shown(value: Any) -> str:
    """``repr(value)``, cut short: a message never echoes a whole (huge) input. A value ``repr()`` fails on
    (an integer beyond Python's int-to-str digit limit, a very deep list) is named by its type."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<{'a huge int' if isinstance(value, int) else 'a ' + type(value).__name__ + ' too deep to show'}>"
    return text if len(text) <= 60 else Truncator(text).chars(60, "...")  # a short one costs no Truncator


def short_message(exc: BaseException) -> str:
    """An exception's message, cut short (some quote the whole value, which may not even print)."""
    try:
        text = str(exc)
    except (ValueError, RecursionError):
        return f"{type(exc).__name__} (its message quotes the value, which is too large to print)"
    return Truncator(text).chars(150, "...")


def _messages(exc: ValidationError) -> str:
    """Django's messages of ``exc``, each cut short (some quote the whole value, which may not even be
    printable: an integer beyond the int-to-str limit)."""
    try:
        messages = exc.messages
    except (ValueError, RecursionError):
        return "the value is refused by the field (its message quotes the value, which is too large to print)."
    return " ".join(Truncator(text).chars(150, "...") for text in messages)


_NUMBER_FIELDS = (models.IntegerField, models.FloatField, models.DecimalField)
#: Values Django's own CharField and TextField would store as their ``str()``: ``"[1]"``, ``"b'x'"``, ``"True"``.
_NOT_TEXT = (bool, bytes, bytearray, memoryview, list, tuple, dict, set, frozenset)
#: The ``to_python()`` of Django's text fields, which take anything through ``str()``.
_TEXT_BY_STR = (models.CharField.to_python, models.TextField.to_python)


def _refuse_before_conversion(field: models.Field[Any, Any], value: Any, what: str | _Named) -> None:
    if hasattr(value, "resolve_expression"):
        raise InvalidUpdate(
            f"{what} is an expression; an update writes values, with a version each: compute the value "
            "first (or write expressions with QuerySet.update(), outside safeupdates)."
        )
    target = value_field(field)
    if isinstance(value, bool) and isinstance(target, _NUMBER_FIELDS):
        raise InvalidUpdate(f"{what} is a bool, and the column holds numbers; pass a number (1 or 0, if you mean it).")
    if isinstance(target, models.IntegerField) and isinstance(value, float | Decimal) and not _is_whole(value):
        raise InvalidUpdate(
            f"{what} is not a whole number, and the column holds integers: it would be truncated. "
            "Pass an int (round it yourself if that is what you mean)."
        )
    if isinstance(value, _NOT_TEXT) and type(target).to_python in _TEXT_BY_STR:
        raise InvalidUpdate(
            f"{what} is a {type(value).__name__}, and the column holds text: it would be stored as its str(); "
            "pass a str."
        )
    if isinstance(target, models.DateTimeField) and _is_date(value) and settings.USE_TZ:
        # Django takes it as midnight in TIME_ZONE, with a warning: the naive datetime refused below.
        raise InvalidUpdate(
            f"{what} is a date, and the column holds datetimes while USE_TZ=True; pass an aware datetime "
            "(for example datetime(2026, 1, 2, tzinfo=timezone.utc))."
        )
    if isinstance(value, str) and "\x00" in value:  # one in a JSON value or an array: storable() finds it
        _refuse_nul(what, "text")


def _refuse_after_conversion(field: models.Field[Any, Any], python: Any, what: str | _Named) -> None:
    target = value_field(field)
    if isinstance(target, models.DateTimeField) and isinstance(python, datetime):
        # The rule of synced_at: Django would make a naive value aware in TIME_ZONE (ambiguous around a
        # clock change) with a warning; SQLite refuses an aware one without USE_TZ (a raw ValueError)
        # and PostgreSQL stores it converted to the session's time zone.
        if settings.USE_TZ and timezone.is_naive(python):
            raise InvalidUpdate(
                f"{what} is naive while USE_TZ=True; attach a timezone (for example datetime.now(timezone.utc))."
            )
        if not settings.USE_TZ and timezone.is_aware(python):
            raise InvalidUpdate(f"{what} is aware while USE_TZ=False; pass a naive datetime (in TIME_ZONE).")


#: Integers within this are floats for sure; beyond, float() is asked.
_FLOAT_INTS = 2**1000


def _check_number(field: models.Field[Any, Any], python: Any, what: Any) -> Any:
    """An integer within its column's portable range; a float or decimal finite."""
    if isinstance(python, int) and not isinstance(python, bool):
        target = value_field(field)
        if isinstance(target, models.FloatField) and not -_FLOAT_INTS < python < _FLOAT_INTS:
            try:
                float(python)
            except OverflowError:
                raise InvalidUpdate(f"{what} is out of range: a float column holds at most about 1.8e308.") from None
        if isinstance(target, models.IntegerField):
            # Portable ranges, not the current database's: SQLite takes 2**31 in an IntegerField that
            # PostgreSQL refuses, and a value must not be valid in development only.
            bounds = BaseDatabaseOperations.integer_field_ranges.get(target.get_internal_type())
            if bounds is not None and not bounds[0] <= python <= bounds[1]:
                raise InvalidUpdate(
                    f"{what} is out of range: a {target.get_internal_type()} column holds {bounds[0]} to "
                    f"{bounds[1]}; use a wider field (BigIntegerField) if the value is right."
                )
    elif isinstance(python, float | Decimal) and not _is_finite(python):
        raise InvalidUpdate(
            f"{what} is not a finite number: NaN and infinity cannot be carried by the request log's JSON "
            "nor compared; pass a finite number (or None, for a nullable field)."
        )
    return python


def _is_date(value: Any) -> bool:
    return isinstance(value, date) and not isinstance(value, datetime)


def _is_finite(value: float | Decimal) -> bool:
    return value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)


def _is_whole(value: float | Decimal) -> bool:
    if isinstance(value, Decimal):
        return value.is_finite() and value == value.to_integral_value()
    return value.is_integer()


def _refuse_nul(what: Any, kind: str) -> NoReturn:
    raise InvalidUpdate(f"{what} contains a NUL character (\\x00), which PostgreSQL cannot store in {kind}; remove it.")


def clean_version(version: Any) -> int:
    """Return ``version`` if it is a positive integer (not a bool) that fits a ``BigIntegerField``.

    Whether the version source has handed it out yet is checked where the database is at hand
    (:func:`safeupdates.versions.ensure_issued`).
    """
    if isinstance(version, bool) or not isinstance(version, int) or not 0 < version <= MAX_VERSION:
        raise InvalidUpdate(
            f"version must be a positive integer of at most {MAX_VERSION}, got {version!r}; allocate one "
            "with safeupdates.versions.next_version()."
        )
    return int(version)


def clean_synced_at(synced_at: Any, *, now: datetime) -> datetime:
    """Return ``synced_at`` (an aware one in UTC) if it is a datetime, aware under ``USE_TZ``, within the
    years 1 to 9999 in UTC, and not more than ``SAFEUPDATES_MAX_CLOCK_SKEW`` after ``now`` (the database's
    time, aware)."""
    if not isinstance(synced_at, datetime):
        raise InvalidUpdate(f"synced_at must be a datetime, got {synced_at!r}.")
    given: datetime = synced_at
    if settings.USE_TZ and timezone.is_naive(synced_at):
        raise InvalidUpdate(
            f"synced_at={synced_at.isoformat()} is naive while USE_TZ=True; attach a timezone "
            "(for example datetime.now(timezone.utc))."
        )
    if not settings.USE_TZ and timezone.is_aware(synced_at):
        raise InvalidUpdate(f"synced_at={synced_at.isoformat()} is aware while USE_TZ=False; pass a naive datetime.")
    if timezone.is_naive(synced_at):
        now = timezone.make_naive(now, timezone.get_default_timezone())
    else:
        # As UTC: an instant before the year 1 there would be written (PostgreSQL keeps years BC) and fail
        # every later read of the row, and an offset beyond PostgreSQL's +-15:59 is a DataError.
        try:
            given = synced_at.astimezone(UTC)
        except OverflowError:
            raise InvalidUpdate(
                f"synced_at={synced_at.isoformat()} lies outside the years 1 to 9999 once in UTC."
            ) from None
    skew = conf.max_clock_skew()
    if given > now + skew:
        raise InvalidUpdate(
            f"synced_at={synced_at.isoformat()} lies more than {skew} in the future; it would freeze the "
            "record. Check the client's clock or raise SAFEUPDATES_MAX_CLOCK_SKEW."
        )
    return given


def clean_request_id(request_id: Any) -> uuid.UUID:
    """Return ``request_id`` as a UUID."""
    if isinstance(request_id, uuid.UUID):
        return request_id
    try:
        return uuid.UUID(str(request_id))
    except ValueError:
        raise InvalidUpdate(f"request_id must be a UUID, got {shown(request_id)}.") from None


def clean_pk(model: type[models.Model], pk: Any) -> Any:
    """Return ``pk`` converted by the model's primary key field.

    Refused, as values are (see :func:`clean_changes`): an expression, a bool or a fraction for an
    integer key (``2.5`` would be truncated to ``2``, another row; ``2.0`` and ``"2"`` are ``2``), a key
    out of the column's range, NaN and infinity, a NUL character, a value that is no text for a text key.
    """
    python = None if pk is None else _clean_value(_pk_plan(model), pk)
    if python is None:
        raise InvalidUpdate(f"{model._meta.label}: a primary key is required.")
    return python


@functools.cache
def _pk_plan(model: type[models.Model]) -> _Plan:
    """The plan of clean_pk(): the model's primary key's."""
    field = model._meta.pk
    assert field is not None
    return _Plan(model, field, pk=True)


def clean_object_id(model: type[models.Model], pk: Any) -> str:
    """Return the request log's ``object_id`` of row ``pk`` (the cleaned key as text).

    A key whose text is longer than the log's ``object_id`` column is refused: truncated, it would name
    another row (or, on PostgreSQL, fail the INSERT).
    """
    return object_id_of(model, clean_pk(model, pk))


@functools.cache
def _object_id_limit(log: type[ProcessedRequest]) -> int | None:
    """The max_length of the request log's ``object_id``."""
    return log._meta.get_field("object_id").max_length


def object_id_of(model: type[models.Model], pk: Any) -> str:
    """:func:`clean_object_id` of a key :func:`clean_pk` returned."""
    object_id = str(pk)
    limit = _object_id_limit(request_log())
    if limit is not None and len(object_id) > limit:
        shown_id = Truncator(object_id).chars(13, "...")
        raise InvalidUpdate(
            f"{model._meta.label}: primary key {shown_id!r} has {len(object_id)} characters, and the "
            f"request log's object_id holds at most {limit}: requests of this row cannot be recorded. Update "
            "it without request_id (update_if_newer()), or give the model a shorter primary key."
        )
    return object_id


# -- what a column and the request log can hold ---------------------------------------------------------------

#: The deepest nesting of a JSON value accepted (arrays and objects): a deeper value is refused, as the
#: JSON decoders that read it back (Python's, bounded by its recursion limit) may not take it.
MAX_JSON_DEPTH = 100
#: A DurationField holds a bigint of microseconds on every database but PostgreSQL (portable, as ints):
#: from -2**63 to 2**63 - 1.
_DURATION_LIMIT = 2**63 - 1
_DURATION_LEAST = -(2**63)
#: An escaped NUL in JSON text: ``\u0000`` after an even number of backslashes (an odd one is a literal ``\``).
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

#: What storable() does for a field: found once per field (:func:`_checker`).
_Checker = Callable[[Any, Any, Any], Any]


def storable(field: models.Field[Any, Any], value: Any, what: str | _Named) -> Any:
    """Return ``value`` (a Python value of ``field``) as it is written, or raise InvalidUpdate naming
    ``what`` if a column or the request log cannot hold it: the one place that says so for every field.

    Refused: a string with a lone surrogate (no encoding can send it) or a NUL character (PostgreSQL
    refuses it in text and in JSON), text longer than the column, a JSON value JSON cannot write
    faithfully at any depth (NaN, infinity, an integer beyond Python's int-to-str digit limit, nesting
    deeper than :data:`MAX_JSON_DEPTH`, a type its encoder does not know), an aware datetime outside
    the years 1 to 9999 once in UTC, an aware time, a duration beyond a bigint of microseconds, bytes
    of another type for a BinaryField, a file not saved yet, a custom field's value its
    ``get_prep_value()`` refuses or that does not come back from the text the request log records.
    None is returned as it is.
    """
    if value is None:
        return None
    return _checker(field)(field, value, what)


@functools.cache
def _checker(field: models.Field[Any, Any], *, recorded: bool = True) -> _Checker:
    """The check of ``field``'s values, by its kind; a custom field's conversion is checked on top where
    the value is ``recorded`` in the request log."""
    target = value_field(field)
    check: _Checker
    if isinstance(target, models.JSONField):
        check = _check_json
    elif is_array(target):
        check = _check_array
    elif is_range(target):
        check = _check_range
    elif _is_hstore(target):
        check = _check_hstore
    elif isinstance(target, models.BinaryField):
        check = _check_bytes
    elif isinstance(target, models.FileField):
        check = _check_file
    elif isinstance(target, models.DateTimeField):
        check = _check_datetime
    elif isinstance(target, models.TimeField):
        check = _check_time
    elif isinstance(target, models.DurationField):
        check = _check_duration
    elif isinstance(target, _NUMBER_FIELDS):
        check = _check_number
    else:
        check = check_text
    if recorded and is_custom(target):
        plain = check

        def check(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
            return _check_custom(field, plain(field, value, what), what)

    return check


def check_text(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    """A string: no lone surrogate, no NUL, no longer than the column. Values of other types pass."""
    if isinstance(value, str):
        if not value.isascii():
            _refuse_surrogates(value, what)
        if "\x00" in value:
            _refuse_nul(what, "text")
        limit = _unchecked_length(field)
        if limit is not None and len(value) > limit:
            _refuse_length(value, limit, what)
    return value


@functools.cache
def _unchecked_length(field: models.Field[Any, Any]) -> int | None:
    """The max_length of a field that no validator of its own checks (a FileField's)."""
    target = value_field(field)
    if not isinstance(target, models.CharField | models.FileField | models.FilePathField):
        return None  # max_length of another kind (a UUIDField's 32) is no length of its text
    if target.max_length is None or any(isinstance(v, MaxLengthValidator) for v in target.validators):
        return None
    return int(target.max_length)


def _refuse_length(value: str, limit: int, what: Any) -> None:
    raise InvalidUpdate(f"{what} has {len(value)} characters, and the column holds at most {limit}.")


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (``\\ud800`` to ``\\udfff``), which UTF-8, so no database and
    no Redis, can carry: a client's JSON makes one of an unpaired ``\\u`` escape."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _refuse_surrogates(text: str, what: Any) -> None:
    if has_lone_surrogate(text):
        raise InvalidUpdate(
            f"{what} contains a lone surrogate (\\ud800 to \\udfff), which no text encoding can store; "
            "a client's JSON made it of an unpaired \\u escape: refuse or repair it there."
        )


def _check_json(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    """A JSON value, encoded once as the column encodes it: at any depth, no NaN or infinity, no integer
    beyond the int-to-str limit, no lone surrogate, no NUL, no nesting deeper than :data:`MAX_JSON_DEPTH`."""
    target = value_field(field)
    return check_json(value, what, encoder=getattr(target, "encoder", None), invalid=target.error_messages["invalid"])


def check_json(
    value: Any, what: Any, *, encoder: type[json.JSONEncoder] | None = None, invalid: Any = "Value must be valid JSON."
) -> Any:
    """Return ``value`` if a ``jsonb`` column can hold it and JSON reads it back (see :func:`storable`),
    else raise InvalidUpdate naming ``what``; ``invalid`` is the message of a type ``encoder`` does not know."""
    try:
        text = json.dumps(value, cls=encoder, allow_nan=False, ensure_ascii=False)
    except RecursionError:
        raise InvalidUpdate(
            f"{what} is nested too deeply: at most {MAX_JSON_DEPTH} levels of arrays and objects."
        ) from None
    except ValueError as exc:
        if "Out of range float" in str(exc):
            raise InvalidUpdate(
                f"{what} holds NaN or infinity, which JSON cannot write; pass finite numbers (or null)."
            ) from None
        raise InvalidUpdate(f"{what} cannot be written as JSON: {short_message(exc)}") from None
    except TypeError:
        raise InvalidUpdate(f"{what} is invalid: {invalid}") from None
    if not text.isascii():
        _refuse_surrogates(text, what)
    if "\\u0000" in text and _ESCAPED_NUL.search(text):
        _refuse_nul(what, "JSON")
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _depth(value) > MAX_JSON_DEPTH:
        raise InvalidUpdate(f"{what} is nested too deeply: at most {MAX_JSON_DEPTH} levels of arrays and objects.")
    return value


def _depth(value: Any) -> int:
    """The nesting depth of a JSON value (what ``json.dumps`` takes: dicts, lists and tuples), level by
    level, without recursion; counted up to just past :data:`MAX_JSON_DEPTH`."""
    depth, level = 0, [value] if isinstance(value, dict | list | tuple) else []
    while level and depth <= MAX_JSON_DEPTH:
        depth += 1
        below: list[Any] = []
        for item in level:
            below.extend(c for c in (item.values() if isinstance(item, dict) else item) if isinstance(c, _NESTS))
        level = below
    return depth


_NESTS = (dict, list, tuple)


def _check_bytes(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidUpdate(f"{what} is a {type(value).__name__}; a BinaryField takes bytes (or base64 text).")
    return value


def _check_file(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    """A file field holds a name in its storage: a name, or a file already saved there (its name)."""
    if isinstance(value, FieldFile):
        if not in_storage(value):
            raise InvalidUpdate(f"{what} is a file not saved to its storage yet; save it first, then pass its name.")
        value = value.name or ""
    if not isinstance(value, str):
        raise InvalidUpdate(
            f"{what} is a {type(value).__name__}; an update writes a file field's name: save the file to its "
            "storage first and pass the name it was saved under."
        )
    return check_text(field, value, what)


def _check_datetime(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    """An aware datetime is written as its instant in UTC: PostgreSQL takes no offset beyond +-15:59
    where a statement carries it as text (a ``DataError``), and none outside the years 1 to 9999."""
    if isinstance(value, datetime) and value.utcoffset() is not None:
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise InvalidUpdate(f"{what} lies outside the years 1 to 9999 once in UTC.") from None
    return value


def _check_time(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    if isinstance(value, time) and value.utcoffset() is not None:
        raise InvalidUpdate(f"{what} is an aware time; a time column holds no time zone: pass a naive time.")
    return value


def _check_duration(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    if isinstance(value, timedelta) and not _DURATION_LEAST <= value // timedelta(microseconds=1) <= _DURATION_LIMIT:
        raise InvalidUpdate(
            f"{what} is out of range: a duration column holds {_DURATION_LEAST} to {_DURATION_LIMIT} microseconds."
        )
    return value


def _check_array(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    """Each item of an array converted and checked by the array's base field, and the array rectangular
    (PostgreSQL refuses a multidimensional array whose sub-arrays differ in length)."""
    if not isinstance(value, list | tuple):
        raise InvalidUpdate(f"{what} is a {type(value).__name__}; an array field takes a list.")
    base: Any = value_field(field).base_field  # type: ignore[attr-defined]
    items: list[Any] = []
    for item in value:
        if item is None:
            items.append(None)
            continue
        _refuse_before_conversion(base, item, what)
        python = base.to_python(item)
        _refuse_after_conversion(base, python, what)
        items.append(storable(base, python, what))
    # An array of arrays must be rectangular; a list in an array of JSON is one jsonb value.
    nested = [item for item in items if isinstance(item, list)] if is_array(value_field(base)) else []
    if nested and (len(nested) != len(items) or len({_shape(item) for item in nested}) != 1):
        raise InvalidUpdate(f"{what} is not rectangular: the arrays of a multidimensional array have one length.")
    return items


def _shape(value: Any) -> tuple[int, ...]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        value = value[0] if value else None
    return tuple(shape)


def _is_hstore(field: models.Field[Any, Any]) -> bool:
    return type(field).__module__.startswith("django.contrib.postgres") and field.get_internal_type() == "HStoreField"


def _check_hstore(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    """A dict whose keys and values are text (a value may be None), each checked as text
    (:func:`check_text`: no lone surrogate, no NUL). A value that is no text, its ``validate()`` refuses."""
    if not isinstance(value, dict):
        raise InvalidUpdate(f"{what} is a {type(value).__name__}; an hstore field takes a dict of strings.")
    for pair in value.items():
        for text in pair:
            check_text(field, text, what)
    return value


def _check_range(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    """A range's bounds converted and checked by its base field, the lower not above the upper."""
    target: Any = value_field(field)
    range_type = target.range_type
    if not isinstance(value, range_type):
        raise InvalidUpdate(f"{what} is a {type(value).__name__}; the field takes a {range_type.__name__}.")
    if value.isempty:
        return value
    base = target.base_field
    lower, upper = (None if end is None else base.to_python(end) for end in (value.lower, value.upper))
    for end in (lower, upper):
        if end is not None:
            _refuse_before_conversion(base, end, what)
            _refuse_after_conversion(base, end, what)
            storable(base, end, what)
    if lower is not None and upper is not None and lower > upper:
        raise InvalidUpdate(f"{what} has its lower bound above its upper bound.")
    return range_type(lower, upper, range_bounds(value))


def _check_custom(field: models.Field[Any, Any], value: Any, what: Any) -> Any:
    """A custom field's value: its ``get_prep_value()`` takes it (and gives storable text, if text), and
    the text the request log records of it reads back as the same value."""
    prepared = field.get_prep_value(value)
    check_text(field, prepared, what) if isinstance(prepared, str) else None
    if needs_text_form(field):
        back = field.to_python(written_out(field, value))
        if field.get_prep_value(back) != prepared:
            raise InvalidUpdate(
                f"{what} does not read back as itself from the text its field writes out "
                "(value_to_string(), then to_python()), so the request log cannot record it."
            )
    return value


#: Fields whose values Django's save() passes on unconverted, by internal type: what they take.
_PASSED_ON_UNCONVERTED: dict[str, tuple[type | tuple[type, ...], str]] = {
    "DurationField": (timedelta, "a timedelta"),
    "BinaryField": ((bytes, bytearray, memoryview), "bytes"),
}


@functools.cache
def _save_plans(model: type[models.Model]) -> tuple[_Plan, ...]:
    """The plans of check_saved(): of each field a save() may write."""
    return tuple(
        _Plan(model, f, recorded=False)
        for f in model._meta.concrete_fields
        if not f.primary_key and not f.generated and f.name not in MANAGED_FIELDS
    )


def check_saved(instance: models.Model, names: Iterable[str] | None) -> bool:
    """Refuse, before a ``save()`` runs a statement, a value of ``instance`` that no column can hold
    (:func:`storable`) among the fields it writes (``names``; None: all), or that its field cannot
    convert (``to_python()``, as Django's conversion on the way would fail, or pass it on unconverted:
    a text for a duration). The value written stays the one given; expressions are left to Django, and
    a file is checked by its name.

    Returns True if the save may still fail on its input: None for a NOT NULL column, which a
    ``pre_save`` receiver may fill in (so it is not refused here); the save then runs in a savepoint."""
    model = type(instance)
    plans = _save_plans(model)
    wanted = None if names is None else frozenset(names)
    values = instance.__dict__
    unsure = False
    what: _Named | None = None
    try:
        for plan in plans:
            field = plan.field
            if wanted is not None and field.name not in wanted:
                continue
            value = values.get(field.attname)
            if value is None:
                # A pre_save receiver may still fill it in; if none does, the database refuses it.
                unsure = unsure or plan.required
                continue
            if type(value) is plan.fast:
                # A bool, int or str its field's own to_python() returns as it is: only the column's checks.
                what = _Named(plan.prefix, value)
                plan.check(field, value, what)
                if plan.max_length is not None and len(value) > plan.max_length:
                    _refuse_length(value, plan.max_length, what)
                continue
            if hasattr(value, "resolve_expression"):
                continue
            if plan.file:
                file = getattr(instance, field.attname)
                if isinstance(file, FieldFile):
                    if not in_storage(file):
                        continue  # save() stores it first, under a name its storage makes fit the column
                    value = file.name
                    if value is None:
                        continue
            what = _Named(plan.prefix, value)
            unconverted = plan.unconverted
            if unconverted is not None and not isinstance(value, unconverted[0]):
                # Django's save passes it on as it is: PostgreSQL parses an interval its own way (SQLite
                # fails), psycopg refuses a text for bytea.
                raise InvalidUpdate(f"{what} is a {type(value).__name__}; save() writes {unconverted[1]} only.")
            try:
                python = field.to_python(value)
                if python is not None:  # an array's item or a range's bound its base field may refuse
                    plan.check(field, python, what)
            except InvalidUpdate:
                raise
            except _FIELD_ERRORS as exc:
                raise _refused(plan, value, exc) from exc
            if python is None:
                continue
            if isinstance(field, models.DecimalField) and isinstance(python, Decimal) and python.is_finite():
                # The column rounds to its places, as Django's save does; more whole digits than it holds,
                # the database refuses (numeric field overflow).
                _refuse_whole_digits(field, python, what)
            # Django's own save runs no validator: a CharField's max_length is checked here (PostgreSQL refuses).
            if plan.max_length is not None and isinstance(python, str) and len(python) > plan.max_length:
                _refuse_length(python, plan.max_length, what)
    except InvalidUpdate as exc:
        if what is not None:  # the field checked last: the refusal is its value's, if its message says so
            exc.located(model._meta.label, field.name, str(what))
        raise
    return unsure


def _refuse_whole_digits(field: models.DecimalField[Any, Any], value: Decimal, what: _Named) -> None:
    max_digits, places = field.max_digits, field.decimal_places
    if max_digits is None or places is None:
        return
    try:
        with localcontext(prec=max(28, max_digits + 2), rounding=ROUND_HALF_UP):
            rounded = value.quantize(Decimal(1).scaleb(-places))
    except InvalidOperation:  # more digits than the context holds: far beyond the column's
        rounded = None
    if rounded is None or len(rounded.as_tuple().digits) - places > max_digits - places:
        raise InvalidUpdate(
            f"{what} has more than {max_digits - places} digit(s) before the decimal point, which its column "
            f"(max_digits={max_digits}, decimal_places={places}) cannot hold."
        )
