"""Validation of update arguments: field names, values, versions, timestamps and request ids.

Everything here raises :class:`~safeupdates.exceptions.InvalidUpdate` before anything is written.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations
from django.utils import timezone

from safeupdates import conf
from safeupdates.database.registry import request_log
from safeupdates.exceptions import InvalidUpdate
from safeupdates.versions import MAX_VERSION

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
            message = f"{label} has no field {_shown(name)}; fields that can be updated: {choices}."
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
    label = model._meta.label
    if not changes:
        raise InvalidUpdate(f"{label}: an update needs at least one field=value change.")
    allowed_names = None if allowed is None else frozenset(allowed)
    cleaned: dict[str, Any] = {}
    for name, value in changes.items():
        field = writable_field(model, name)
        if allowed_names is not None and field.name not in allowed_names:
            raise InvalidUpdate(
                f"{label}.{field.name} is not in {label}.safe_update_fields "
                f"{tuple(sorted(allowed_names))}; add it there to let queued jobs change it."
            )
        if field.name in cleaned:
            raise InvalidUpdate(f"{label}.{field.name} is given twice.")
        cleaned[field.name] = _clean_value(field, value, _Named(f"{label}.{field.name}=", value), using)
    return cleaned


def _clean_value(field: models.Field[Any, Any], value: Any, what: str | _Named, using: str | None = None) -> Any:
    """Return ``value`` converted by ``field``, or raise InvalidUpdate naming ``what``.

    Beyond ``field.clean()``: a value is refused when converting it would change it (a fraction for an
    integer column is truncated by ``int()``, and by Django's own lookups), when the column cannot hold
    it (out of range, NUL), when the request log's JSON cannot carry it (NaN, infinity), or when it is
    an expression. None is accepted wherever the column is nullable (``null=True``), blank or not.
    """
    _refuse_before_conversion(field, value, what)
    if value is None and field.null:
        return None
    try:
        python = field.to_python(value)
        _refuse_after_conversion(field, python, what)
        if using is not None and isinstance(field, models.ForeignKey):
            _validate_foreign_key(field, python, using)
        else:
            field.validate(python, None)  # type: ignore[arg-type]
        field.run_validators(python)
    except ValidationError as exc:
        raise InvalidUpdate(f"{what} is invalid: {_messages(exc)}") from exc
    except (TypeError, ValueError, OverflowError, ArithmeticError) as exc:  # some to_python() raise these
        raise InvalidUpdate(f"{what} is invalid: {exc}") from exc
    return python


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
        return f"{self.prefix}{_shown(self.value)}"


def _shown(value: Any) -> str:
    """``repr(value)``, cut short: a message never echoes a whole (huge) input."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:50]}...{text[-1]}"


def _messages(exc: ValidationError) -> str:
    """Django's messages of ``exc``, each cut short (some quote the whole value)."""
    return " ".join(text if len(text) <= 150 else f"{text[:140]}..." for text in exc.messages)


def _value_field(field: models.Field[Any, Any]) -> models.Field[Any, Any]:
    """The field whose column type ``field`` stores: the target field of a (chain of) relations."""
    while field.is_relation and getattr(field, "target_field", None) is not None:
        field = field.target_field  # type: ignore[attr-defined]
    return field


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
    target = _value_field(field)
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
    if _has_nul(value):
        raise InvalidUpdate(
            f"{what} contains a NUL character (\\x00), which PostgreSQL cannot store in text; remove it."
        )


def _refuse_after_conversion(field: models.Field[Any, Any], python: Any, what: str | _Named) -> None:
    target = _value_field(field)
    if isinstance(target, models.IntegerField) and isinstance(python, int):
        # Portable ranges, not the current database's: SQLite takes 2**31 in an IntegerField that
        # PostgreSQL refuses, and a value must not be valid in development only.
        bounds = BaseDatabaseOperations.integer_field_ranges.get(target.get_internal_type())
        if bounds is not None and not bounds[0] <= python <= bounds[1]:
            raise InvalidUpdate(
                f"{what} is out of range: a {target.get_internal_type()} column holds {bounds[0]} to "
                f"{bounds[1]}; use a wider field (BigIntegerField) if the value is right."
            )
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
    if isinstance(python, float | Decimal) and not _is_finite(python):
        raise InvalidUpdate(
            f"{what} is not a finite number: NaN and infinity cannot be carried by the request log's JSON "
            "nor compared; pass a finite number (or None, for a nullable field)."
        )


def _is_date(value: Any) -> bool:
    return isinstance(value, date) and not isinstance(value, datetime)


def _is_finite(value: float | Decimal) -> bool:
    return value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)


def _is_whole(value: float | Decimal) -> bool:
    if isinstance(value, Decimal):
        return value.is_finite() and value == value.to_integral_value()
    return value.is_integer()


def _has_nul(value: Any) -> bool:
    """Whether ``value`` is, or (as JSON) contains, a string with a NUL character."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(item) for item in value)
    return False


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
    """Return ``synced_at`` if it is a datetime, aware under ``USE_TZ``, and not more than
    ``SAFEUPDATES_MAX_CLOCK_SKEW`` after ``now`` (the database's time, aware)."""
    if not isinstance(synced_at, datetime):
        raise InvalidUpdate(f"synced_at must be a datetime, got {synced_at!r}.")
    if settings.USE_TZ and timezone.is_naive(synced_at):
        raise InvalidUpdate(
            f"synced_at={synced_at.isoformat()} is naive while USE_TZ=True; attach a timezone "
            "(for example datetime.now(timezone.utc))."
        )
    if not settings.USE_TZ and timezone.is_aware(synced_at):
        raise InvalidUpdate(f"synced_at={synced_at.isoformat()} is aware while USE_TZ=False; pass a naive datetime.")
    if timezone.is_naive(synced_at):
        now = timezone.make_naive(now, timezone.get_default_timezone())
    skew = conf.max_clock_skew()
    if synced_at > now + skew:
        raise InvalidUpdate(
            f"synced_at={synced_at.isoformat()} lies more than {skew} in the future; it would freeze the "
            "record. Check the client's clock or raise SAFEUPDATES_MAX_CLOCK_SKEW."
        )
    return synced_at


def clean_request_id(request_id: Any) -> uuid.UUID:
    """Return ``request_id`` as a UUID."""
    if isinstance(request_id, uuid.UUID):
        return request_id
    try:
        return uuid.UUID(str(request_id))
    except ValueError:
        raise InvalidUpdate(f"request_id must be a UUID, got {_shown(request_id)}.") from None


def clean_pk(model: type[models.Model], pk: Any) -> Any:
    """Return ``pk`` converted by the model's primary key field.

    Refused, as values are (see :func:`clean_changes`): an expression, a bool or a fraction for an
    integer key (``2.5`` would be truncated to ``2``, another row; ``2.0`` and ``"2"`` are ``2``), a key
    out of the column's range, NaN and infinity, a NUL character, a value that is no text for a text key.
    """
    label = model._meta.label
    if pk is None:
        raise InvalidUpdate(f"{label}: a primary key is required.")
    field = model._meta.pk
    assert field is not None
    what = _Named(f"{label}: primary key ", pk)
    _refuse_before_conversion(field, pk, what)
    try:
        python = field.to_python(pk)
        _refuse_after_conversion(field, python, what)
    except ValidationError as exc:
        raise InvalidUpdate(f"{label}: invalid primary key {_shown(pk)}: {_messages(exc)}") from exc
    except (TypeError, ValueError, OverflowError, ArithmeticError) as exc:
        raise InvalidUpdate(f"{label}: invalid primary key {_shown(pk)}: {exc}") from exc
    if python is None:
        raise InvalidUpdate(f"{label}: a primary key is required.")
    return python


def clean_object_id(model: type[models.Model], pk: Any) -> str:
    """Return the request log's ``object_id`` of row ``pk`` (the cleaned key as text).

    A key whose text is longer than the log's ``object_id`` column is refused: truncated, it would name
    another row (or, on PostgreSQL, fail the INSERT).
    """
    return object_id_of(model, clean_pk(model, pk))


def object_id_of(model: type[models.Model], pk: Any) -> str:
    """:func:`clean_object_id` of a key :func:`clean_pk` returned."""
    object_id = str(pk)
    limit = request_log()._meta.get_field("object_id").max_length
    if limit is not None and len(object_id) > limit:
        raise InvalidUpdate(
            f"{model._meta.label}: primary key {object_id[:10] + '...'!r} has {len(object_id)} characters, and the "
            f"request log's object_id holds at most {limit}: requests of this row cannot be recorded. Update "
            "it without request_id (update_if_newer()), or give the model a shorter primary key."
        )
    return object_id
