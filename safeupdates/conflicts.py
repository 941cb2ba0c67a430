"""What changed since a person (or a client) saw a record: the core of every conflict-safe surface.

A form, a change page or an API response carries an *edit token*: the record's ``lock_version`` and
the values shown, signed with :mod:`django.core.signing` so that a client cannot forge a newer version
(which would let a stale edit through) or other values (which would hide a change). When the edit comes
back, :func:`find_conflict` compares the token with the row as it is now: if the row moved on, the edit
is refused, and :class:`Conflict` says, per field, what the person saw, what is there now, and which
request (or direct save) wrote it and when.

The check that decides is still the database's (``save()``'s ``WHERE lock_version = ...``, or
``update_if_newer``): a conflict found here is reported before writing; one that happens between the
check and the write raises :class:`~safeupdates.exceptions.StaleObjectError` there.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.contenttypes.models import ContentType
from django.core import signing
from django.db import models

from safeupdates.exceptions import InvalidUpdate
from safeupdates.guard import concrete_field
from safeupdates.models import ChangesEncoder, LockVersionMixin, ProcessedRequest, RequestKind, RequestStatus

__all__ = [
    "Conflict",
    "FieldChange",
    "changes_since",
    "edit_token",
    "find_conflict",
    "read_edit_token",
    "stored_form",
    "writer_of",
]

_SALT = "safeupdates.edit-token"
#: Columns that safeupdates keeps for itself: never reported as changed.
_BOOKKEEPING = frozenset({"lock_version", "field_versions", "last_synced_at"})


@dataclass(frozen=True)
class FieldChange:
    """One field that changed after it was shown: the value seen, the value now, and who wrote it."""

    name: str
    label: str
    seen: Any
    now: Any
    #: The request that wrote the value now stored, or None for a direct ``save()`` (or a write that
    #: bypassed the app).
    request_id: UUID | None
    #: When that request was processed (the database's clock), if known.
    changed_at: datetime | None
    #: The version of that write (``field_versions``).
    version: int

    def describe(self) -> str:
        """One line for a person: ``Active: you saw True, now False (request <id> at <time>)``."""
        who = f"request {self.request_id}" if self.request_id else "a direct save"
        when = f" at {self.changed_at:%Y-%m-%d %H:%M:%S %Z}".rstrip() if self.changed_at else ""
        return f"{self.label}: you saw {self.seen!r}, now {self.now!r} ({who}{when})"


@dataclass(frozen=True)
class Conflict:
    """The record moved on since it was seen at ``seen_version``; ``changes`` are the fields that differ.

    ``changes`` may be empty: the row was written (its ``lock_version`` moved) but every field shown
    still holds the value seen, for example when another field changed.
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
            "changes": [
                {
                    "field": change.name,
                    "seen": _jsonable(change.seen),
                    "now": _jsonable(change.now),
                    "request_id": str(change.request_id) if change.request_id else None,
                    "changed_at": change.changed_at.isoformat() if change.changed_at else None,
                    "version": change.version,
                }
                for change in self.changes
            ],
        }


def edit_token(instance: LockVersionMixin, fields: Iterable[str]) -> str:
    """A signed token of ``instance``'s ``lock_version`` and the values of ``fields`` as shown now."""
    names = list(fields)
    payload = {
        "m": instance._meta.label_lower,
        "pk": str(instance.pk),
        "v": instance.lock_version,
        "f": {name: stored_form(instance, name) for name in names},
    }
    return signing.dumps(payload, salt=_SALT, compress=True)


def read_edit_token(token: str, instance: LockVersionMixin) -> tuple[int, dict[str, Any]]:
    """The ``(lock_version, values seen)`` of ``token``; refused unless it was signed for ``instance``.

    Raises :class:`~safeupdates.exceptions.InvalidUpdate` for a token that was tampered with, was made
    for another record, or is not a token at all.
    """
    try:
        payload = signing.loads(token, salt=_SALT)
    except (signing.BadSignature, TypeError, ValueError) as exc:
        raise InvalidUpdate("the edit token is not valid (tampered with, or not one); reload the page.") from exc
    if payload.get("m") != instance._meta.label_lower or payload.get("pk") != str(instance.pk):
        raise InvalidUpdate("the edit token was made for another record; reload the page.")
    version, values = payload.get("v"), payload.get("f")
    if not isinstance(version, int) or not isinstance(values, dict):
        raise InvalidUpdate("the edit token is not valid; reload the page.")
    return version, values


def find_conflict(current: LockVersionMixin, seen_version: int, seen: Mapping[str, Any]) -> Conflict | None:
    """Compare what was seen with ``current`` (the row as loaded now); None if the row did not move.

    ``seen`` maps field names to values in their stored (JSON) form, as :func:`edit_token` records them.
    """
    if current.lock_version == seen_version:
        return None
    model = type(current)
    changes = []
    for name, seen_value in seen.items():
        field = concrete_field(model, name)
        now = stored_form(current, name)
        if now == seen_value:
            continue
        request_id, changed_at = writer_of(current, name, now)
        changes.append(
            FieldChange(
                name=name,
                label=str(field.verbose_name).capitalize(),
                seen=_python(field, seen_value),
                now=getattr(current, field.attname),
                request_id=request_id,
                changed_at=changed_at,
                version=current.field_version(name),
            )
        )
    return Conflict(
        str(model._meta.verbose_name).capitalize(), current.pk, seen_version, current.lock_version, tuple(changes)
    )


def changes_since(current: LockVersionMixin, seen_version: int) -> Conflict:
    """The fields of ``current`` written after version ``seen_version``, from its ``field_versions``.

    For a client that kept only a version (an ETag), not the values it saw: ``seen`` is None. A field
    counts as written since if its version is newer; a full ``save()`` writes every field, so after one
    every field is listed. A request allocated before ``seen_version`` but applied after it carries the
    older version and is not listed: the list is what is known to be newer, the refusal itself does not
    depend on it.
    """
    model = type(current)
    changes = []
    for field in model._meta.concrete_fields:
        if field.primary_key or field.name in _BOOKKEEPING:
            continue
        version = current.field_version(field.name)
        if version <= seen_version:
            continue
        request_id, changed_at = writer_of(current, field.name, stored_form(current, field.name))
        changes.append(
            FieldChange(
                name=field.name,
                label=str(field.verbose_name or field.name).capitalize(),
                seen=None,
                now=getattr(current, field.attname),
                request_id=request_id,
                changed_at=changed_at,
                version=version,
            )
        )
    return Conflict(
        str(model._meta.verbose_name).capitalize(), current.pk, seen_version, current.lock_version, tuple(changes)
    )


def writer_of(current: LockVersionMixin, name: str, now: Any) -> tuple[UUID | None, datetime | None]:
    """The newest applied request that set field ``name`` to the value it holds ``now``, if any.

    A direct ``save()`` after that request rewrites every field with the same value; the request is
    still what changed it, so it is the one named. None when no request set this value (a direct save
    or a write that bypassed the app did).
    """
    newest = (
        ProcessedRequest.objects.using(current._state.db)
        .filter(
            kind=RequestKind.UPDATE,
            content_type=ContentType.objects.db_manager(current._state.db).get_for_model(current),
            object_id=str(current.pk),
            status=RequestStatus.APPLIED,
            changes__has_key=name,
        )
        .order_by("-version")
        .values_list("changes", "request_id", "processed_at")
        .first()
    )
    if newest is None or newest[0].get(name) != now:
        return None, None  # a later direct save (or a write around the app) set another value
    return newest[1], newest[2]


def stored_form(instance: models.Model, name: str) -> Any:
    """The value of field ``name`` as JSON holds it (what the token carries and compares)."""
    field = concrete_field(type(instance), name)
    return json.loads(json.dumps(field.value_from_object(instance), cls=ChangesEncoder))


def _python(field: models.Field[Any, Any], value: Any) -> Any:
    try:
        return field.to_python(value)
    except Exception:  # shown to a person as it was stored
        return value


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=ChangesEncoder))
