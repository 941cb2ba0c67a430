"""The per-field rule: :func:`write_if_newer` runs the guarded UPDATE of :mod:`safeupdates.database.statements`.

A field is written only if the version of its own last write is lower than the incoming version; the
version of a field with no entry of its own in ``field_versions`` is the one under ``"*"`` (the last full
``save()``), else 0 (:func:`~safeupdates.database.statements.stored_version`). One statement where the model's
fields live in one table; a child of multi-table inheritance is locked, decided and written per table.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

from safeupdates.database.cursors import fetch_one
from safeupdates.database.registry import concrete_field, spans_tables
from safeupdates.database.statements import guarded_update, next_version_expression, stored_version
from safeupdates.versions import next_version


def write_if_newer(
    model: type[models.Model],
    pk: Any,
    values: dict[str, tuple[Any, int]],
    connection: BaseDatabaseWrapper,
    *,
    synced_at: Any = None,
) -> dict[str, int] | None:
    """Write ``values`` (``{field: (python value, version)}``) to row ``pk`` where each is newer.

    Returns ``{field: version}`` of the fields written, or None if nothing was (every field held a
    newer write, the timestamp was not newer, or there is no such row: ask the table which). Moves
    ``lock_version`` to a fresh version whenever anything is written. One statement where the model's
    fields live in one table; for a child of multi-table inheritance the rows are locked first, the
    guards decided on the locked versions, then each table written. Run it in a transaction.
    """
    if spans_tables(model):
        return _write_across_tables(model, pk, values, connection, synced_at=synced_at)
    fields = tuple(sorted(values))
    statement = guarded_update(model, fields, connection, timestamp=synced_at is not None)
    params = [
        (concrete_field(model, name).get_db_prep_save(values[name][0], connection), values[name][1]) for name in fields
    ]
    lock_version = None if connection.vendor == "postgresql" else next_version(connection.alias)
    row = fetch_one(
        connection,
        statement.sql_returning_versions,
        statement.params(pk, params, synced_at, lock_version=lock_version),
        prepared=True,
    )
    if row is None:
        return None
    stored = statement.load_versions(row[0])
    # A field was written by us iff it now carries exactly our version: versions are unique.
    return {name: version for name, (_value, version) in values.items() if stored.get(name) == version} or None


def _write_across_tables(
    model: type[models.Model],
    pk: Any,
    values: dict[str, tuple[Any, int]],
    connection: BaseDatabaseWrapper,
    *,
    synced_at: Any = None,
) -> dict[str, int] | None:
    """:func:`write_if_newer` for a child of multi-table inheritance: lock, decide, then write each table.

    The child's manager joins the parent table, so the row lock covers both tables and a missing child
    row (a parent that is not of this model) is never written.
    """
    alias = connection.alias
    names = ["field_versions", *(["last_synced_at"] if synced_at is not None else [])]
    locked = model._base_manager.using(alias).select_for_update(no_key=True).filter(pk=pk).values_list(*names).first()
    if locked is None:
        return None
    if synced_at is not None and locked[1] is not None and not locked[1] < synced_at:
        return None
    current = locked[0]
    written = {name: version for name, (_value, version) in values.items() if stored_version(current, name) < version}
    if not written:
        return None
    changes = {name: values[name][0] for name in written}
    changes.update(field_versions={**(current or {}), **written}, lock_version=_next_version_expression(connection))
    if synced_at is not None:
        changes["last_synced_at"] = synced_at
    # One UPDATE per table, each through the model that owns the table.
    by_table: dict[type[models.Model], dict[str, Any]] = {}
    for name, value in changes.items():
        owner = concrete_field(model, name).model._meta.concrete_model
        assert owner is not None
        by_table.setdefault(owner, {})[name] = value
    for table_model, columns in by_table.items():
        table_model._base_manager.using(alias).filter(pk=pk).update(**columns)
    return written


def _next_version_expression(connection: BaseDatabaseWrapper) -> Any:
    """A fresh version as a value of an ORM ``update()``: taken in the statement where the database can."""
    if connection.vendor == "postgresql":
        return next_version_expression()
    return next_version(connection.alias)
