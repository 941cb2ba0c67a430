"""The second stage of the job path: :func:`apply_update`, the job that applies a record's requests.

A job applies *every* pending request of its record in one guarded statement (a burst of toggles costs
one write): the requests are claimed (locked), merged per field by version
(:func:`~safeupdates.write.merge.newest_per_field`), written, and their outcomes recorded in the same
transaction through :mod:`safeupdates.lifecycle`, so that running the job again changes nothing. On
PostgreSQL that is two round trips where nothing needs more: the pending requests read, then claimed,
written and recorded in one statement (:meth:`~safeupdates.lifecycle.RequestLogQuerySet.finish_at_once`);
the path with a transaction, a claim and savepoints is taken where something can fail half-way. Whatever
delivered it (:mod:`safeupdates.delivery`): its retries, its id and its queue are the seam's to tell.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections, models, router, transaction

from safeupdates import conf, delivery, signals, tracing
from safeupdates.database.errors import describe_database, is_lock_unavailable, is_transient
from safeupdates.database.registry import model_of, spans_tables
from safeupdates.database.statements import stored_version
from safeupdates.database.transactions import in_transaction
from safeupdates.exceptions import InvalidUpdate, RequestNotFound
from safeupdates.lifecycle import MISSING_TARGET, STATUS_OF_OUTCOME, Result, Target, listened, target_of
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus
from safeupdates.write import bulk
from safeupdates.write.guard import write_if_newer
from safeupdates.write.merge import newest_per_field
from safeupdates.write.outcome import Outcome, outcome_of_write
from safeupdates.write.validation import clean_changes, clean_pk, clean_request_id

logger = logging.getLogger("safeupdates")

#: How many pending requests of one record a job locks and merges at a time.
BATCH_SIZE = 500
#: How many records a sweep takes and applies at a time (one transaction).
SWEEP_PAGE = 50


def apply_update(request_id: str, using: str | None = None) -> str:
    """The apply job: apply pending request ``request_id`` and every other pending request of its record.

    The requests are locked (``SKIP LOCKED``: a concurrent job takes the others), merged per field by
    version, written with one guarded statement, and marked ``applied`` or ``stale`` in the same
    transaction, so running the job again changes nothing (a request already done is reported as a
    duplicate). Requests whose stored data is invalid, or whose value the database refuses (a
    constraint, a trigger: any error that is not :func:`transient <is_transient>`), are ``rejected`` at
    once and the others applied. Transient database errors propagate so that RQ retries the job; the
    request is marked ``failed`` when the retries are spent. A ``request_id`` that is no UUID fails the
    job at once, without retries; one that the worker's database does not hold raises
    :class:`RequestNotFound`. Every log record of the job can carry ``request_id``
    (:class:`safeupdates.tracing.RequestIdFilter`). Returns a one-line summary.

    ``using`` is the database the request is in (a job carries it when it is not ``default``); by
    default the router's database for writes of the log.
    """
    try:
        rid = clean_request_id(request_id)
    except InvalidUpdate:
        delivery.fail_without_retry()
        raise
    using = using or router.db_for_write(ProcessedRequest)
    started = time.monotonic()
    job = delivery.running_job()
    with tracing.job_context(str(rid), None if job is None else job.trace):
        try:
            counts = _apply_record(rid, using, first=True)
        except DatabaseError as exc:
            # Transient (a lost connection, a lock timeout): RQ retries it; the last try marks it failed.
            _record_failed_attempt(rid, using, exc)
            raise
    summary = _summary(counts) or "nothing pending"
    records, swept = _sweep(using, started, None if job is None else job.queue)
    return f"{summary}; swept {records} other record(s): {_summary(swept) or 'nothing pending'}" if records else summary


def _summary(counts: dict[str, int]) -> str:
    return ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))


def _apply_record(rid: uuid.UUID, using: str, *, first: bool) -> dict[str, int]:
    """Apply every pending request of request ``rid``'s record, :data:`BATCH_SIZE` at a time, each
    batch in a transaction of its own; the count per status."""
    if first:
        at_once = _apply_at_once(rid, using)
        if at_once is not None:
            return at_once
    counts: Counter[str] = Counter()
    while True:
        with transaction.atomic(using=using):
            done = _apply_batch(rid, using, first=first)
        first = False
        counts.update(done)
        if sum(done.values()) < BATCH_SIZE:
            return counts


def _apply_at_once(rid: uuid.UUID, using: str) -> dict[str, int] | None:
    """Apply request ``rid``'s record in two round trips, without a transaction of its own: read its
    pending requests, validate and merge them, then claim, write and record them in one statement
    (:meth:`~safeupdates.lifecycle.RequestLogQuerySet.finish_at_once`). The count per status, or None
    where this path does not serve and nothing was written: not PostgreSQL, inside the caller's
    transaction, nothing pending (a duplicate, an orphan: the claiming path tells), a full batch, a
    request to reject, a model whose fields span tables, a request another job claimed meanwhile, or a
    value the database refuses (the claiming path finds which). A transient error propagates, as the
    claiming path's does."""
    connection = connections[using]
    if connection.vendor != "postgresql" or in_transaction(connection):
        return None
    log = ProcessedRequest.objects.using(using)
    batch = log.pending_of(rid, BATCH_SIZE)
    if not batch or len(batch) >= BATCH_SIZE:
        return None
    decision = _validate(batch, using)
    if decision.rejected or not decision.winners or decision.target is None or spans_tables(decision.target.model):
        return None

    def conclude(written: dict[str, int] | None, stored: dict[str, Any] | None, row_exists: bool) -> list[Result]:
        return _conclude(decision, written, using, known=(stored, row_exists))

    try:
        return log.finish_at_once(decision.target, batch, decision.winners, conclude)
    except DatabaseError as exc:
        if is_transient(exc):
            raise
        return None


def _sweep(using: str, started: float, queue_name: str | None) -> tuple[int, dict[str, int]]:
    """Having applied its own record, a job on queue ``queue_name`` applies other records of its queue and
    database whose jobs are still waiting there, taking those jobs off the queue
    (:func:`safeupdates.delivery.take_waiting`, where the backend can: RQ): a burst
    over many records then costs a few jobs (each a fork and a connection), not one per record, and a
    page of records costs one claim and one update of the log, not one of each per record.

    At most ``SAFEUPDATES_SWEEP_RECORDS`` records, and until a quarter of the job's timeout has passed
    since it ``started``. Records of a model with parents (its write spans tables) are left to their
    own jobs, and so is a record whose job a worker has already taken. The sweep never fails its job,
    whose own record is applied: should anything go wrong (the database went away, the job's timeout
    fired), the records it took and did not apply get their jobs back and the sweep ends. Were the
    worker killed mid-sweep, the requests of the records it held stay pending, and the relay delivers
    them. Returns how many records were swept, and the count per status of their requests.
    """
    limit = conf.sweep_records()
    counts: Counter[str] = Counter()
    if limit <= 0 or queue_name is None or not delivery.backend().can_take_waiting:
        return 0, counts
    log = ProcessedRequest.objects.using(using)
    deadline = started + conf.job_timeout() / 4
    swept = 0
    after: tuple[int, str] | None = None
    owed: list[tuple[int, str, uuid.UUID]] = []  # taken, not yet applied: their jobs, if we fail
    try:
        while swept < limit and time.monotonic() < deadline:
            size = min(SWEEP_PAGE, limit - swept)
            page = log.waiting_records(queue_name, after, size)
            if not page:
                break
            after, last_page = page[-1][:2], len(page) < size
            ours = [record for record in page if not _spans_tables(record[0], using)]
            taken = delivery.take_waiting(
                [(content_type_id, object_id) for content_type_id, object_id, _ in ours], using
            )
            owed = [record for record, took in zip(ours, taken, strict=True) if took]
            swept += len(owed)
            done, owed = _apply_records(owed, using)  # owed: those whose rows were held
            counts.update(done)
            _give_back(owed, queue_name, using)
            owed = []
            if last_page:
                break
    except Exception:  # a database error, the job's timeout (RQ raises it in the job), a Redis error ...
        logger.warning(
            "safeupdates: a sweep stopped; the %d record(s) it owed get their jobs back", len(owed), exc_info=True
        )
        _give_back(owed, queue_name, using)
    return swept, counts


def _spans_tables(content_type_id: int, using: str) -> bool:
    """Whether the records of ``content_type_id`` are of a model with parents (multi-table inheritance)."""
    model = model_of(content_type_id, using)
    return model is not None and bool(model._meta.parents)


def _give_back(records: list[tuple[int, str, uuid.UUID]], queue_name: str, using: str) -> None:
    """Enqueue the jobs of records a sweep took and did not apply (if Redis is down: the relay's)."""
    for content_type_id, object_id, request_id in records:
        delivery.deliver_or_leave_for_relay(
            request_id,
            content_type_id,
            object_id,
            queue_name,
            what=f"record {content_type_id}:{object_id}",
            using=using,
        )


def _apply_records(
    records: list[tuple[int, str, uuid.UUID]], using: str
) -> tuple[dict[str, int], list[tuple[int, str, uuid.UUID]]]:
    """Apply the pending requests of several records (``(content_type_id, object_id, request_id)``
    each) in one transaction: one claim, a guarded write per record, one update of the log. Returns the
    count per status, and the records left unapplied.

    The page waits for no row while it holds others (it could deadlock with a transaction that locks
    several rows in another order, and outlive its job's timeout): the rows it writes are locked first
    with ``SKIP LOCKED``, and a record whose row another transaction holds is left unapplied, for its own
    job to wait for. A record with more than :data:`BATCH_SIZE` pending gets the rest applied after the
    page, as its own job would.
    """
    if not records:
        return {}, []
    log = ProcessedRequest.objects.using(using)
    by_record: dict[tuple[int, str], list[ProcessedRequest]] = {}
    with transaction.atomic(using=using):
        for request in log.claim_records([(ct, object_id) for ct, object_id, _ in records], BATCH_SIZE):
            by_record.setdefault((request.content_type_id, request.object_id), []).append(request)  # type: ignore[arg-type]
        held = _lock_rows(list(by_record), using)
        batches = [batch for key, batch in by_record.items() if key in held]
        try:
            # One savepoint for the page's writes, not one per record.
            with transaction.atomic(using=using):
                outcomes = _decide_page(batches, using)
        except DatabaseError as exc:
            if is_transient(exc):
                raise
            # A value the database refuses: again, each record in a savepoint of its own, to find it.
            outcomes = [_decide(batch, using) for batch in batches]
        counts = Counter(log.finish_many(outcomes))
    unheld = [record for record in records if record[:2] in by_record and record[:2] not in held]
    for content_type_id, object_id, request_id in records:
        key = (content_type_id, object_id)
        if key in held and len(by_record[key]) >= BATCH_SIZE:
            counts.update(_apply_record(request_id, using, first=False))
    return counts, unheld


def _lock_rows(records: list[tuple[int, str]], using: str) -> set[tuple[int, str]]:
    """Lock the rows of ``records`` that no other transaction holds (``FOR UPDATE SKIP LOCKED``, one
    statement per model); the records a page may write without waiting. A record whose model or key
    is gone needs no lock (its requests are rejected)."""
    held: set[tuple[int, str]] = set()
    by_model: dict[type[models.Model], dict[Any, tuple[int, str]]] = {}
    for content_type_id, object_id in records:
        model = model_of(content_type_id, using)
        if model is None:
            held.add((content_type_id, object_id))
            continue
        try:
            pk = clean_pk(model, object_id)
        except InvalidUpdate:
            held.add((content_type_id, object_id))
            continue
        by_model.setdefault(model, {})[pk] = (content_type_id, object_id)
    for model, keys in by_model.items():
        rows = model._base_manager.db_manager(using).filter(pk__in=list(keys)).select_for_update(skip_locked=True)
        # A key the database gives back otherwise (a case-insensitive collation) matches none: its
        # record is left unapplied, for its own job.
        held.update(keys[pk] for pk in rows.values_list("pk", flat=True) if pk in keys)
    return held


def _apply_batch(rid: uuid.UUID, using: str, *, first: bool) -> dict[str, int]:
    log = ProcessedRequest.objects.using(using)
    batch = log.claim(rid, BATCH_SIZE)
    if not batch:
        # A request that names no model matches no record: it would stay pending for good.
        orphan = log.claim_orphan(rid)
        if orphan is not None:
            return log.finish([_rejected(orphan, "the request names no model (content_type is NULL).")], None)
        record = log.filter(request_id=rid).first()
        if record is None:
            raise RequestNotFound(
                f"request {rid} is not in database {using!r} ({describe_database(using)}): this worker's "
                "DATABASES differ from those of the process that enqueued it (two projects sharing one RQ "
                "queue?), or the request was purged."
            )
        if first and record.kind == RequestKind.UPDATE and record.is_terminal:
            # Delivered again once done (a redelivery, or a job of a burst another job applied).
            target = target_of(record, using)
            if target is not None:
                log.report_duplicate(target.model, target.pk, record)
        return {}
    return log.finish(*_decide(batch, using))


@dataclass
class _Decision:
    """A record's claimed requests, validated: the ``rejected`` ones, and the ``winners`` per field of
    the ``valid`` ones (``(version, request pk, value)``). ``target`` is None when its content type is
    gone, and ``pk`` None when its object id is not a key of its model: nothing is written then."""

    target: Target | None
    pk: Any = None
    rejected: list[Result] = field(default_factory=list)
    valid: list[tuple[ProcessedRequest, dict[str, Any]]] = field(default_factory=list)
    winners: dict[str, tuple[int, int, Any]] = field(default_factory=dict)


def _decide(batch: list[ProcessedRequest], using: str) -> tuple[list[Result], Target | None]:
    """Write the claimed requests ``batch`` of one record, newest version per field, in a savepoint;
    the outcome of each, and the record they target (None: a content type that is gone)."""
    decision = _validate(batch, using)
    if not decision.winners:
        return decision.rejected, decision.target
    assert decision.target is not None
    try:
        # A savepoint: a value the database refuses (a constraint, a trigger) must not sink the batch.
        with transaction.atomic(using=using):
            written = _write(decision.target.model, decision.pk, decision.winners, using)
    except DatabaseError as exc:
        if is_transient(exc):
            raise  # RQ retries the job; nothing here is the requests' fault
        return [*decision.rejected, *_one_by_one(decision.target.model, decision.pk, decision.valid, using)], (
            decision.target
        )
    return _conclude(decision, written, using), decision.target


def _decide_page(batches: list[list[ProcessedRequest]], using: str) -> list[tuple[list[Result], Target | None]]:
    """:func:`_decide` for the records of a sweep's page, in the caller's savepoint: on PostgreSQL the
    writes of each model's records in one statement (:mod:`safeupdates.write.bulk`'s), not one per record.
    Any database error propagates (the caller then decides record by record)."""
    decisions = [_validate(batch, using) for batch in batches]
    if connections[using].vendor != "postgresql":
        written_per_record = [
            _write(d.target.model, d.pk, d.winners, using) if d.winners and d.target else None for d in decisions
        ]
    else:
        by_model: dict[type[models.Model], list[_Decision]] = {}
        for decision in decisions:
            if decision.winners and decision.target is not None:
                by_model.setdefault(decision.target.model, []).append(decision)
        fields_written: dict[tuple[type[models.Model], Any], tuple[str, ...]] = {}
        for model, members in by_model.items():
            rows = [bulk.Row(d.pk, d.winners, []) for d in sorted(members, key=lambda d: d.pk)]
            for pk, names in bulk.write_rows(model, rows, connections[using]).items():
                fields_written[model, pk] = names
        written_per_record = []
        for d in decisions:
            names = fields_written.get((d.target.model, d.pk), ()) if d.winners and d.target else ()
            written_per_record.append({name: d.winners[name][1] for name in names} or None)
    return [
        (_conclude(d, written, using) if d.winners else d.rejected, d.target)
        for d, written in zip(decisions, written_per_record, strict=True)
    ]


def _validate(batch: list[ProcessedRequest], using: str) -> _Decision:
    """The claimed requests ``batch`` of one record, validated and merged per field: a :class:`_Decision`."""
    model = model_of(batch[0].content_type_id, using)
    if model is None:
        missing = _missing_model(batch[0].content_type_id, using)
        return _Decision(None, rejected=[_rejected(r, f"{missing} no longer exists") for r in batch])

    try:
        pk = clean_pk(model, batch[0].object_id)
    except InvalidUpdate as exc:
        return _Decision(Target(model, batch[0].object_id, using), rejected=[_rejected(r, str(exc)) for r in batch])
    decision = _Decision(Target(model, pk, using), pk)
    for request in batch:
        try:
            if not request.version:
                raise InvalidUpdate("the request has no version.")
            if not isinstance(request.changes, dict):
                raise InvalidUpdate(
                    f"changes must be a JSON object of field: value, not {type(request.changes).__name__}."
                )
            allowed = getattr(model, "safe_update_fields", ())
            cleaned = clean_changes(model, request.changes, allowed=allowed, using=using)
        except InvalidUpdate as exc:
            decision.rejected.append(_rejected(request, str(exc)))
            continue
        decision.valid.append((request, cleaned))
    decision.winners = newest_per_field(
        (request.version or 0, request.pk, cleaned) for request, cleaned in decision.valid
    )
    return decision


def _missing_model(content_type_id: int | None, using: str) -> str:
    """How a request whose model is gone names it: its content type's app and model, or the content type's
    id if that is gone too (the log has no foreign key on content types: see ProcessedRequest.content_type)."""
    from django.contrib.contenttypes.models import ContentType

    try:
        content_type = ContentType.objects.db_manager(using).get_for_id(content_type_id)  # type: ignore[arg-type]
    except ContentType.DoesNotExist:
        return f"content type {content_type_id}"
    # not str(content_type): Django 6.1 renders a missing model's as "app | model"
    return f"model {content_type.app_label}.{content_type.model}"


def _conclude(
    decision: _Decision,
    written: dict[str, int] | None,
    using: str,
    *,
    known: tuple[dict[str, Any] | None, bool] | None = None,
) -> list[Result]:
    """The outcome of each request of ``decision``, the guarded write having written ``written``
    (``{field: request pk}``; None: nothing, or no such row). ``known``: the row's ``field_versions``
    and whether it exists, as the write's statement returned them; else they are read where needed."""
    assert decision.target is not None
    model, pk, winners = decision.target.model, decision.pk, decision.winners
    stored = None
    row_exists = True  # it was written
    if known is not None:
        stored, row_exists = known
    elif written is None or (len(written) < len(winners) and listened(model)):
        # Nothing written: is there a row? Something held back: by which versions (for the signals)?
        stored = _stored_versions(model, pk, using)
        row_exists = stored is not None
    written = written or {}
    results = list(decision.rejected)
    for request, cleaned in decision.valid:
        fields = tuple(sorted(name for name in cleaned if written.get(name) == request.pk))
        outcome = outcome_of_write(bool(fields), row_exists)
        if outcome is Outcome.MISSING:
            results.append(_rejected(request, MISSING_TARGET))
            continue
        held = {}
        for name in cleaned:
            if name in written and written[name] != request.pk:
                held[name] = winners[name][0]  # a newer request of this job wrote it
            elif name not in written and stored is not None:
                held[name] = stored_version(stored, name)  # the row held it
        results.append(Result(request, STATUS_OF_OUTCOME[outcome], fields, held))
    return results


def _one_by_one(
    model: type[models.Model], pk: Any, valid: list[tuple[ProcessedRequest, dict[str, Any]]], using: str
) -> list[Result]:
    """Find the culprit of a refused batch: apply the requests one by one, in version order, each in its
    own savepoint; the refused ones are rejected."""
    results = []
    for request, cleaned in valid:
        try:
            with transaction.atomic(using=using):
                one = _write(model, pk, newest_per_field([(request.version or 0, request.pk, cleaned)]), using)
        except DatabaseError as exc:
            if is_transient(exc):
                raise
            results.append(_rejected(request, f"the database refused it: {type(exc).__name__}: {exc}"[:2000]))
            continue
        fields = tuple(sorted(one or ()))
        # The row is there: the batch's write reached it, and the database refused a value of it.
        results.append(Result(request, STATUS_OF_OUTCOME[outcome_of_write(bool(fields), True)], fields))
    return results


def _rejected(request: ProcessedRequest, error: str) -> Result:
    return Result(request, RequestStatus.REJECTED, error=error)


def _stored_versions(model: type[models.Model], pk: Any, using: str) -> dict[str, Any] | None:
    """Row ``pk``'s ``field_versions``, or None if there is no such row."""
    row = model._base_manager.db_manager(using).filter(pk=pk).values_list("field_versions", flat=True)
    found = list(row[:1])
    return None if not found else dict(found[0] or {})


def _write(
    model: type[models.Model], pk: Any, winners: dict[str, tuple[int, int, Any]], using: str
) -> dict[str, int] | None:
    """Run the guarded update; return ``{field: request pk}`` of what it wrote, or None if nothing was."""
    values = {name: (value, version) for name, (version, _pk, value) in winners.items()}
    written = write_if_newer(model, pk, values, connections[using])
    return None if written is None else {name: winners[name][1] for name in written}


def _record_failed_attempt(rid: uuid.UUID, using: str, exc: Exception) -> None:
    """Count the failed attempt; mark the request ``failed`` if RQ will not retry it."""
    final = not delivery.will_retry(rid)
    connection = connections[using]
    if is_lock_unavailable(exc):
        signals.lock_unavailable.send_robust(sender=None, surface="job", using=using)
    try:
        if in_transaction(connection):
            return  # called synchronously inside a transaction: the caller decides
        connection.close_if_unusable_or_obsolete()
        ProcessedRequest.objects.using(using).fail(rid, f"{type(exc).__name__}: {exc}", final=final)
    except DatabaseError:
        # The database is still unreachable: the request stays pending and the relay delivers it again.
        logger.exception("safeupdates: could not record the failure of request %s", rid)
