"""What changed since a person (or a client) saw a record: the core of every conflict-safe surface.

A form, a change page or an API response carries an *edit token*: the record's ``lock_version`` and,
for each field the surface shows, a keyed digest of its value, signed with :mod:`django.core.signing`
so that a client cannot forge a newer version (which would let a stale edit through) or other digests
(which would hide a change). The token carries no value: signed is not encrypted, and a token leaves
the server. When the edit comes back, :func:`find_conflict` compares the token with the row as it is
now: if the row moved on, the edit is refused, and :class:`Conflict` says, per field shown whose value
differs from the one seen, what is there now and which request (or direct save) wrote it and when.

The check that decides is still the database's (``save()``'s ``WHERE lock_version = ...``, or
``update_if_newer``): a conflict found here is reported before writing; one that happens between the
check and the write raises :class:`~safeupdates.exceptions.StaleObjectError` there.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, cast
from uuid import UUID

from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.core import signing
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import models
from django.utils.crypto import constant_time_compare, salted_hmac

from safeupdates.exceptions import InvalidUpdate
from safeupdates.models import LockVersionMixin, ProcessedRequest, RequestKind, RequestStatus

__all__ = [
    "NOT_SHOWN",
    "Conflict",
    "FieldChange",
    "changed_from_seen",
    "changes_since",
    "digest_matches",
    "digests",
    "edit_token",
    "field_digest",
    "find_conflict",
    "find_field_conflict",
    "json_value",
    "read_edit_token",
    "reported_fields",
    "shown_text",
    "written_since",
]

_SALT = "safeupdates.edit-token"
_DIGEST_SALT = "safeupdates.field-digest"
#: Characters of a field's digest: 48 bits. A collision only leaves one changed field out of a report;
#: the refusal itself is decided by versions.
DIGEST_LENGTH: Final = 8
#: Columns that safeupdates keeps for itself: never reported as changed.
_BOOKKEEPING = frozenset({"lock_version", "field_versions", "last_synced_at"})
#: The most values a field may allow for the value seen to be told from its digest (one digest each).
_FEW_VALUES = 64


class _NotShown:
    def __repr__(self) -> str:
        return "NOT_SHOWN"


#: The value of :attr:`FieldChange.now` or :attr:`FieldChange.seen` that a surface does not show (or,
#: for ``seen``, that cannot be told: the token carries a digest, not the value).
NOT_SHOWN: Final[Any] = _NotShown()


@dataclasses.dataclass(frozen=True)
class FieldChange:
    """One field whose value differs from the one seen: the value now, and who wrote it when."""

    name: str
    label: str
    #: The value now, or :data:`NOT_SHOWN` where the surface does not show values.
    now: Any
    #: The value seen, where it can be told from its digest (a boolean, a field with a few choices);
    #: else :data:`NOT_SHOWN`.
    seen: Any
    #: The request that wrote the value now stored (the field carries its version), or None for a
    #: direct ``save()``, a write that bypassed the app, or a request purged from the log.
    request_id: UUID | None
    #: When that request was processed (the database's clock), if known.
    changed_at: datetime | None
    #: The version of that write (``field_versions``).
    version: int
    field: models.Field[Any, Any] = dataclasses.field(repr=False, compare=False)

    @property
    def shows_now(self) -> bool:
        return self.now is not NOT_SHOWN

    @property
    def shows_seen(self) -> bool:
        return self.seen is not NOT_SHOWN

    @property
    def writer(self) -> str:
        """``request <id>``, or ``a direct save``."""
        return f"request {self.request_id}" if self.request_id else "a direct save"

    def describe(self) -> str:
        """One line for a person: ``Active: you saw True, now False (request <id> at <time>)``."""
        when = f" at {self.changed_at:%Y-%m-%d %H:%M:%S %Z}".rstrip() if self.changed_at else ""
        if not self.shows_now:
            return f"{self.label} changed ({self.writer}{when})"
        seen = f"you saw {shown_text(self.field, self.seen)}, " if self.shows_seen else ""
        return f"{self.label}: {seen}now {shown_text(self.field, self.now)} ({self.writer}{when})"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the values only where they are shown)."""
        values = {"now": json_value(self.field, self.now)} if self.shows_now else {}
        if self.shows_seen:
            values["seen"] = json_value(self.field, self.seen)
        return {
            "field": self.name,
            **values,
            "request_id": str(self.request_id) if self.request_id else None,
            "changed_at": self.changed_at.isoformat() if self.changed_at else None,
            "version": self.version,
        }


@dataclasses.dataclass(frozen=True)
class Conflict:
    """The record moved on since it was seen at ``seen_version``; ``changes`` are the fields shown whose
    values differ from the ones seen.

    ``changes`` may be empty: the row was written (its ``lock_version`` moved) but every field shown
    still holds the value seen, for example when a field not shown changed.
    """

    label: str
    pk: Any
    seen_version: int
    current_version: int
    changes: tuple[FieldChange, ...]

    @property
    def fields(self) -> list[str]:
        """Names of the fields that changed."""
        return [change.name for change in self.changes]

    def message(self, marked: Collection[str] = ()) -> str:
        """A person's explanation, listing every changed field but those in ``marked``: a form tells
        those on the fields themselves, and its summary need not say it again."""
        head = f"{self.label} {self.pk} was changed by someone else after you opened it"
        if not self.changes:
            return f"{head} (no field you saw differs). Reload it and save again."
        listed = [change.describe() for change in self.changes if change.name not in marked]
        if not listed:
            return f"{head}: see the fields marked below. Reload it to see the changes."
        if len(listed) < len(self.changes):
            return f"{head}: {'; '.join(listed)}; and the fields marked below. Reload it to see them."
        return f"{head}: {'; '.join(listed)}. Reload it to see them."

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, for API error bodies (409/412)."""
        return {
            "detail": self.message(),
            "current_version": self.current_version,
            "seen_version": self.seen_version,
            "changes": [change.as_dict() for change in self.changes],
        }


# -- digests -----------------------------------------------------------------------------------------------


def field_digest(instance: models.Model, name: str, *, secret: str | bytes | None = None) -> str:
    """A keyed digest of field ``name``'s value on ``instance``, bound to the record and the field.

    Equal values give equal digests; without ``SECRET_KEY`` (``secret``: another key) a digest tells
    nothing about the value. Compare with :func:`digest_matches`, which honours ``SECRET_KEY_FALLBACKS``.
    """
    model_field = _field(type(instance), name)
    if model_field is None:
        raise FieldDoesNotExist(f"{instance._meta.label} has no field {name!r} that a conflict can report.")
    return _digest(instance, model_field, model_field.value_from_object(instance), secret)


def digests(instance: models.Model, names: Iterable[str]) -> dict[str, str]:
    """``{name: field_digest(instance, name)}`` for the reportable fields among ``names``."""
    return {name: field_digest(instance, name) for name in reported_fields(type(instance), names)}


def digest_matches(instance: models.Model, name: str, digest: Any) -> bool:
    """True if ``digest`` is the digest of field ``name``'s value on ``instance`` (under ``SECRET_KEY``
    or one of ``SECRET_KEY_FALLBACKS``); False for any other digest or a field that does not exist."""
    model_field = _field(type(instance), name)
    if model_field is None or not isinstance(digest, str):
        return False
    value = model_field.value_from_object(instance)
    return any(constant_time_compare(_digest(instance, model_field, value, key), digest) for key in _keys())


def _digest(instance: models.Model, model_field: models.Field[Any, Any], value: Any, secret: Any) -> str:
    label = (instance._meta.concrete_model or type(instance))._meta.label_lower
    message = f"{label}:{instance.pk}:{model_field.name}:{_text(model_field, value)}"
    raw = salted_hmac(_DIGEST_SALT, message, secret=secret, algorithm="sha256").digest()
    return base64.urlsafe_b64encode(raw).decode()[:DIGEST_LENGTH]


def _keys() -> list[Any]:
    return [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]


class _Holder:
    """What ``Field.value_to_string(obj)`` reads a value from (``getattr(obj, field.attname)``), for a
    value that is not on an instance (as ``django.contrib.postgres``' ``AttributeSetter``)."""

    def __init__(self, name: str, value: Any) -> None:
        setattr(self, name, value)


def _text(model_field: models.Field[Any, Any], value: Any) -> str:
    """The value as the field itself writes it out (``value_to_string``, as the serializers do): a file
    by its name, bytes in base64, a range or a custom type as the field says. Never ``json.dumps`` of
    an arbitrary Python value, which fails on every type JSON does not know."""
    with contextlib.suppress(ValidationError, TypeError, ValueError):
        value = model_field.to_python(value)  # 1 and True, "5" and 5 are the same stored value
    if isinstance(value, datetime) and value.tzinfo is not None:
        value = value.astimezone(UTC)  # one instant, one text, whatever zone it was given in
    try:
        text = model_field.value_to_string(cast("models.Model", _Holder(model_field.attname, value)))
    except (AttributeError, TypeError, ValueError):  # a custom field's own failure: compare as Python shows it
        return repr(value)
    if isinstance(text, str):
        return text
    # JSONField gives its (JSON) value back; anything else its encoder took is written out as text.
    return json.dumps(text, sort_keys=True, default=str)


# -- tokens ------------------------------------------------------------------------------------------------


def edit_token(instance: LockVersionMixin, fields: Iterable[str]) -> str:
    """A signed token of ``instance``'s ``lock_version`` and a digest of each of ``fields`` as shown now.

    It carries no value: only the version, the names and the digests (:func:`field_digest`).
    """
    payload = {
        "m": instance._meta.label_lower,
        "pk": str(instance.pk),
        "v": instance.lock_version,
        "d": digests(instance, fields),
    }
    return signing.dumps(payload, salt=_SALT, compress=True)


def read_edit_token(token: Any, instance: LockVersionMixin) -> tuple[int, dict[str, str]]:
    """The ``(lock_version, digests seen)`` of ``token``; refused unless it was signed for ``instance``.

    Raises :class:`~safeupdates.exceptions.InvalidUpdate` for a token that was tampered with, was made
    for another record, by an older release, or is not a token at all.
    """
    if not isinstance(token, str):
        raise _bad_token("the edit token is not valid (tampered with, or not one); reload the page.")
    try:
        payload = signing.loads(token, salt=_SALT)
    except (signing.BadSignature, TypeError, ValueError) as exc:
        raise _bad_token("the edit token is not valid (tampered with, or not one); reload the page.") from exc
    if not isinstance(payload, dict):
        raise _bad_token("the edit token is not valid; reload the page.")
    if payload.get("m") != instance._meta.label_lower or payload.get("pk") != str(instance.pk):
        raise _bad_token("the edit token was made for another record; reload the page.")
    version, seen = payload.get("v"), payload.get("d")
    if "d" not in payload and "f" in payload:
        raise _bad_token("the edit token was made by an older version of this page; reload the page.")
    if type(version) is not int or not isinstance(seen, dict):
        raise _bad_token("the edit token is not valid; reload the page.")
    return version, seen


def _bad_token(message: str) -> InvalidUpdate:
    # It quotes nothing of the record: a surface may show it as it is (its ``reason``).
    return InvalidUpdate(message, reason=message)


# -- conflicts ---------------------------------------------------------------------------------------------


def find_conflict(current: LockVersionMixin, seen_version: int, seen: Mapping[str, str]) -> Conflict | None:
    """Compare what was seen with ``current`` (the row as loaded now); None if the row did not move.

    ``seen`` maps the names of the fields shown to their digests, as :func:`read_edit_token` gives
    them. The conflict lists the fields among them whose value differs, with the value now: the surface
    showed them. A name that is no field of the model (any more) is left out.
    """
    if current.lock_version == seen_version:
        return None
    return changes_since(current, seen_version, list(seen), seen=seen, values=True)


def find_field_conflict(
    current: LockVersionMixin, seen_version: int, seen: Mapping[str, str], changed: Iterable[str]
) -> Conflict | None:
    """The conflict of an edit of the fields ``changed`` (what the person changed, against what that
    person was shown: :func:`changed_from_seen`) with the row as it is now: None unless one of them was
    written after ``seen_version`` (issue 53: edits of different fields never conflict). It lists only
    those fields, with the value now; a surface writes nothing then. ``seen`` as in :func:`find_conflict`.
    """
    overlapping = written_since(current, seen_version, changed)
    if not overlapping:
        return None
    return changes_since(current, seen_version, overlapping, seen=seen, values=True, every=True)


def changed_from_seen(instance: models.Model, seen: Mapping[str, str], names: Iterable[str]) -> list[str]:
    """The fields among ``names`` whose value on ``instance`` (the person's edit, set on it) differs from
    the digest the person was shown (``seen``, from an edit token); a field the token has no digest of
    counts as changed."""
    return [
        name for name in reported_fields(type(instance), names) if not digest_matches(instance, name, seen.get(name))
    ]


def written_since(current: LockVersionMixin, seen_version: int, names: Iterable[str]) -> list[str]:
    """The fields among ``names`` written after ``seen_version`` (a full save counts for every field)."""
    return [name for name in reported_fields(type(current), names) if current.field_version(name) > seen_version]


def changes_since(
    current: LockVersionMixin,
    seen_version: int,
    fields: Iterable[str] | None = None,
    *,
    seen: Mapping[str, str] | None = None,
    values: bool = True,
    every: bool = False,
) -> Conflict:
    """The fields among ``fields`` (default: every field but the primary key and the versions) whose
    value differs from what was seen at ``seen_version``.

    With ``seen`` (digests, as in an edit token or an ETag) a field is listed if its value differs from
    its digest; without, or for a field ``seen`` does not name, if it was written after ``seen_version``
    (its version is newer: after a full ``save()`` that is every field). ``values=False`` names the
    fields without their values, for a surface that does not show them. ``every``: all of ``fields``,
    whatever their value now (a surface that found them written since).
    """
    model = type(current)
    names = reported_fields(model, fields)
    changed = []
    for name in names:
        if every:
            pass
        elif seen is not None and name in seen:
            if digest_matches(current, name, seen[name]):
                continue
        elif current.field_version(name) <= seen_version:
            continue
        changed.append(name)
    writers = _writers(current, changed)
    changes = []
    for name in changed:
        model_field = _field(model, name)
        assert model_field is not None
        request_id, changed_at = writers.get(name, (None, None))
        seen_digest = seen.get(name) if values and seen is not None else None
        changes.append(
            FieldChange(
                name=name,
                label=str(model_field.verbose_name).capitalize(),
                now=model_field.value_from_object(current) if values else NOT_SHOWN,
                seen=NOT_SHOWN if seen_digest is None else _seen_value(current, model_field, seen_digest),
                request_id=request_id,
                changed_at=changed_at,
                version=current.field_version(name),
                field=model_field,
            )
        )
    return Conflict(
        str(model._meta.verbose_name).capitalize(), current.pk, seen_version, current.lock_version, tuple(changes)
    )


def reported_fields(model: type[models.Model], names: Iterable[Any] | None = None) -> list[str]:
    """The names among ``names`` (default: every field of ``model``) that are concrete, non-primary-key
    fields a person can see change, once each, in order (the versions kept by safeupdates are left out:
    they move on every write)."""
    if names is None:
        names = [f.name for f in model._meta.concrete_fields]
    result: list[str] = []
    for name in names:
        model_field = _field(model, name)
        if model_field is not None and model_field.name not in result:
            result.append(model_field.name)
    return result


def _field(model: type[models.Model], name: Any) -> models.Field[Any, Any] | None:
    """The reportable field ``name`` of ``model``, or None (no such field, a relation without a column,
    the primary key, or a version field)."""
    if not isinstance(name, str):
        return None
    try:
        model_field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return None
    if not isinstance(model_field, models.Field) or not model_field.concrete or model_field.primary_key:
        return None
    return None if model_field.name in _BOOKKEEPING else model_field


def _writers(current: LockVersionMixin, names: Sequence[str]) -> dict[str, tuple[UUID, datetime | None]]:
    """The applied request that wrote each of ``names`` as it is now, where one did.

    A field carries the version of its last write, and versions are unique: the request with that
    version, if it changed that field, wrote it; any other write (a save) did not come from the log.
    Never by matching values: a later save may set a request's value again.
    """
    by_version: dict[int, list[str]] = {}
    for name in names:
        by_version.setdefault(current.field_version(name), []).append(name)
    if not by_version:
        return {}
    found = (
        ProcessedRequest.objects.using(current._state.db)
        .filter(
            kind=RequestKind.UPDATE,
            content_type=ContentType.objects.db_manager(current._state.db).get_for_model(current),
            object_id=str(current.pk),
            status=RequestStatus.APPLIED,
            version__in=list(by_version),
        )
        .values_list("version", "changes", "request_id", "processed_at")
    )
    writers = {}
    for version, changes, request_id, processed_at in found:
        for name in by_version[version or 0]:
            if isinstance(changes, dict) and name in changes:
                writers[name] = (request_id, processed_at)
    return writers


def _seen_value(current: models.Model, model_field: models.Field[Any, Any], digest: str) -> Any:
    """The value whose digest is ``digest``, where the field allows only a few (a boolean, choices):
    the server can tell which one was seen without the token carrying it. Else :data:`NOT_SHOWN`."""
    candidates: list[Any]
    if model_field.choices:
        candidates = [value for value, _label in model_field.flatchoices]
    elif isinstance(model_field, models.BooleanField):
        candidates = [True, False]
    else:
        return NOT_SHOWN
    if model_field.null:
        candidates.append(None)
    if len(candidates) > _FEW_VALUES:
        return NOT_SHOWN
    for value in candidates:
        if any(constant_time_compare(_digest(current, model_field, value, key), digest) for key in _keys()):
            return value
    return NOT_SHOWN


# -- values shown ------------------------------------------------------------------------------------------


def shown_text(model_field: models.Field[Any, Any], value: Any) -> str:
    """``value`` for a message: as Python writes a plain value (``True``, ``'ann'``, ``5``), else as
    the field writes it out (a file's name, a date in ISO format)."""
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    return _text(model_field, value)


def json_value(model_field: models.Field[Any, Any], value: Any) -> Any:
    """``value`` in a form JSON can encode: a plain value as it is, a JSON field's value as it is,
    anything else as the field writes it out (``value_to_string``)."""
    if value is None or isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
        return value
    if isinstance(model_field, models.JSONField):
        return json.loads(json.dumps(value, default=str))  # JSON already, but for what its encoder took
    return _text(model_field, value)
