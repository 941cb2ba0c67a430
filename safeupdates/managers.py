"""Guarded writes and row locks: :class:`SafeUpdateQuerySet` and :class:`SafeUpdateManager`.

Layered like django-model-utils: :class:`SafeUpdateQuerySetMixin` can be mixed into your own QuerySet,
and :data:`SafeUpdateManager` is ``Manager.from_queryset(SafeUpdateQuerySet)``.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from asgiref.sync import sync_to_async
from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, OperationalError, connections, models, transaction
from django.db.models.functions import Now

from safeupdates.db import database_now, is_lock_unavailable, local_lock_timeout
from safeupdates.exceptions import InvalidUpdate, LockUnavailable
from safeupdates.guard import statement_cursor, write_if_newer
from safeupdates.meta import request_log, spans_tables
from safeupdates.statements import guarded_update
from safeupdates.validation import (
    clean_changes,
    clean_object_id,
    clean_pk,
    clean_request_id,
    clean_synced_at,
    clean_version,
)
from safeupdates.versions import ensure_issued, next_version

if TYPE_CHECKING:
    from safeupdates.bulk import BulkResult
    from safeupdates.models import ProcessedRequest

__all__ = ["Outcome", "SafeUpdateManager", "SafeUpdateQuerySet", "SafeUpdateQuerySetMixin", "UpdateResult"]

_M = TypeVar("_M", bound=models.Model)


class Outcome(enum.StrEnum):
    """What an update did."""

    APPLIED = "applied"
    """At least one field was written."""
    STALE = "stale"
    """Every field already carried a newer write (or the timestamp was not newer): nothing written."""
    DUPLICATE = "duplicate"
    """The request id was already processed: nothing written."""
    MISSING = "missing"
    """No row has that primary key: nothing written."""


@dataclass(frozen=True)
class UpdateResult:
    """The result of :meth:`SafeUpdateQuerySet.update_if_newer`."""

    applied: bool
    outcome: Outcome
    version: int | None


_OUTCOME_OF_STATUS = {"applied": Outcome.APPLIED, "stale": Outcome.STALE, "rejected": Outcome.MISSING}


class SafeUpdateQuerySetMixin(Generic[_M]):
    """Adds :meth:`update_if_newer` and :meth:`with_lock` to a QuerySet of a ``LockVersionMixin`` model."""

    model: type[_M]
    db: str
    _for_write: bool

    def update_if_newer(
        self,
        pk: Any,
        /,
        *,
        version: int | None = None,
        synced_at: datetime | None = None,
        request_id: uuid.UUID | str | None = None,
        **changes: Any,
    ) -> UpdateResult:
        """Write ``changes`` to row ``pk`` only where they are newer; never raises on a stale write.

        Version mode (``version=``): each field is written only if its own last write carried a lower
        version; if any field is written, ``lock_version`` (a change token) moves to a fresh version, above
        every version written, so no instance loaded before can save over it. Timestamp mode
        (``synced_at=``): applies iff ``last_synced_at`` is NULL or older, then sets it and takes a fresh
        version. With ``request_id`` the call is idempotent: the request is recorded in the request log
        in the same transaction as the write, and a request already processed returns ``duplicate``.
        Bad arguments raise :class:`~safeupdates.exceptions.InvalidUpdate` and write nothing.
        """
        if (version is None) == (synced_at is None):
            raise InvalidUpdate("pass exactly one of version= (version mode) or synced_at= (timestamp mode).")
        self._for_write = True  # as QuerySet.update(): self.db is then the router's database for writes
        pk = clean_pk(self.model, pk)
        cleaned = clean_changes(self.model, changes)
        rid = None
        if request_id is not None:
            rid = clean_request_id(request_id)
            clean_object_id(self.model, pk)  # the request is recorded under the key as text
        if version is not None:
            version = clean_version(version)
            return self._apply(pk, cleaned, version=version, request_id=rid)
        # The skew is measured against the database's clock, not this process's.
        synced_at = clean_synced_at(synced_at, now=database_now(self.db))
        return self._apply(pk, cleaned, synced_at=synced_at, request_id=rid)

    def bulk_update_if_newer(self, updates: Iterable[tuple[Any, int, dict[str, Any]]]) -> BulkResult:
        """Apply many ``(pk, version, changes)`` updates with the per-field semantics of
        :meth:`update_if_newer`, in one statement per batch; updates of one row merge by version.
        Returns the counts of applied, stale and missing updates."""
        from safeupdates.bulk import bulk_update_if_newer

        return bulk_update_if_newer(self, updates)  # type: ignore[arg-type]

    async def aupdate_if_newer(self, pk: Any, /, **kwargs: Any) -> UpdateResult:
        """Async :meth:`update_if_newer`, for async views."""
        return await sync_to_async(self.update_if_newer)(pk, **kwargs)

    def _apply(
        self,
        pk: Any,
        cleaned: dict[str, Any],
        *,
        version: int | None = None,
        synced_at: datetime | None = None,
        request_id: uuid.UUID | None = None,
    ) -> UpdateResult:
        connection = connections[self.db]
        if version is not None:
            ensure_issued(version, self.db)
        if request_id is not None and version is not None and connection.vendor == "postgresql":
            status = self._apply_recorded(pk, cleaned, version, request_id)
            if status is not None:
                return UpdateResult(status == "applied", _OUTCOME_OF_STATUS[status], version)
            # The request id is known: a duplicate, or a pending request from enqueue_update; or a
            # concurrent call claimed it first. The claiming path below tells which.

        # In autocommit, one guarded statement is atomic by itself (PostgreSQL, one table, version
        # given, nothing to record): no transaction around it, which would cost two more round trips.
        # In the caller's transaction the savepoint stays, so that an error leaves it usable.
        one_statement = (
            request_id is None
            and version is not None
            and connection.vendor == "postgresql"
            and not connection.in_atomic_block
            and not spans_tables(self.model)
        )
        with nullcontext() if one_statement else transaction.atomic(using=self.db):
            record = None if request_id is None else self._reserve_request(request_id, pk, cleaned)
            if record is not None and record.is_terminal:
                return UpdateResult(False, Outcome.DUPLICATE, record.version)
            if synced_at is not None:
                version = next_version(self.db)
            assert version is not None
            values = {name: (value, version) for name, value in cleaned.items()}
            written = write_if_newer(self.model, pk, values, connection, synced_at=synced_at) is not None
            if written:
                outcome = Outcome.APPLIED
            elif self.model._default_manager.db_manager(self.db).filter(pk=pk).exists():
                outcome = Outcome.STALE
            else:
                outcome = Outcome.MISSING
            if record is not None:
                self._record(record, version, outcome, synced_at)
        return UpdateResult(written, outcome, version)

    def _apply_recorded(self, pk: Any, cleaned: dict[str, Any], version: int, request_id: uuid.UUID) -> str | None:
        """Record and apply in one prepared statement, one round trip (PostgreSQL, one table).

        Returns the recorded status, or None if the request id is known (or was claimed concurrently:
        the statement then failed on the unique request id and wrote nothing).
        """
        ProcessedRequest = request_log()
        connection = connections[self.db]
        if spans_tables(self.model):
            return None
        fields = tuple(sorted(cleaned))
        statement = guarded_update(self.model, fields, connection)
        assert statement.recorded_sql is not None
        params = statement.recorded_params(
            pk,
            [
                (self.model._meta.get_field(name).get_db_prep_save(cleaned[name], connection), version)  # type: ignore[union-attr]
                for name in fields
            ],
            request_id=request_id,
            content_type_id=ContentType.objects.db_manager(self.db).get_for_model(self.model).pk,
            version=version,
            changes_json=json.dumps(cleaned, cls=_changes_encoder()),
        )
        # In the caller's transaction a failed statement needs a savepoint to roll back to; in
        # autocommit the statement is its own transaction.
        savepoint = transaction.atomic(using=self.db) if connection.in_atomic_block else nullcontext()
        try:
            with savepoint, statement_cursor(connection) as cursor:
                cursor.execute(statement.recorded_sql, params)
                status: str | None = cursor.fetchone()[0]
        except IntegrityError as exc:
            # Only the log's unique request id means "claimed concurrently"; a constraint of the
            # target table is the caller's error.
            if getattr(getattr(exc.__cause__, "diag", None), "table_name", None) != ProcessedRequest._meta.db_table:
                raise
            return None
        return status

    def _reserve_request(self, request_id: uuid.UUID, pk: Any, cleaned: dict[str, Any]) -> ProcessedRequest:
        """Insert the request's log row if it is new, then lock it: a concurrent duplicate waits here."""
        ProcessedRequest = request_log()
        log = ProcessedRequest.objects.using(self.db)
        content_type = ContentType.objects.db_manager(self.db).get_for_model(self.model)
        changes = json.loads(json.dumps(cleaned, cls=_changes_encoder()))
        log.bulk_create(
            [ProcessedRequest(request_id=request_id, content_type=content_type, object_id=str(pk), changes=changes)],
            ignore_conflicts=True,
        )
        record = log.select_for_update().get(request_id=request_id)
        if record.kind != ProcessedRequest.Kind.UPDATE or (record.content_type_id, record.object_id) != (
            content_type.pk,
            str(pk),
        ):
            raise InvalidUpdate(f"request_id {request_id} was already used for another object.")
        if not record.is_terminal and record.changes != changes:
            # A pending request of enqueue_update with other changes: applying ours would lose its own.
            raise InvalidUpdate(
                f"request_id {request_id} is a pending request with other changes ({record.changes}); "
                "let its job apply it, or use a new request id."
            )
        return record

    def _record(
        self, record: ProcessedRequest, version: int, outcome: Outcome, synced_at: datetime | None = None
    ) -> None:
        ProcessedRequest = request_log()
        RequestStatus = ProcessedRequest.Status
        status = RequestStatus.REJECTED if outcome is Outcome.MISSING else RequestStatus(outcome.value)
        error = "the target object does not exist" if outcome is Outcome.MISSING else ""
        ProcessedRequest.objects.using(self.db).filter(pk=record.pk).update(
            status=status,
            error=error,
            version=version,
            synced_at=synced_at,
            attempts=models.F("attempts") + 1,
            processed_at=Now(),
        )

    @contextmanager
    def with_lock(self, pk: Any, *, nowait: bool = False, timeout: float | None = None) -> Iterator[_M]:
        """Lock row ``pk`` (``SELECT ... FOR UPDATE``) in a transaction; yield it; unlock on exit.

        ``nowait=True`` fails at once if another transaction holds the lock; ``timeout`` (seconds) waits
        at most that long, through PostgreSQL's own ``lock_timeout``. Both raise
        :class:`~safeupdates.exceptions.LockUnavailable`. A missing row raises ``Model.DoesNotExist``.
        On SQLite there are no row locks: the database is locked as a whole by the first write.
        """
        if timeout is not None and (isinstance(timeout, bool) or not timeout > 0):
            raise InvalidUpdate(f"timeout must be a positive number of seconds, got {timeout!r}.")
        self._for_write = True
        with transaction.atomic(using=self.db):
            # Only this lock waits that long; the caller's later statements keep their own timeout.
            with local_lock_timeout(self.db, timeout):
                try:
                    instance = self.select_for_update(nowait=nowait).get(pk=pk)  # type: ignore[attr-defined]
                except OperationalError as exc:
                    if is_lock_unavailable(exc):
                        how = "nowait=True" if nowait else f"timeout={timeout}s"
                        raise LockUnavailable(
                            f"{self.model._meta.label} pk={pk!r} is locked by another transaction ({how}); "
                            "retry later, or wait longer with a larger timeout."
                        ) from exc
                    raise
            yield instance


def _changes_encoder() -> type[json.JSONEncoder]:
    """The JSON encoder of the request log's ``changes`` (``ChangesEncoder``), as the field declares it."""
    return request_log()._meta.get_field("changes").encoder  # type: ignore[attr-defined,no-any-return,return-value]


class SafeUpdateQuerySet(SafeUpdateQuerySetMixin[_M], models.QuerySet[_M]):
    """QuerySet with guarded, versioned, idempotent writes and row locks."""


SafeUpdateManager = models.Manager.from_queryset(SafeUpdateQuerySet)
SafeUpdateManager.__doc__ = "Manager of a ``SafeUpdateModel``: ``Manager.from_queryset(SafeUpdateQuerySet)``."
