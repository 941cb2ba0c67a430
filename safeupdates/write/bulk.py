"""Many guarded writes at once: :func:`bulk_update_if_newer`.

The per-field semantics are those of :meth:`SafeUpdateQuerySet.update_if_newer`: a field is written
only if the version of its own last write (else the version under ``"*"``, else 0) is lower than the
incoming version, and a row that is written gets a fresh ``lock_version`` (a change token). Several
updates of one row are merged in Python first (per field, the highest version wins), so every row
appears once; the merged rows are then written with one statement per batch on PostgreSQL, and with
one guarded write per row (:func:`safeupdates.write.guard.write_if_newer`) inside the same transaction
elsewhere and for multi-table inheritance.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from safeupdates.database import statements
from safeupdates.database.cursors import fetch_all
from safeupdates.database.internals import explicit_database
from safeupdates.database.registry import concrete_field, holds_versions, spans_tables
from safeupdates.database.statements import stored_version
from safeupdates.exceptions import InvalidUpdate
from safeupdates.versions import ensure_issued
from safeupdates.write.guard import write_if_newer
from safeupdates.write.merge import newest_per_field
from safeupdates.write.validation import clean_changes, clean_pk, clean_version

#: Rows (after merging) written by one statement. 500 rows of a few fields stay far below
#: PostgreSQL's 65,535 bind parameters and keep each statement's lock set small.
DEFAULT_BATCH_SIZE = 500


@dataclass(frozen=True)
class BulkResult:
    """Counts of the input updates of :func:`bulk_update_if_newer`, by outcome.

    ``applied``: at least one of the update's fields was written. ``stale``: none was, because the row
    already carried a newer write of each field, or because newer updates of the same batch
    superseded it. ``missing``: no row has that primary key. The three add up to the number of updates.
    """

    applied: int = 0
    stale: int = 0
    missing: int = 0

    @property
    def total(self) -> int:
        """The number of input updates."""
        return self.applied + self.stale + self.missing


@dataclass
class Row:
    """The merged updates of one row: per field, the winning ``(version, input index, value)``."""

    pk: Any
    winners: dict[str, tuple[int, int, Any]]
    indexes: list[int]


def bulk_update_if_newer(
    queryset: models.QuerySet[Any],
    updates: Iterable[tuple[Any, int, Mapping[str, Any]]],
    *,
    batch_size: int | None = None,
) -> BulkResult:
    """Apply many ``(pk, version, changes)`` updates to ``queryset``'s model, per field, if newer.

    Promises the outcome of calling ``update_if_newer(pk, version=version, **changes)`` for every
    update in ascending version order (updates of equal version: in input order), in whatever order
    or chunks the updates are given: the same field values, ``field_versions`` and ``lock_version``.
    Every update is validated first; one bad update raises
    :class:`~safeupdates.exceptions.InvalidUpdate` naming its position, and nothing is written. The
    writes run in one transaction, with one statement per ``batch_size`` rows on PostgreSQL (rows are
    locked in primary key order, so concurrent bulk calls do not deadlock each other). Like
    ``update_if_newer``, the queryset's filters are not applied: rows are addressed by primary key.
    """
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise InvalidUpdate(f"batch_size must be a positive integer, got {batch_size!r}.")
    model = queryset.model
    if not holds_versions(model):
        raise InvalidUpdate(f"{model._meta.label} has no per-field versions: give it LockVersionMixin.")
    # The queryset's explicit database (using()), else the router's database for writes.
    using = explicit_database(queryset) or router.db_for_write(model)
    rows = _merge(model, updates, using)
    if not rows:
        return BulkResult()
    try:
        ensure_issued(max(version for row in rows.values() for version, _i, _v in row.winners.values()), using)
    except InvalidUpdate as exc:
        raise InvalidUpdate(f"{exc} Nothing was written.") from exc
    connection = connections[using]
    size = batch_size or DEFAULT_BATCH_SIZE
    # Rows in primary key order: a stable lock order across batches and across concurrent callers.
    ordered = sorted(rows.values(), key=lambda row: row.pk)
    written: dict[int, bool] = {}  # input index -> applied?
    missing = 0
    with transaction.atomic(using=using):
        for start in range(0, len(ordered), size):
            batch = ordered[start : start + size]
            if connection.vendor == "postgresql" and not spans_tables(model):
                outcome = write_rows(model, batch, connection)
            else:
                outcome = _write_per_row(model, batch, connection)
            for row in batch:
                fields = outcome.get(row.pk)
                if fields is None:
                    missing += len(row.indexes)
                    continue
                winning = {row.winners[name][1] for name in fields}
                for index in row.indexes:
                    written[index] = index in winning
    applied = sum(written.values())
    return BulkResult(applied=applied, stale=len(written) - applied, missing=missing)


def _merge(
    model: type[models.Model], updates: Iterable[tuple[Any, int, Mapping[str, Any]]], using: str
) -> dict[Any, Row]:
    """Validate every update and merge them per row and field; raise InvalidUpdate on the first bad one."""
    if isinstance(updates, (str, bytes, Mapping)):
        raise InvalidUpdate(f"updates must be an iterable of (pk, version, changes) tuples, got {updates!r}.")
    try:
        items = list(updates)
    except TypeError:
        raise InvalidUpdate(f"updates must be an iterable of (pk, version, changes) tuples, got {updates!r}.") from None
    rows: dict[Any, Row] = {}
    merged: dict[Any, list[tuple[int, int, dict[str, Any]]]] = {}
    for index, item in enumerate(items):
        try:
            if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 3:
                raise InvalidUpdate(f"expected a (pk, version, changes) tuple, got {item!r}.")
            raw_pk, raw_version, changes = item
            if not isinstance(changes, Mapping):
                raise InvalidUpdate(f"changes must be a mapping of field names to values, got {changes!r}.")
            pk = clean_pk(model, raw_pk)
            version = clean_version(raw_version)
            cleaned = clean_changes(model, changes, using=using)
        except InvalidUpdate as exc:
            raise InvalidUpdate(f"updates[{index}]: {exc} Nothing was written.") from exc
        if pk not in rows:
            rows[pk], merged[pk] = Row(pk, {}, []), []
        rows[pk].indexes.append(index)
        merged[pk].append((version, index, cleaned))
    for pk, row in rows.items():
        row.winners = newest_per_field(merged[pk])
    return rows


def write_rows(
    model: type[models.Model], batch: Sequence[Row], connection: BaseDatabaseWrapper
) -> dict[Any, tuple[str, ...]]:
    """Write ``batch`` in one statement (PostgreSQL, a model whose fields live in one table; the rows in
    primary key order); return, per existing row, the fields it wrote."""
    fields = tuple(sorted({name for row in batch for name in row.winners}))
    statement = statements.bulk_update(model, fields)
    prepare = [concrete_field(model, name).get_db_prep_save for name in fields]
    params: list[Any] = []
    for row in batch:
        cells = []
        for name, prep in zip(fields, prepare, strict=True):
            winner = row.winners.get(name)
            cells.append(None if winner is None else (prep(winner[2], connection), winner[0]))
        params += statement.row_params(row.pk, cells)
    result = fetch_all(connection, statement.sql(len(batch)), params)
    return {pk: tuple(name for name, ok in zip(fields, flags, strict=True) if ok) for pk, *flags in result}


def _write_per_row(
    model: type[models.Model], batch: Sequence[Row], connection: BaseDatabaseWrapper
) -> dict[Any, tuple[str, ...]]:
    """Portable fallback, and the path of multi-table inheritance: read the batch's versions, then one
    guarded write per row that has news.

    Runs inside the caller's transaction; on SQLite the first write locks the whole database, so the
    versions read cannot change before the writes. Each write is guarded again anyway.
    """
    stored: dict[Any, Any] = dict(
        model._base_manager.db_manager(connection.alias)
        .filter(pk__in=[row.pk for row in batch])
        .values_list("pk", "field_versions")
    )
    outcome: dict[Any, tuple[str, ...]] = {}
    for row in batch:
        if row.pk not in stored:
            continue
        # Only the fields that pass: the write then reports exactly those.
        values = {
            name: (value, version)
            for name, (version, _index, value) in row.winners.items()
            if stored_version(stored[row.pk], name) < version
        }
        written = write_if_newer(model, row.pk, values, connection) if values else None
        outcome[row.pk] = tuple(sorted(written or ()))
    return outcome
