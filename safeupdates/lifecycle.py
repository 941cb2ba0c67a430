"""A request's lifecycle: every status a row of the request log takes, and every change of it.

A request is created ``pending`` (:meth:`RequestLogQuerySet.create_pending`, or
:meth:`~RequestLogQuerySet.reserve` for ``update_if_newer(request_id=...)``; the rows of ``@idempotent``
tasks and batch items by :meth:`~RequestLogQuerySet.create_pending_rows`), claimed by its job
(:meth:`~RequestLogQuerySet.claim`), and ends ``applied``, ``stale`` or ``rejected``
(:meth:`~RequestLogQuerySet.finish`, or in one statement with the write:
:meth:`~RequestLogQuerySet.apply_recorded`, and with the claim too:
:meth:`~RequestLogQuerySet.finish_at_once`), or ``failed`` once transient errors outlast its retries
(:meth:`~RequestLogQuerySet.fail`). ``safeupdates_relay --retry-failed`` makes a failed request pending
again (:meth:`~RequestLogQuerySet.revive`), the admin's re-drive a failed or rejected one
(:meth:`~RequestLogQuerySet.redrive`); ``safeupdates_purge`` deletes terminal ones
(:meth:`~RequestLogQuerySet.purge`). A request submitted or delivered again once terminal is a
``duplicate``: reported (:meth:`~RequestLogQuerySet.report_duplicate`), never stored. The rows of
``@idempotent`` tasks and batch items end through :meth:`~RequestLogQuerySet.complete`.

Nothing else writes ``status`` (``tests/test_layout.py`` checks it), and the statements it runs are
those of :mod:`safeupdates.database.statements`. Every outcome of an update request is logged (one INFO
line, logger ``safeupdates.lifecycle``) and signalled (:mod:`safeupdates.signals`) once its transaction
commits. The mapping between a write's :class:`Outcome` (:mod:`safeupdates.write.outcome`) and a
request's :class:`RequestStatus` is written here, once.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import IntegrityError, connections, models, transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Cast, Now, RowNumber
from django.utils.translation import gettext_lazy as _

from safeupdates import delivery, signals
from safeupdates.database import statements
from safeupdates.database.cursors import execute, fetch_all, fetch_one
from safeupdates.database.registry import concrete_field, content_type_of, model_of
from safeupdates.database.transactions import after_commit, in_transaction
from safeupdates.exceptions import InvalidUpdate
from safeupdates.versions import next_version
from safeupdates.write.outcome import Outcome
from safeupdates.write.validation import recorded_changes

if TYPE_CHECKING:
    from django.contrib.contenttypes.models import ContentType
    from django.db.backends.base.base import BaseDatabaseWrapper

    from safeupdates.models import ProcessedRequest

__all__ = [
    "MISSING_TARGET",
    "STATUS_OF_OUTCOME",
    "RequestLogQuerySet",
    "Result",
    "Target",
    "listened",
    "outcome_of_status",
    "target_of",
]

logger = logging.getLogger("safeupdates.lifecycle")


class RequestStatus(models.TextChoices):
    """Status of a :class:`~safeupdates.models.ProcessedRequest`. Every status but ``pending`` is terminal."""

    PENDING = "pending", _("pending")
    APPLIED = "applied", _("applied")
    STALE = "stale", _("stale")
    REJECTED = "rejected", _("rejected")
    FAILED = "failed", _("failed")


class RequestKind(models.TextChoices):
    """What a :class:`~safeupdates.models.ProcessedRequest` records."""

    UPDATE = "update", _("update of a row")
    TASK = "task", _("idempotent task")
    BATCH_ITEM = "batch_item", _("batch item")


TERMINAL_STATUSES = frozenset(RequestStatus) - {RequestStatus.PENDING}


#: The status a request is recorded with for the outcome of its write. A duplicate is not recorded.
STATUS_OF_OUTCOME: Mapping[Outcome, RequestStatus] = {
    Outcome.APPLIED: RequestStatus.APPLIED,
    Outcome.STALE: RequestStatus.STALE,
    Outcome.MISSING: RequestStatus.REJECTED,
}

#: The error of a request whose target row does not exist.
MISSING_TARGET = "the target object does not exist"

#: What the one-statement write of ``update_if_newer(request_id=...)`` records, by name (see
#: ``statements.GuardedUpdate.recorded_params``).
_RECORDED = {
    "kind": RequestKind.UPDATE.value,
    "applied": RequestStatus.APPLIED.value,
    "stale": RequestStatus.STALE.value,
    "missing": STATUS_OF_OUTCOME[Outcome.MISSING].value,
    "missing_error": MISSING_TARGET,
}

#: What the apply job's one statement records, by name (``statements.GuardedUpdate.claimed_params``).
_CLAIMED = {**_RECORDED, "pending": RequestStatus.PENDING.value}

#: Concludes a record's requests from what its write did: ``(written, stored, row_exists)``, where
#: ``written`` is ``{field: request pk}`` of the fields written (None: nothing), ``stored`` the row's
#: ``field_versions`` after the write (before it, if nothing was written; None: no row).
Conclude = Callable[[dict[str, int] | None, dict[str, Any] | None, bool], list["Result"]]


#: The other way round: the outcome of a write recorded with a status, by the status's value.
_OUTCOME_OF_STATUS: Mapping[str, Outcome] = {status.value: outcome for outcome, status in STATUS_OF_OUTCOME.items()}


def outcome_of_status(status: str) -> Outcome:
    """The :class:`Outcome` of a write recorded with ``status`` (``applied``, ``stale`` or ``rejected``)."""
    try:
        return _OUTCOME_OF_STATUS[status]
    except KeyError:
        raise ValueError(f"no write outcome is recorded as {status!r}") from None


class Recorded(NamedTuple):
    """What the outcome signal of a request recorded in one statement (``update_if_newer(request_id=)``)
    needs to know of it: the statement returned no row of the log, and none is read back."""

    request_id: uuid.UUID
    version: int
    pk: None = None
    kind: str = RequestKind.UPDATE


@dataclass(frozen=True)
class Result:
    """The outcome decided for one request: its ``status``, the ``fields`` it wrote and the ones ``held``
    by newer writes (``{field: version}``), or its ``error``. ``version`` and ``synced_at`` are recorded
    too where given (a request that ``update_if_newer`` reserved without them)."""

    request: ProcessedRequest | Recorded
    status: RequestStatus
    fields: tuple[str, ...] = ()
    held: Mapping[str, int] = field(default_factory=dict)
    error: str = ""
    version: int | None = None
    synced_at: datetime | None = None


@dataclass(frozen=True)
class Target:
    """The record a set of requests targets, as the signals name it."""

    model: type[models.Model]
    pk: Any
    using: str


class RequestLogQuerySet(models.QuerySet["ProcessedRequest"]):
    """The request log's QuerySet: every change of a request's status is one of its methods."""

    # --- created pending -----------------------------------------------------------------------------

    def create_pending(self, record: ProcessedRequest) -> tuple[bool, bool]:
        """Insert update request ``record`` as ``pending`` with a fresh version.

        Returns ``(created, others_pending)``: ``created`` is False if the request id exists already
        (nothing written); ``others_pending`` says whether other requests of the same record were
        pending, which in a burst means that the record's job is most likely still queued (a hint for
        the delivery, nothing more). On PostgreSQL one statement
        (:func:`~safeupdates.database.statements.insert_pending`): the version comes from the sequence
        inside it, and a known request id is skipped by ``ON CONFLICT DO NOTHING``, so the caller's
        transaction stays usable without a savepoint.
        """
        using = self.db
        record.kind, record.status = RequestKind.UPDATE, RequestStatus.PENDING
        connection = connections[using]
        if connection.vendor != "postgresql":
            try:
                with transaction.atomic(using=using):
                    record.version = next_version(using)
                    record.save(using=using, force_insert=True)
            except IntegrityError:
                if not self.filter(request_id=record.request_id).exists():
                    raise
                return False, False
            others = self.filter(
                kind=RequestKind.UPDATE,
                status=RequestStatus.PENDING,
                content_type_id=record.content_type_id,
                object_id=record.object_id,
            ).exclude(pk=record.pk)
            return True, others.exists()
        changes = self.model._meta.get_field("changes").get_db_prep_save(record.changes, connection)
        sql, params = statements.insert_pending(
            request_id=record.request_id,
            content_type_id=record.content_type_id,
            object_id=record.object_id,
            changes=changes,
            queue=record.queue,
            kind=RequestKind.UPDATE.value,
            status=RequestStatus.PENDING.value,
        )
        row = fetch_one(connection, sql, params, prepared=True)
        if row is None:
            return False, False
        record.pk, record.version, record.created_at, others_pending = row
        record._state.adding = False
        record._state.db = using
        return True, bool(others_pending)

    def create_pending_rows(
        self, rows: Iterable[ProcessedRequest], *, kind: RequestKind, ignore_conflicts: bool = False
    ) -> list[ProcessedRequest]:
        """Insert ``rows`` of ``kind`` (an ``@idempotent`` task's row, a batch's items) as ``pending``: the
        first status of every row of the log is written here, as every later one is. ``ignore_conflicts``:
        ``ON CONFLICT DO NOTHING`` (a task's row that exists already, on its unique key)."""
        pending = []
        for row in rows:
            row.kind, row.status = kind, RequestStatus.PENDING
            pending.append(row)
        return self.bulk_create(pending, ignore_conflicts=ignore_conflicts)

    def reserve(
        self, request_id: uuid.UUID, content_type: ContentType, object_id: str, changes: dict[str, Any]
    ) -> ProcessedRequest:
        """Insert update request ``request_id`` if it is new, then lock its row: a concurrent call with
        the same id waits here until the first one's transaction ends, then finds it terminal.

        Raises :class:`~safeupdates.exceptions.InvalidUpdate` if the id belongs to another record or
        kind, or to a pending request with other changes (applying ours would lose its own).
        """
        self.bulk_create(
            [self.model(request_id=request_id, content_type=content_type, object_id=object_id, changes=changes)],
            ignore_conflicts=True,
        )
        try:
            record = self.select_for_update().get(request_id=request_id)
        except self.model.DoesNotExist:
            # Neither inserted nor there: SQLite's INSERT OR IGNORE skips a row that breaks any constraint
            # (a CHECK, NOT NULL), not only a known request id. The database refused it, as PostgreSQL
            # says with an error.
            raise IntegrityError(
                f"the request log refused update request {request_id}: its row breaks a constraint of the "
                f"table {self.model._meta.db_table}."
            ) from None
        if record.kind != RequestKind.UPDATE or (record.content_type_id, record.object_id) != (
            content_type.pk,
            object_id,
        ):
            raise InvalidUpdate(f"request_id {request_id} was already used for another object.")
        if not record.is_terminal and record.changes != changes:
            raise InvalidUpdate(
                f"request_id {request_id} is a pending request with other changes ({record.changes}); "
                "let its job apply it, or use a new request id."
            )
        return record

    def pending_of(self, request_id: uuid.UUID, limit: int) -> list[ProcessedRequest]:
        """Up to ``limit`` pending update requests of the record that request ``request_id`` targets,
        oldest version first, read without a lock (:meth:`finish_at_once` claims them). On PostgreSQL
        one prepared statement (:func:`~safeupdates.database.statements.pending_of_record`), with only
        the columns the apply job reads."""
        connection = connections[self.db]
        if connection.vendor != "postgresql":
            return list(self._pending_of(request_id).order_by("version")[:limit])
        sql = statements.pending_of_record(RequestStatus.PENDING.value)
        rows = fetch_all(connection, sql, {"request_id": request_id, "limit": limit}, prepared=True)
        names = [self.model._meta.get_field(name).attname for name in statements.PENDING_COLUMNS]  # type: ignore[union-attr]
        changes = self.model._meta.get_field("changes")
        found = []
        for row in rows:
            request = self.model.from_db(self.db, names, row)
            request.changes = changes.from_db_value(request.changes, None, connection)  # type: ignore[union-attr,arg-type]
            found.append(request)
        return found

    def claim(self, request_id: uuid.UUID, limit: int) -> list[ProcessedRequest]:
        """Lock up to ``limit`` pending update requests of the record that request ``request_id``
        targets, oldest version first; rows another job holds are skipped (``SKIP LOCKED``)."""
        return list(self._pending_of(request_id).select_for_update(skip_locked=True).order_by("version")[:limit])

    def _pending_of(self, request_id: uuid.UUID) -> RequestLogQuerySet:
        target = self.filter(request_id=request_id)
        return self.filter(
            status=RequestStatus.PENDING,
            content_type_id=models.Subquery(target.values("content_type_id")[:1]),
            object_id=models.Subquery(target.values("object_id")[:1]),
        )

    def waiting_records(
        self, queue: str, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, str, uuid.UUID]]:
        """Up to ``limit`` records with pending update requests on ``queue``, in key order after ``after``
        (a ``(content_type_id, object_id)``): ``(content_type_id, object_id, request_id)`` of each, with
        one of its pending requests (for a job sweeping other records, :mod:`safeupdates.pipeline.apply`)."""
        pending = self.filter(
            status=RequestStatus.PENDING, kind=RequestKind.UPDATE, queue=queue, content_type__isnull=False
        )
        if after is not None:
            content_type_id, object_id = after
            pending = pending.filter(
                models.Q(content_type_id__gt=content_type_id)
                | models.Q(content_type_id=content_type_id, object_id__gt=object_id)
            )
        # One row per record (GROUP BY, in the order of the pending index), with one of its request ids:
        # any one serves to claim them all. As text: PostgreSQL has no min() of uuid.
        records = (
            pending.values("content_type_id", "object_id")
            .order_by("content_type_id", "object_id")
            .annotate(request_id=models.Min(Cast("request_id", output_field=models.CharField())))
        )
        return [(row["content_type_id"], row["object_id"], uuid.UUID(row["request_id"])) for row in records[:limit]]

    def claim_records(self, records: Sequence[tuple[int, str]], limit: int) -> list[ProcessedRequest]:
        """:meth:`claim` for several records (``(content_type_id, object_id)`` each) at once: up to
        ``limit`` pending update requests of each, oldest version first, in key order."""
        if not records:
            return []
        # The object ids of each content type as one list: an index condition of the pending index
        # (content_type_id, object_id, version), where an OR of pairs would be a filter over every
        # pending request of the content type.
        by_type: dict[int, list[str]] = {}
        for content_type_id, object_id in records:
            by_type.setdefault(content_type_id, []).append(object_id)
        of_records = models.Q()
        for content_type_id, object_ids in by_type.items():
            of_records |= models.Q(content_type_id=content_type_id, object_id__in=object_ids)
        pending = self.filter(of_records, status=RequestStatus.PENDING, kind=RequestKind.UPDATE)
        ranked = pending.annotate(
            rank=models.Window(
                RowNumber(),
                partition_by=[F("content_type_id"), F("object_id")],
                order_by=F("version").asc(),
            )
        ).filter(rank__lte=limit)
        # The ranking first, then the lock of what it chose, by primary key: as one statement (the
        # ranking a subquery of the lock) the planner, misled by a burst the statistics have not seen
        # yet, ran the ranking again for every pending request of the page (390 ms for a page of 50
        # records among 18,000 pending requests; as two, 13 ms before the statistics catch up and
        # 1.5 ms after).
        # The status is checked again by the locking statement itself: PostgreSQL re-reads a row that
        # another job finished since the ranking read it, and only the WHERE of the locking statement
        # decides whether that newer version is still ours to lock (as in claim()). Without it, a
        # request another job had just applied was claimed again, and marked stale.
        chosen = list(ranked.values_list("pk", flat=True))
        if not chosen:
            return []
        return list(
            pending.filter(pk__in=chosen)
            .select_for_update(skip_locked=True)
            .order_by("content_type_id", "object_id", "version")
        )

    def claim_orphan(self, request_id: uuid.UUID) -> ProcessedRequest | None:
        """Lock pending update request ``request_id`` if it names no model (it matches no record)."""
        return (
            self.filter(request_id=request_id, kind=RequestKind.UPDATE, status=RequestStatus.PENDING, content_type=None)
            .select_for_update(skip_locked=True)
            .first()
        )

    # --- outcomes --------------------------------------------------------------------------------------

    def finish(self, results: Sequence[Result], target: Target | None) -> dict[str, int]:
        """Record ``results`` (applied, stale, rejected), each attempt counted, in the current transaction.

        Once it commits, every update request's outcome is logged and signalled (``target`` names its
        record; None: a request that names no model, logged only). Returns the count per status.
        """
        return self.finish_many([(results, target)])

    def finish_many(self, outcomes: Sequence[tuple[Sequence[Result], Target | None]]) -> dict[str, int]:
        """:meth:`finish` for the requests of several records at once: ``(results, target)`` per record,
        recorded by the same statements."""
        results = [result for of_record, _target in outcomes for result in of_record]
        # One UPDATE per (error, version, synced_at): a job's applied and stale requests share one.
        groups: dict[tuple[str, int | None, datetime | None], list[Result]] = {}
        for result in results:
            if result.status not in TERMINAL_STATUSES - {RequestStatus.FAILED}:
                raise ValueError(f"finish() records applied, stale or rejected, not {result.status!r}")
            groups.setdefault((result.error, result.version, result.synced_at), []).append(result)
        for (error, version, synced_at), members in groups.items():
            statuses = {result.status for result in members}
            status: Any = Value(members[0].status)
            if len(statuses) > 1:
                status = Case(
                    *(
                        When(pk__in=[r.request.pk for r in members if r.status == one], then=Value(one))
                        for one in sorted(statuses)
                    )
                )
            update: dict[str, Any] = {
                "status": status,
                "error": error,
                "attempts": F("attempts") + 1,
                "processed_at": Now(),
            }
            if version is not None:
                update.update(version=version, synced_at=synced_at)
            self.filter(pk__in=[result.request.pk for result in members]).update(**update)
        latencies = self._latencies(
            [r for of_record, target in outcomes if target is not None and listened(target.model) for r in of_record]
        )
        for of_record, target in outcomes:
            self._announce(of_record, target, latencies=latencies)
        counts: dict[str, int] = {}
        for result in results:
            counts[result.status] = counts.get(result.status, 0) + 1
        return counts

    def finish_at_once(
        self,
        target: Target,
        requests: Sequence[ProcessedRequest],
        winners: Mapping[str, tuple[int, int, Any]],
        conclude: Conclude,
    ) -> dict[str, int] | None:
        """Claim ``requests`` (pending update requests of ``target``'s record, read by :meth:`pending_of`),
        write ``winners`` (``{field: (version, request pk, value)}``, the newest value per field) with the
        guard, and record each request's outcome: one prepared statement, one round trip
        (``statements.GuardedUpdate.claimed_sql``), in autocommit (PostgreSQL, a model whose fields live
        in one table). The outcomes are logged and signalled as :meth:`finish`'s, from the results that
        ``conclude`` draws from the write; the statuses are those the statement recorded.

        Returns the count per status, or None if some request was not claimed (another job holds it, or
        finished it since the read): nothing was written or recorded then. A value the database refuses
        raises, with nothing written.
        """
        connection = connections[self.db]
        model, pk = target.model, target.pk
        fields = tuple(sorted(winners))
        statement = statements.guarded_update(model, fields, connection)
        assert statement.claimed_sql is not None
        prepared = [
            (concrete_field(model, name).get_db_prep_save(winners[name][2], connection), winners[name][0])
            for name in fields
        ]
        params = statement.claimed_params(
            pk,
            prepared,
            requests=[request.pk for request in requests],
            winners=[winners[name][1] for name in fields],
            recorded=_CLAIMED,
        )
        whole, after, before, recorded, row_exists = fetch_one(connection, statement.claimed_sql, params, prepared=True)
        if not whole:
            return None
        versions = after if after is not None else before
        stored = None if versions is None else statement.load_versions(versions)
        written = None
        if after is not None:
            assert stored is not None
            written = {name: winners[name][1] for name in fields if stored.get(name) == winners[name][0]} or None
        statuses = {pk_: RequestStatus(status) for pk_, status, _seconds in recorded}
        results = [
            result if result.status == statuses[result.request.pk] else _with_status(result, statuses)
            for result in conclude(written, stored, bool(row_exists))
        ]
        latencies = {pk_: max(0.0, float(seconds)) for pk_, _status, seconds in recorded}
        self._announce(results, target, latencies=latencies)
        counts: dict[str, int] = {}
        for status in statuses.values():
            counts[status] = counts.get(status, 0) + 1
        return counts

    def apply_recorded(
        self,
        model: type[models.Model],
        pk: Any,
        cleaned: dict[str, Any],
        *,
        version: int,
        request_id: uuid.UUID,
        connection: BaseDatabaseWrapper | None = None,
    ) -> Outcome | None:
        """Write ``cleaned`` to row ``pk`` and record update request ``request_id`` in one prepared
        statement, one round trip (PostgreSQL, a model whose fields live in one table). ``connection``:
        that of this queryset's database, if the caller holds it already.

        Returns the write's outcome, or None if the request id is known (or was claimed by a concurrent
        call: the statement then failed on the unique request id and wrote nothing; the caller takes
        the path of :meth:`reserve`).
        """
        if connection is None:
            connection = connections[self.db]
        fields = tuple(sorted(cleaned))
        statement = statements.guarded_update(model, fields, connection)
        assert statement.recorded_sql is not None
        prepared = [
            (model._meta.get_field(name).get_db_prep_save(cleaned[name], connection), version)  # type: ignore[union-attr]
            for name in fields
        ]
        params = statement.recorded_params(
            pk,
            prepared,
            request_id=request_id,
            content_type_id=content_type_of(model, self.db).pk,
            version=version,
            changes_json=self.encode_changes(recorded_changes(model, cleaned)),
            recorded=_RECORDED,
        )
        # In the caller's transaction a failed statement needs a savepoint to roll back to; in
        # autocommit the statement is its own transaction.
        savepoint = transaction.atomic(using=self.db) if in_transaction(connection) else nullcontext()
        try:
            with savepoint:
                status, versions = fetch_one(connection, statement.recorded_sql, params, prepared=True)
        except IntegrityError as exc:
            # Only the log's unique request id means "claimed concurrently"; a constraint of the
            # target table is the caller's error.
            if getattr(getattr(exc.__cause__, "diag", None), "table_name", None) != self.model._meta.db_table:
                raise
            return None
        if status is None:
            return None
        outcome = outcome_of_status(status)
        if not _status_heard(status):
            # No log line would be written, no receiver would run: which fields were written, and
            # which were held, would be computed for nothing.
            return outcome
        stored = None if versions is None else statement.load_versions(versions)
        # A field was written by this request iff it now carries exactly its version: versions are unique.
        written = tuple(name for name in fields if stored is not None and stored.get(name) == version)
        held: dict[str, int] = {}
        if outcome is not Outcome.MISSING and len(written) < len(fields) and listened(model):
            held = self.held_versions(model, pk, fields, written, stored)
        error = MISSING_TARGET if outcome is Outcome.MISSING else ""
        result = Result(Recorded(request_id, version), RequestStatus(status), written, held, error)
        self._announce([result], Target(model, pk, self.db), latency=0.0)  # created and processed at once
        return outcome

    def changes_encoder(self) -> type[json.JSONEncoder]:
        """The JSON encoder of the log's ``changes``, as the field declares it."""
        encoder: type[json.JSONEncoder] = self.model._meta.get_field("changes").encoder  # type: ignore[union-attr,assignment]
        return encoder

    def encode_changes(self, cleaned: Mapping[str, Any]) -> str:
        """``cleaned`` as the log's ``changes`` holds it: JSON text, by the field's encoder."""
        return _encoder(self.changes_encoder()).encode(cleaned)  # type: ignore[arg-type]  # mypy: a class is no Hashable

    def fail(self, request_id: uuid.UUID, error: str, *, final: bool) -> None:
        """Count a failed attempt of pending request ``request_id``; if no retry follows (``final``), mark
        it ``failed``: transient errors (an outage) outlasted its retries, and nothing of it was written."""
        update: dict[str, Any] = {"error": error[:2000], "attempts": F("attempts") + 1}
        if final:
            update.update(status=RequestStatus.FAILED, processed_at=Now())
        if not self.filter(request_id=request_id, status=RequestStatus.PENDING).update(**update) or not final:
            return
        record = self.filter(request_id=request_id).first()
        target = None if record is None else target_of(record, self.db)
        if record is not None:
            result = Result(record, RequestStatus.FAILED, error=record.error)
            self._announce([result], target)

    def revive(self) -> list[int]:
        """Make this queryset's ``failed`` update requests ``pending`` again; return their primary keys.

        A request fails when transient errors outlast its retries (a long outage); its write was rolled
        back with them, so delivering it again is safe.
        """
        failed = self.filter(kind=RequestKind.UPDATE, status=RequestStatus.FAILED)
        revived = list(failed.values_list("pk", flat=True))
        failed.filter(pk__in=revived).update(status=RequestStatus.PENDING, processed_at=None)
        return revived

    def redrive(self) -> list[ProcessedRequest]:
        """Make this queryset's ``failed`` and ``rejected`` update requests of a record ``pending`` again, in
        the current transaction; return those it changed (their ids, record and queue only).

        Neither outcome wrote anything, so applying the request again is safe: a failed one had its write
        rolled back with its errors, a rejected one was refused whole. Its version stays, so it is applied
        in version order among the record's requests, as if it were late. The rows are locked first: of two
        concurrent re-drives of a request, only one changes it (the other finds it pending, and skips it).
        """
        redrivable = models.Q(
            kind=RequestKind.UPDATE,
            status__in=[RequestStatus.FAILED, RequestStatus.REJECTED],
            content_type__isnull=False,
        )
        # The ids first: this queryset may join (an admin's select_related of the nullable content type),
        # and FOR UPDATE cannot lock the nullable side of an outer join.
        ids = list(self.filter(redrivable).values_list("pk", flat=True))
        log = RequestLogQuerySet(self.model, using=self.db).filter(redrivable, pk__in=ids)
        with transaction.atomic(using=self.db):
            chosen = list(
                log.select_for_update().order_by("pk").only("pk", "request_id", "content_type_id", "object_id", "queue")
            )
            log.filter(pk__in=[row.pk for row in chosen]).update(status=RequestStatus.PENDING, processed_at=None)
        return chosen

    def complete(self, error: str = "") -> int:
        """Mark this queryset's task or batch-item rows ``applied`` (``error`` empty) or ``failed`` with
        ``error``, counting the attempt. Returns how many rows changed."""
        status = RequestStatus.FAILED if error else RequestStatus.APPLIED
        return self.update(status=status, error=error[:2000], attempts=F("attempts") + 1, processed_at=Now())

    def report_duplicate(self, model: type[models.Model], pk: Any, record: ProcessedRequest) -> None:
        """Report that terminal request ``record`` was submitted or delivered again: logged and signalled
        (:data:`~safeupdates.signals.request_duplicate`) after the current transaction commits; nothing
        is stored."""
        result = Result(record, RequestStatus(record.status))
        self._announce([result], Target(model, pk, self.db), duplicate=True)

    def purgeable(self, scope: str, cutoff: datetime, statuses: tuple[str, ...] | None = None) -> RequestLogQuerySet:
        """The rows :meth:`purge` deletes for ``scope`` and ``cutoff``: terminal (of ``statuses``, where
        given: each outcome is kept for its own time), and older than ``cutoff`` (requests by
        ``created_at``; ``@idempotent`` task rows by ``processed_at``, the time since which no run of the
        task needed them)."""
        old = self.filter(status__in=TERMINAL_STATUSES if statuses is None else statuses)
        if scope == statements.PURGE_TASKS:
            return old.filter(kind=RequestKind.TASK, processed_at__lt=cutoff)
        return old.exclude(kind=RequestKind.TASK).filter(created_at__lt=cutoff)

    def purge(
        self, scope: str, cutoff: datetime, batch_size: int, statuses: tuple[str, ...] | None = None
    ) -> Iterator[int]:
        """Delete the :meth:`purgeable` rows of ``scope`` (and ``statuses``), ``batch_size`` at a time;
        yield each batch's count.

        Each batch is one short statement in its own transaction (in autocommit) that skips rows another
        transaction holds (:func:`~safeupdates.database.statements.purge_batch`): writers never wait for a purge,
        and a purge stopped between batches keeps what it deleted. A pending request is never deleted.
        """
        connection = connections[self.db]
        statement = statements.purge_batch(connection.vendor, scope, statuses)
        cutoff_param = connection.ops.adapt_datetimefield_value(cutoff)
        after: tuple[Any, ...] = ()
        while True:
            params = statement.params(cutoff_param, batch_size, after)
            if connection.vendor == "postgresql":
                row = fetch_one(connection, statement.after if after else statement.first, params)
                if row is None:
                    return
                count, after = row[0], tuple(row[1:])
            else:
                with transaction.atomic(using=self.db):
                    ids = [row[0] for row in fetch_all(connection, statement.first, params)]
                    if not ids:
                        return
                    count = execute(connection, statement.delete, {**params, "ids": json.dumps(ids)})
            yield count

    # --- what the outcomes tell ------------------------------------------------------------------------

    def held_versions(
        self,
        model: type[models.Model],
        pk: Any,
        fields: Iterable[str],
        written: Iterable[str],
        stored: Mapping[str, Any] | None,
    ) -> dict[str, int]:
        """``{field: version}`` of ``fields`` not ``written``, as row ``pk``'s ``field_versions`` hold them
        (``stored``; None: read them now, only if a field was not written)."""
        rest = [name for name in fields if name not in set(written)]
        if not rest:
            return {}
        if stored is None:
            row = model._base_manager.db_manager(self.db).filter(pk=pk).values_list("field_versions", flat=True)
            stored = row.first()
        return {name: statements.stored_version(dict(stored or {}), name) for name in rest}

    def _announce(
        self,
        results: Sequence[Result],
        target: Target | None,
        *,
        duplicate: bool = False,
        latency: float | None = None,
        latencies: Mapping[int, float] | None = None,
    ) -> None:
        """After commit: one log line per update request's outcome, and its outcome signal (with its
        ``latency``, else its entry in ``latencies``, else read now if the signals have receivers)."""
        updates = [r for r in results if r.request.kind == RequestKind.UPDATE]
        if not updates or not _heard(updates, duplicate):
            return  # no log line would be written, no receiver would run: nothing to do after the commit
        using, job_id = self.db, delivery.current_job_id()
        if latencies is None:
            listening = not duplicate and latency is None and target is not None and listened(target.model)
            latencies = self._latencies(updates if listening else [])

        def announce() -> None:
            label = "unknown model" if target is None else target.model._meta.label
            for result in updates:
                outcome = "duplicate" if duplicate else str(result.status)
                request = result.request
                # A request reserved by update_if_newer() gets its version with its outcome.
                version = request.version if result.version is None else result.version
                level = logging.WARNING if outcome in _WARNED else logging.INFO
                signal = signals.OUTCOME_SIGNALS[outcome]
                if logger.isEnabledFor(level):
                    detail = f" fields={','.join(result.fields)}" if result.fields else ""
                    logger.log(
                        level,
                        "safeupdates: request %s %s: %s pk=%s version=%s%s%s",
                        request.request_id,
                        outcome,
                        label,
                        None if target is None else target.pk,
                        version,
                        detail,
                        f": {result.error}" if result.error else "",
                        extra={
                            "request_id": str(request.request_id),
                            "model": label,
                            "pk": None if target is None else target.pk,
                            "version": version,
                            "outcome": outcome,
                        },
                    )
                if target is None or not signal.receivers:
                    continue  # no receiver at all; send_robust() asks for those of this sender
                if duplicate:
                    seconds = None
                elif request.pk is None:  # recorded in one statement: its latency came with it
                    seconds = latency
                else:
                    seconds = latencies.get(request.pk)
                signal.send_robust(
                    sender=target.model,
                    pk=target.pk,
                    request_id=request.request_id,
                    version=version,
                    fields=result.fields,
                    held=dict(result.held),
                    job_id=job_id,
                    using=using,
                    latency=seconds,
                )

        after_commit(announce, using)

    def _latencies(self, results: Sequence[Result]) -> dict[int, float]:
        """Seconds from created to processed of the update requests of ``results`` (one read; none if
        there are none), by the database's clock, as the rows hold it: processed_at was set by this
        transaction."""
        pks = [r.request.pk for r in results if r.request.kind == RequestKind.UPDATE and r.request.pk is not None]
        latencies: dict[int, float] = {}
        if not pks:
            return latencies
        for pk, created_at, processed_at in self.filter(pk__in=pks).values_list("pk", "created_at", "processed_at"):
            if created_at is not None and processed_at is not None:
                latencies[pk] = max(0.0, (processed_at - created_at).total_seconds())
        return latencies


def _with_status(result: Result, statuses: Mapping[Any, RequestStatus]) -> Result:
    """``result`` with the status the statement recorded for its request: the record is the truth (the
    two agree, by one rule kept in SQL and in ``conclude``; ``tests/test_apply_at_once.py`` checks it)."""
    logger.error(
        "safeupdates: request %s was recorded %s, concluded %s",
        result.request.request_id,
        statuses[result.request.pk],
        result.status,
    )
    return Result(result.request, statuses[result.request.pk], result.fields, result.held, result.error)


@functools.cache
def _encoder(cls: type[json.JSONEncoder]) -> json.JSONEncoder:
    """One instance of each encoder class, as ``json.dumps(..., cls=cls)`` makes it (it holds no state)."""
    return cls()


#: Outcomes whose log line is a WARNING; the others' are INFO.
_WARNED = frozenset({"rejected", "failed"})


def _heard(updates: Sequence[Result], duplicate: bool) -> bool:
    """Whether an outcome of ``updates`` would be heard: its log line is enabled at its level, or its
    signal has a receiver (of any sender: asking for the target's would cost more than it saves)."""
    for result in updates:
        outcome = "duplicate" if duplicate else str(result.status)
        if signals.OUTCOME_SIGNALS[outcome].receivers:
            return True
        if logger.isEnabledFor(logging.WARNING if outcome in _WARNED else logging.INFO):
            return True
    return False


def _status_heard(status: str) -> bool:
    """:func:`_heard` of one update request recorded with ``status``: its signal has a receiver (of any
    sender), or its log line is enabled."""
    if signals.OUTCOME_SIGNALS[status].receivers:
        return True
    return logger.isEnabledFor(logging.WARNING if status in _WARNED else logging.INFO)


def listened(model: type[models.Model]) -> bool:
    """True if any outcome signal has a receiver for ``model``: only then is more read than the write needs."""
    return any(signal.has_listeners(model) for signal in signals.OUTCOME_SIGNALS.values())


def target_of(record: ProcessedRequest, using: str) -> Target | None:
    """The record that update request ``record`` targets, if its model still exists."""
    model = model_of(record.content_type_id, using)
    if model is None:
        return None
    try:
        pk = model._meta.pk.to_python(record.object_id)  # type: ignore[union-attr]
    except Exception:  # a corrupt object id: the signal carries it as stored
        pk = record.object_id
    return Target(model, pk, using)
