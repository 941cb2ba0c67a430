"""What a surface (a view, an API, a form, the admin) may tell its client of a value its write refused.

A save refuses, before any statement, a value no column can hold (:class:`~safeupdates.exceptions.InvalidUpdate`):
a NaN, a lone surrogate, an integer out of range. Its message quotes the value (``repr()``, cut short)
and names the field, which is what a developer needs; but the value may be one the client never sees:
a field the view sets itself (a server-computed token, an internal note). :func:`told_refusal` says what
the client is told: the problem with a field the surface shows (its ``conflict_fields``, its
serializer's or its form's fields), and for any other field a generic sentence. The whole message goes to
the server's log (logger ``"safeupdates"``), for the operator.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import models

from safeupdates.conflicts import reported_fields
from safeupdates.exceptions import InvalidUpdate
from safeupdates.write.validation import check_saved

__all__ = ["REFUSED_VALUE", "ToldRefusal", "probe", "told_refusal"]

logger = logging.getLogger("safeupdates")

#: What a client is told of a value it may not see that the write refused.
REFUSED_VALUE = "A value the view set could not be stored (the server's log says which); nothing was written."


@dataclass(frozen=True)
class ToldRefusal:
    """What the client is told: ``detail``, and ``field`` if it names a field the surface shows."""

    detail: str
    field: str | None = None


def told_refusal(
    exc: InvalidUpdate,
    model: type[models.Model],
    shown: Iterable[str] | None,
    *,
    surface: str,
    instance: models.Model | None = None,
    generic: str = REFUSED_VALUE,
) -> ToldRefusal:
    """What a surface showing the fields ``shown`` of ``model`` (None: no field) tells its client of
    ``exc``, raised by a write of its view; the full message is logged (logger ``"safeupdates"``).

    - ``exc`` says which field (``exc.field``, of ``exc.model``) and why (``exc.reason``, which quotes no
      value): the reason, named by the field, if the surface shows it; the reason alone for a refusal that
      is about no field (an edit token, say).
    - Else, with ``instance`` (the record the view wrote), the first field shown whose value the save
      refuses is named, with its message: the client sees that field (it often sent the value itself).
    - Else ``generic`` (:data:`REFUSED_VALUE`), which names nothing.
    """
    names = reported_fields(model, shown) if shown is not None else []
    logger.warning(
        "%s: a write of %s was refused before any statement (%s shown to the client); nothing was written: %s",
        surface,
        model._meta.label,
        ", ".join(names) or "no field",
        exc,
    )
    labels = {model._meta.label, (model._meta.concrete_model or model)._meta.label}
    if exc.reason:
        if exc.field is None:
            return ToldRefusal(exc.reason)
        if exc.field in names and exc.model in labels:
            return ToldRefusal(f"{model._meta.label}.{exc.field} {exc.reason}", exc.field)
    if instance is not None:
        for name in names:
            try:
                check_saved(instance, (name,))
            except InvalidUpdate as found:
                # A field the client sees: its value may be told (cut short, as every message cuts it).
                detail = f"{model._meta.label}.{name} {found.reason}" if found.reason else str(found)
                return ToldRefusal(detail, name)
            except (TypeError, ValueError, AttributeError):  # a value no check knows: say nothing of it
                continue
    return ToldRefusal(generic)


def probe(model: type[models.Model], values: dict[str, Any]) -> models.Model | None:
    """An unsaved ``model`` holding ``values`` (those of its concrete fields), for :func:`told_refusal`
    to check when the record a create would have written is not at hand; None if it cannot be made."""
    fields = {f.name for f in model._meta.concrete_fields} | {f.attname for f in model._meta.concrete_fields}
    try:
        return model(**{name: value for name, value in values.items() if name in fields})
    except (TypeError, ValueError, AttributeError, LookupError):
        return None
