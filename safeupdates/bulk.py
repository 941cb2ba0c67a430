"""Many guarded writes at once: :func:`bulk_update_if_newer`.

The per-field semantics are those of :meth:`SafeUpdateQuerySet.update_if_newer`: a field is written
only if the version of its own last write (else the version under ``"*"``, else 0) is lower than the
incoming version, and ``lock_version`` becomes the highest version written. Several updates of one row
are merged in Python first (per field, the highest version wins), so every row appears once; the
merged rows are then written with one statement per batch on PostgreSQL, and with one guarded
statement per row (through :mod:`safeupdates.guard`) inside the same transaction elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.db import connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from safeupdates.exceptions import InvalidUpdate
from safeupdates.guard import (
    BASE_VERSION_KEY,
    column,
    concrete_field,
    spans_tables,
    stored_version,
    versions_model,
    write_if_newer,
)
from safeupdates.models import LockVersionMixin
from safeupdates.validation import clean_changes, clean_pk, clean_version
from safeupdates.versions import SEQUENCE_NAME, ensure_issued

__all__ = ["DEFAULT_BATCH_SIZE", "BulkResult", "bulk_update_if_newer"]

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
class _Row:
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
    if not issubclass(model, LockVersionMixin):
        raise InvalidUpdate(f"{model._meta.label} has no per-field versions: give it LockVersionMixin.")
    rows = _merge(model, updates)
    if not rows:
        return BulkResult()
    # The queryset's explicit database (using()), else the router's database for writes.
    using = getattr(queryset, "_db", None) or router.db_for_write(model)
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
                outcome = _write_postgresql(model, batch, connection)
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


def _merge(model: type[models.Model], updates: Iterable[tuple[Any, int, Mapping[str, Any]]]) -> dict[Any, _Row]:
    """Validate every update and merge them per row and field; raise InvalidUpdate on the first bad one."""
    if isinstance(updates, (str, bytes, Mapping)):
        raise InvalidUpdate(f"updates must be an iterable of (pk, version, changes) tuples, got {updates!r}.")
    try:
        items = list(updates)
    except TypeError:
        raise InvalidUpdate(f"updates must be an iterable of (pk, version, changes) tuples, got {updates!r}.") from None
    rows: dict[Any, _Row] = {}
    for index, item in enumerate(items):
        try:
            if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 3:
                raise InvalidUpdate(f"expected a (pk, version, changes) tuple, got {item!r}.")
            raw_pk, raw_version, changes = item
            if not isinstance(changes, Mapping):
                raise InvalidUpdate(f"changes must be a mapping of field names to values, got {changes!r}.")
            pk = clean_pk(model, raw_pk)
            version = clean_version(raw_version)
            cleaned = clean_changes(model, changes)
        except InvalidUpdate as exc:
            raise InvalidUpdate(f"updates[{index}]: {exc} Nothing was written.") from exc
        row = rows.get(pk)
        if row is None:
            row = rows[pk] = _Row(pk, {}, [])
        row.indexes.append(index)
        for name, value in cleaned.items():
            # Strictly newer wins: of two updates with the same version, the first one counts, as it
            # would when applied one by one (the second then finds its version already there).
            current = row.winners.get(name)
            if current is None or current[0] < version:
                row.winners[name] = (version, index, value)
    return rows


def _write_postgresql(
    model: type[models.Model], batch: Sequence[_Row], connection: BaseDatabaseWrapper
) -> dict[Any, tuple[str, ...]]:
    """Write ``batch`` in one statement; return, per existing row, the fields it wrote."""
    fields = tuple(sorted({name for row in batch for name in row.winners}))
    prepare = [concrete_field(model, name).get_db_prep_save for name in fields]
    params: list[Any] = []
    for row in batch:
        params.append(row.pk)
        for name, prep in zip(fields, prepare, strict=True):
            winner = row.winners.get(name)
            params += (None, None) if winner is None else (prep(winner[2], connection), winner[0])
    sql = _postgresql_sql(model, fields).format(values=", ".join([_postgresql_row(model, fields)] * len(batch)))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        result = cursor.fetchall()
    return {pk: tuple(name for name, ok in zip(fields, flags, strict=True) if ok) for pk, *flags in result}


def _postgresql_connection() -> BaseDatabaseWrapper:
    # Any PostgreSQL connection quotes and casts the same way.
    return next(c for c in connections.all(initialized_only=False) if c.vendor == "postgresql")


@lru_cache(maxsize=512)
def _postgresql_row(model: type[models.Model], fields: tuple[str, ...]) -> str:
    """One ``(pk, value, version, ...)`` row of the VALUES list; explicit casts type the NULLs too."""
    connection = _postgresql_connection()
    pk_field = model._meta.pk
    assert pk_field is not None
    casts = [f"%s::{pk_field.cast_db_type(connection)}"]  # type: ignore[attr-defined]
    for name in fields:
        casts += (f"%s::{concrete_field(model, name).cast_db_type(connection)}", "%s::bigint")  # type: ignore[attr-defined]
    return f"({', '.join(casts)})"


@lru_cache(maxsize=512)
def _postgresql_sql(model: type[models.Model], fields: tuple[str, ...]) -> str:
    """The batch statement of ``fields`` on ``model``, with a ``{values}`` slot for the VALUES rows.

    The ``locked`` CTE locks the existing rows (in primary key order) and decides each field's guard
    once, on the newest committed row version: ``FOR NO KEY UPDATE`` (the lock an UPDATE takes) waits
    for a concurrent writer and then reads its row, as the UPDATE's own recheck would. The UPDATE
    writes what the guards allow; the outer SELECT returns every existing row with its guard results,
    so that rows that wrote nothing (stale) are told apart from rows that do not exist (missing).
    Guard results come from the locked row, not from comparing versions after the write, so a batch
    run twice reports its second run as stale.
    """
    connection = _postgresql_connection()
    qn = connection.ops.quote_name
    table = qn(versions_model(model)._meta.db_table)
    pk = qn(column(model, "pk"))
    fv = qn(column(model, "field_versions"))
    lock = qn(column(model, "lock_version"))
    # Field names go into SQL only as JSON keys; the VALUES columns get neutral aliases.
    aliases = [(name, f"f{i}") for i, name in enumerate(fields)]

    columns = ", ".join(["pk", *(f"{a}_value, {a}_version" for _name, a in aliases)])
    selected = [f"t.{pk} AS pk"]
    for name, a in aliases:
        stored = f"COALESCE((t.{fv}->>'{name}')::bigint, (t.{fv}->>'{BASE_VERSION_KEY}')::bigint, 0)"
        selected += [f"v.{a}_value", f"v.{a}_version", f"COALESCE({stored} < v.{a}_version, false) AS {a}_ok"]
    sets = []
    for name, a in aliases:
        quoted = qn(column(model, name))
        sets.append(f"{quoted} = CASE WHEN l.{a}_ok THEN l.{a}_value ELSE t.{quoted} END")
    pairs = ", ".join(f"'{name}', CASE WHEN l.{a}_ok THEN l.{a}_version END" for name, a in aliases)
    sets.append(f"{fv} = t.{fv} || jsonb_strip_nulls(jsonb_build_object({pairs}))")
    # A change token, as in update_if_newer: a fresh version for every row that is written.
    sets.append(f"{lock} = nextval('{SEQUENCE_NAME}')")
    any_ok = " OR ".join(f"l.{a}_ok" for _name, a in aliases)
    flags = ", ".join(f"l.{a}_ok" for _name, a in aliases)
    return (
        f"WITH v ({columns}) AS (VALUES {{values}}), "
        f"locked AS (SELECT {', '.join(selected)} FROM {table} t JOIN v ON t.{pk} = v.pk "
        f"ORDER BY t.{pk} FOR NO KEY UPDATE OF t), "
        f"written AS (UPDATE {table} t SET {', '.join(sets)} FROM locked l "
        f"WHERE t.{pk} = l.pk AND ({any_ok})) "
        f"SELECT l.pk, {flags} FROM locked l"
    )


def _write_per_row(
    model: type[models.Model], batch: Sequence[_Row], connection: BaseDatabaseWrapper
) -> dict[Any, tuple[str, ...]]:
    """Portable fallback, and the path of multi-table inheritance: read the batch's versions, then one
    guarded write per row that has news.

    Runs inside the caller's transaction; on SQLite the first write locks the whole database, so the
    versions read cannot change before the writes. Each write is guarded again anyway.
    """
    stored: dict[Any, Any] = dict(
        model._default_manager.db_manager(connection.alias)
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
