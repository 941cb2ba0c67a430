"""Guarded writes and row locks: :class:`SafeUpdateQuerySet` and :class:`SafeUpdateManager`.

Layered like django-model-utils: :class:`SafeUpdateQuerySetMixin` can be mixed into your own QuerySet,
and :data:`SafeUpdateManager` is ``Manager.from_queryset(SafeUpdateQuerySet)``.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from asgiref.sync import sync_to_async
from django.db import OperationalError, connections, models, transaction

from safeupdates import signals
from safeupdates.database.clock import database_now
from safeupdates.database.errors import is_lock_unavailable
from safeupdates.database.registry import content_type_of, request_log, spans_tables
from safeupdates.database.transactions import in_transaction, local_lock_timeout
from safeupdates.exceptions import InvalidUpdate, LockUnavailable
from safeupdates.lifecycle import (
    MISSING_TARGET,
    STATUS_OF_OUTCOME,
    RequestLogQuerySet,
    Result,
    Target,
    listened,
)
from safeupdates.versions import ensure_issued, next_version
from safeupdates.write.guard import write_if_newer
from safeupdates.write.outcome import Outcome, outcome_of_write
from safeupdates.write.validation import (
    clean_changes,
    clean_pk,
    clean_request_id,
    clean_synced_at,
    clean_version,
    object_id_of,
    recorded_changes,
    shown,
)

if TYPE_CHECKING:
    from safeupdates.models import ProcessedRequest
    from safeupdates.write.bulk import BulkResult

__all__ = ["Outcome", "SafeUpdateManager", "SafeUpdateQuerySet", "SafeUpdateQuerySetMixin", "UpdateResult"]

_M = TypeVar("_M", bound=models.Model)


@dataclass(frozen=True)
class UpdateResult:
    """The result of :meth:`SafeUpdateQuerySet.update_if_newer`."""

    applied: bool
    outcome: Outcome
    version: int | None


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
        using = self.db  # asked of the router once: every statement of this call goes there
        pk = clean_pk(self.model, pk)
        cleaned = clean_changes(self.model, changes, using=using)
        rid = None
        if request_id is not None:
            rid = clean_request_id(request_id)
            object_id_of(self.model, pk)  # the request is recorded under the key as text
        if version is not None:
            version = clean_version(version)
            return self._apply(using, pk, cleaned, version=version, request_id=rid)
        # The skew is measured against the database's clock, not this process's.
        synced_at = clean_synced_at(synced_at, now=database_now(using))
        return self._apply(using, pk, cleaned, synced_at=synced_at, request_id=rid)

    def bulk_update_if_newer(self, updates: Iterable[tuple[Any, int, dict[str, Any]]]) -> BulkResult:
        """Apply many ``(pk, version, changes)`` updates with the per-field semantics of
        :meth:`update_if_newer`, in one statement per batch; updates of one row merge by version.
        Returns the counts of applied, stale and missing updates."""
        from safeupdates.write.bulk import bulk_update_if_newer

        return bulk_update_if_newer(self, updates)  # type: ignore[arg-type]

    async def aupdate_if_newer(self, pk: Any, /, **kwargs: Any) -> UpdateResult:
        """Async :meth:`update_if_newer`, for async views."""
        return await sync_to_async(self.update_if_newer)(pk, **kwargs)

    def _apply(
        self,
        using: str,
        pk: Any,
        cleaned: dict[str, Any],
        *,
        version: int | None = None,
        synced_at: datetime | None = None,
        request_id: uuid.UUID | None = None,
    ) -> UpdateResult:
        connection = connections[using]
        if version is not None:
            ensure_issued(version, using)
        if (
            request_id is not None
            and version is not None
            and connection.vendor == "postgresql"
            and not spans_tables(self.model)
        ):
            outcome = _recording_log(using).apply_recorded(
                self.model, pk, cleaned, version=version, request_id=request_id, connection=connection
            )
            if outcome is not None:
                return UpdateResult(outcome is Outcome.APPLIED, outcome, version)
            # The request id is known: a duplicate, or a pending request from enqueue_update; or a
            # concurrent call claimed it first. The claiming path below tells which.
        log = None if request_id is None else RequestLogQuerySet(request_log(), using=using)

        # In autocommit, one guarded statement is atomic by itself (PostgreSQL, one table, version
        # given, nothing to record): no transaction around it, which would cost two more round trips.
        # In the caller's transaction the savepoint stays, so that an error leaves it usable.
        one_statement = (
            request_id is None
            and version is not None
            and connection.vendor == "postgresql"
            and not in_transaction(connection)
            and not spans_tables(self.model)
        )
        with nullcontext() if one_statement else transaction.atomic(using=using):
            record = None
            if log is not None and request_id is not None:
                content_type = content_type_of(self.model, using)
                changes = json.loads(log.encode_changes(recorded_changes(self.model, cleaned)))
                record = log.reserve(request_id, content_type, str(pk), changes)
                if record.is_terminal:
                    log.report_duplicate(self.model, pk, record)
                    return UpdateResult(False, Outcome.DUPLICATE, record.version)
            if synced_at is not None:
                version = next_version(using)
            assert version is not None
            values = {name: (value, version) for name, value in cleaned.items()}
            written = write_if_newer(self.model, pk, values, connection, synced_at=synced_at)
            outcome = outcome_of_write(
                written is not None, lambda: self.model._base_manager.db_manager(using).filter(pk=pk).exists()
            )
            if log is not None and record is not None:
                self._record(log, record, pk, version, outcome, sorted(written or ()), synced_at)
        return UpdateResult(written is not None, outcome, version)

    def _record(
        self,
        log: RequestLogQuerySet,
        record: ProcessedRequest,
        pk: Any,
        version: int,
        outcome: Outcome,
        written: list[str],
        synced_at: datetime | None,
    ) -> None:
        """Record the outcome of reserved request ``record``, with the version it was written at."""
        held: dict[str, int] = {}
        if outcome is not Outcome.MISSING and listened(self.model):
            held = log.held_versions(self.model, pk, record.changes, written, None)
        error = MISSING_TARGET if outcome is Outcome.MISSING else ""
        status = STATUS_OF_OUTCOME[outcome]
        result = Result(record, status, tuple(written), held, error, version=version, synced_at=synced_at)
        log.finish([result], Target(self.model, pk, log.db))

    @contextmanager
    def with_lock(self, pk: Any, *, nowait: bool = False, timeout: float | None = None) -> Iterator[_M]:
        """Lock row ``pk`` (``SELECT ... FOR UPDATE``) in a transaction; yield it.

        The lock is held until that transaction ends: on exit, or, inside a transaction of the caller's
        (an ``atomic()`` block or autocommit turned off), when the caller's transaction ends. An error
        out of the block rolls its savepoint back, which on PostgreSQL releases at once a lock the block
        took (not one the caller's transaction already held).

        ``nowait=True`` fails at once if another transaction holds the lock; ``timeout`` (seconds) waits
        at most that long, through PostgreSQL's own ``lock_timeout``. Both raise
        :class:`~safeupdates.exceptions.LockUnavailable`. A missing row raises ``Model.DoesNotExist``.
        On SQLite there are no row locks: the database is locked as a whole by the first write.
        """
        if timeout is not None and not _lock_wait(timeout):
            raise InvalidUpdate(
                f"timeout must be a positive number of seconds of at most {MAX_LOCK_TIMEOUT:g} (PostgreSQL's "
                f"longest lock_timeout), got {shown(timeout)}; for no limit, pass timeout=None."
            )
        pk = clean_pk(self.model, pk)
        self._for_write = True
        with transaction.atomic(using=self.db):
            # Only this lock waits that long; the caller's later statements keep their own timeout.
            with local_lock_timeout(self.db, timeout):
                try:
                    instance = self.select_for_update(nowait=nowait).get(pk=pk)  # type: ignore[attr-defined]
                except OperationalError as exc:
                    if is_lock_unavailable(exc):
                        signals.lock_unavailable.send_robust(sender=self.model, surface="with_lock", using=self.db)
                        how = "nowait=True" if nowait else f"timeout={timeout}s"
                        raise LockUnavailable(
                            f"{self.model._meta.label} pk={pk!r} is locked by another transaction ({how}); "
                            "retry later, or wait longer with a larger timeout."
                        ) from exc
                    raise
            yield instance


#: The longest ``with_lock(timeout=...)``, in seconds: PostgreSQL's ``lock_timeout`` is at most 2**31 - 1 ms.
MAX_LOCK_TIMEOUT = 2_147_483.647


def _lock_wait(timeout: Any) -> bool:
    """Whether ``timeout`` is a number of seconds that ``lock_timeout`` can hold (not a bool, not text)."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float | Decimal):
        return False
    if isinstance(timeout, Decimal) and not timeout.is_finite():
        return False  # a Decimal NaN raises on comparison
    return bool(0 < timeout <= MAX_LOCK_TIMEOUT)  # a float NaN fails both comparisons


def _recording_log(using: str) -> RequestLogQuerySet:
    return _log_queryset(request_log(), using)


@functools.cache
def _log_queryset(model: type[models.Model], using: str) -> RequestLogQuerySet:
    """The request log's queryset on a database, for :meth:`RequestLogQuerySet.apply_recorded`, which
    neither evaluates nor changes it: made once per request log model and database, not once per call."""
    return RequestLogQuerySet(model, using=using)


class SafeUpdateQuerySet(SafeUpdateQuerySetMixin[_M], models.QuerySet[_M]):
    """QuerySet with guarded, versioned, idempotent writes and row locks."""


SafeUpdateManager = models.Manager.from_queryset(SafeUpdateQuerySet)
SafeUpdateManager.__doc__ = "Manager of a ``SafeUpdateModel``: ``Manager.from_queryset(SafeUpdateQuerySet)``."
