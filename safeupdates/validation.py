"""Validation of update arguments: field names, values, versions, timestamps and request ids.

Everything here raises :class:`~safeupdates.exceptions.InvalidUpdate` before anything is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import models
from django.utils import timezone

from safeupdates import conf
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
            raise InvalidUpdate(f"{label} has no field {name!r}; fields that can be updated: {choices}.") from None
    if not isinstance(found, models.Field) or not found.concrete or found.many_to_many or found.one_to_many:
        raise InvalidUpdate(f"{label}.{name} is not a concrete column and cannot be updated.")
    field: models.Field[Any, Any] = found
    if field.primary_key:
        raise InvalidUpdate(f"{label}.{name} is the primary key and cannot be updated.")
    if field.name in MANAGED_FIELDS:
        raise InvalidUpdate(f"{label}.{name} is managed by safeupdates and cannot be set by an update.")
    return field


def clean_changes(
    model: type[models.Model], changes: Mapping[str, Any], *, allowed: Iterable[str] | None = None
) -> dict[str, Any]:
    """Validate ``changes`` against the model's fields; return ``{field name: python value}``.

    ``allowed`` restricts the field names (the job path passes ``safe_update_fields``).
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
        try:
            cleaned[field.name] = field.clean(value, None)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise InvalidUpdate(f"{label}.{field.name}={value!r} is invalid: {' '.join(exc.messages)}") from exc
        except (TypeError, ValueError) as exc:  # some to_python() implementations raise these
            raise InvalidUpdate(f"{label}.{field.name}={value!r} is invalid: {exc}") from exc
    return cleaned


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
        raise InvalidUpdate(f"request_id must be a UUID, got {request_id!r}.") from None


def clean_pk(model: type[models.Model], pk: Any) -> Any:
    """Return ``pk`` converted by the model's primary key field."""
    if pk is None:
        raise InvalidUpdate(f"{model._meta.label}: a primary key is required.")
    try:
        return model._meta.pk.to_python(pk)  # type: ignore[union-attr]
    except ValidationError as exc:
        raise InvalidUpdate(f"{model._meta.label}: invalid primary key {pk!r}: {' '.join(exc.messages)}") from exc
