"""How the request log records a change's values: as JSON writes them, or as their field writes them out."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from django.db import models


def recorded_changes(model: type[models.Model], cleaned: Mapping[str, Any]) -> dict[str, Any]:
    """``cleaned`` (from :func:`~safeupdates.write.validation.clean_changes`) as the request log records
    it: a value the log's JSON does not know as the field writes it out (:func:`needs_text_form`)."""
    fields = model._meta
    changes = dict(cleaned)
    for name, value in cleaned.items():
        if value is not None:
            field: Any = fields.get_field(name)
            if needs_text_form(field):
                changes[name] = written_out(field, value)
            elif (encoder := _own_json_encoder(field)) is not None:
                # The JSON the column holds: the log's encoder may know no type the field's knows (a set),
                # or write one otherwise (a decimal as a string); the job writes back what the column held.
                changes[name] = json.loads(json.dumps(value, cls=encoder, allow_nan=False, ensure_ascii=False))
    return changes


@functools.cache
def needs_text_form(field: models.Field[Any, Any]) -> bool:
    """Whether the request log records ``field``'s values as the field writes them out
    (``value_to_string()``, which its ``to_python()`` reads back): bytes, arrays and ranges of them,
    values of a custom field; the others as JSON writes them (:class:`~safeupdates.models.ChangesEncoder`)."""
    if is_array(field):
        base = getattr(field, "base_field", None)
        return base is not None and needs_text_form(base)
    return isinstance(field, models.BinaryField) or is_range(field) or is_custom(field)


def written_out(field: models.Field[Any, Any], value: Any) -> Any:
    """``value`` as ``field`` writes it out (``value_to_string()``)."""
    return field.value_to_string(_Holder(field.attname, value))  # type: ignore[arg-type]


class _Holder:
    """What ``value_to_string(obj)`` reads a value from, for a value on no instance."""

    def __init__(self, name: str, value: Any) -> None:
        setattr(self, name, value)


@functools.cache
def _own_json_encoder(field: models.Field[Any, Any]) -> type[json.JSONEncoder] | None:
    """The encoder of a ``JSONField(encoder=...)`` (None for any other field, and for a JSONField without
    one): its values are recorded as the JSON it writes of them (:func:`recorded_changes`)."""
    target = value_field(field)
    return getattr(target, "encoder", None) if isinstance(target, models.JSONField) else None


def value_field(field: models.Field[Any, Any]) -> models.Field[Any, Any]:
    """The field whose column type ``field`` stores: the target field of a (chain of) relations."""
    while field.is_relation and getattr(field, "target_field", None) is not None:
        field = field.target_field  # type: ignore[attr-defined]
    return field


def is_custom(field: models.Field[Any, Any]) -> bool:
    """Whether ``field`` converts values its own way (a ``to_python`` or ``get_prep_value`` not Django's)."""
    cls = type(field)
    return not (_defined_by_django(cls, "to_python") and _defined_by_django(cls, "get_prep_value"))


def _defined_by_django(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__module__.startswith("django.")
    return True


def is_array(field: models.Field[Any, Any]) -> bool:
    return type(field).__module__.startswith("django.contrib.postgres") and field.get_internal_type() == "ArrayField"


def is_range(field: models.Field[Any, Any]) -> bool:
    return type(field).__module__.startswith("django.contrib.postgres") and hasattr(field, "range_type")
