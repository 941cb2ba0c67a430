"""The job path: :func:`enqueue_update` (outbox + on-commit enqueue), :func:`apply_update` (the RQ job)
and :func:`relay` (redelivery of requests whose job was lost; :func:`relay_pending` as an RQ job).

PostgreSQL is the source of truth and Redis only delivers: a request is a ``pending`` row of the request
log, written in the caller's transaction; the job carries ids only. A job applies *every* pending request
of its record in one guarded statement (a burst of toggles costs one write), and jobs are deduplicated
per record with RQ's ``unique=True`` while one is still queued, so a burst also costs few jobs.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, connections, models, router, transaction
from django.db.models import Case, F, Q, Subquery, Value, When
from django.db.models.functions import Now
from django.db.utils import IntegrityError, InterfaceError, OperationalError

from safeupdates import conf, db, queues, statements
from safeupdates.exceptions import BackendUnavailable, InvalidUpdate, RequestNotFound
from safeupdates.guard import statement_cursor, write_if_newer
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus
from safeupdates.queues import deliver
from safeupdates.validation import clean_changes, clean_object_id, clean_pk, clean_request_id
from safeupdates.versions import next_version

__all__ = [
    "BackendUnavailable",
    "RelayReport",
    "RequestNotFound",
    "aenqueue_update",
    "apply_update",
    "deliver",
    "enqueue_update",
    "is_transient",
    "relay",
    "relay_pending",
]

logger = logging.getLogger("safeupdates")


#: How many pending requests of one record a job locks and merges at a time.
BATCH_SIZE = 500


def enqueue_update(
    obj_or_model: models.Model | type[models.Model],
    pk: Any = None,
    *,
    request_id: uuid.UUID | str | None = None,
    queue: str | None = None,
    **changes: Any,
) -> ProcessedRequest:
    """Record a request to write ``changes`` to a row, and enqueue its job when the caller commits.

    Field names must be in the model's ``safe_update_fields`` and values must be valid for the model
    fields, else :class:`~safeupdates.exceptions.InvalidUpdate` is raised and nothing is written or
    enqueued. The request gets a version from the database, is written as ``pending`` in the caller's
    transaction (a rolled-back caller enqueues nothing), and its job is enqueued on commit. Passing the
    ``request_id`` of a request already recorded returns that request and records nothing new.
    """
    if isinstance(obj_or_model, models.Model):
        model: type[models.Model] = type(obj_or_model)
        pk = obj_or_model.pk if pk is None else pk
    elif isinstance(obj_or_model, type) and issubclass(obj_or_model, models.Model):
        model = obj_or_model
    else:
        raise InvalidUpdate(f"enqueue_update() takes a model instance or a model class, not {obj_or_model!r}.")
    # The fields come from the class given: a proxy may narrow its concrete model's safe_update_fields.
    allowed = getattr(model, "safe_update_fields", None)
    if allowed is None:
        raise InvalidUpdate(
            f"{model._meta.label} is not a SafeUpdateModel: give it safe_update_fields to enqueue updates."
        )
    cleaned = clean_changes(model, changes, allowed=allowed)
    model = model._meta.concrete_model or model
    pk = clean_pk(model, pk)
    object_id = clean_object_id(model, pk)
    rid = uuid.uuid4() if request_id is None else clean_request_id(request_id)
    queue_name = _queue_name(queue)
    using = router.db_for_write(model)
    content_type = ContentType.objects.db_manager(using).get_for_model(model)
    record = ProcessedRequest(
        request_id=rid, content_type=content_type, object_id=object_id, changes=cleaned, queue=queue_name
    )
    others_pending = False
    if connections[using].vendor == "postgresql":
        inserted, others_pending = _insert_pending(record, using)
        if not inserted:
            return _known_request(ProcessedRequest.objects.using(using).get(request_id=rid), content_type, pk)
    else:
        try:
            with transaction.atomic(using=using):
                record.version = next_version(using)
                record.save(using=using, force_insert=True)
        except IntegrityError:
            existing = ProcessedRequest.objects.using(using).filter(request_id=rid).first()
            if existing is None:
                raise
            return _known_request(existing, content_type, pk)

    # robust: if Redis is down at commit, the request stays pending and the relay delivers it.
    def deliver_on_commit() -> None:
        deliver(rid, content_type.pk, str(pk), queue_name, likely_queued=others_pending)

    transaction.on_commit(deliver_on_commit, using=using, robust=True)
    return record


def _queue_name(queue: str | None) -> str:
    """The queue to deliver on: ``queue``, else ``SAFEUPDATES_QUEUE``; it must be one of ``RQ_QUEUES``."""
    configured = getattr(settings, "RQ_QUEUES", None) or {}
    name = queue or conf.queue_name()
    if name in configured:
        return name
    problem = queues.queue_problem() if queue is None else None
    if problem is not None:
        # The settings are wrong, not the call: say what the system check says.
        message, hint, check_id = problem
        raise InvalidUpdate(f"{message} {hint} ({check_id})")
    choices = ", ".join(configured) or "(none configured)"
    raise InvalidUpdate(f"queue {name!r} is not in RQ_QUEUES; pass one of: {choices}.")


def _known_request(existing: ProcessedRequest, content_type: ContentType, pk: Any) -> ProcessedRequest:
    """Return the request already recorded under a reused request id, if it targets the same row."""
    if existing.content_type_id != content_type.pk or existing.object_id != str(pk):
        raise InvalidUpdate(f"request_id {existing.request_id} was already used for another object.")
    return existing


def _insert_pending(record: ProcessedRequest, using: str) -> tuple[bool, bool]:
    """Insert ``record`` with a fresh version in one statement (PostgreSQL).

    Returns ``(inserted, others_pending)``: ``inserted`` is False if the request id exists already;
    ``others_pending`` says whether other requests of the same record were pending, which in a burst
    means that the record's job is most likely still queued (a hint for :func:`deliver`, nothing more).
    The version comes from the sequence inside the INSERT, and a known request id is skipped by
    ``ON CONFLICT DO NOTHING`` instead of an IntegrityError: no ``nextval`` round trip, and no
    savepoint to keep the caller's transaction usable. One round trip in all.
    """
    connection = connections[using]
    changes = ProcessedRequest._meta.get_field("changes").get_db_prep_save(record.changes, connection)
    sql, params = statements.insert_pending(
        request_id=record.request_id,
        content_type_id=record.content_type_id,
        object_id=record.object_id,
        changes=changes,
        queue=record.queue,
    )
    with statement_cursor(connection) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False, False
    record.pk, record.version, record.created_at, others_pending = row
    record._state.adding = False
    record._state.db = using
    return True, others_pending


async def aenqueue_update(obj_or_model: Any, pk: Any = None, **kwargs: Any) -> ProcessedRequest:
    """Async :func:`enqueue_update`, for async views."""
    return await sync_to_async(enqueue_update)(obj_or_model, pk, **kwargs)


def apply_update(request_id: str) -> str:
    """RQ job: apply pending request ``request_id`` and every other pending request of its record.

    The requests are locked (``SKIP LOCKED``: a concurrent job takes the others), merged per field by
    version, written with one guarded statement, and marked ``applied`` or ``stale`` in the same
    transaction, so running the job again changes nothing. Requests whose stored data is invalid, or
    whose value the database refuses (a constraint, a trigger: any error that is not
    :func:`transient <is_transient>`), are ``rejected`` at once and the others applied. Transient database
    errors propagate so that RQ retries the job; the request is marked ``failed`` when the retries are
    spent. A ``request_id`` that is no UUID fails the job at once, without retries; one that the worker's
    database does not hold raises :class:`RequestNotFound`. Returns a one-line summary.
    """
    try:
        rid = clean_request_id(request_id)
    except InvalidUpdate:
        queues.fail_without_retry()
        raise
    using = router.db_for_write(ProcessedRequest)
    try:
        counts: dict[str, int] = {}
        while True:
            with transaction.atomic(using=using):
                done = _apply_batch(rid, using)
            for status, count in done.items():
                counts[status] = counts.get(status, 0) + count
            if sum(done.values()) < BATCH_SIZE:
                break
    except DatabaseError as exc:
        # Transient (a lost connection, a lock timeout): RQ retries it; the last try marks it failed.
        _record_failed_attempt(rid, using, exc)
        raise
    return ", ".join(f"{count} {status}" for status, count in sorted(counts.items())) or "nothing pending"


def _apply_batch(rid: uuid.UUID, using: str) -> dict[str, int]:
    log = ProcessedRequest.objects.using(using)
    target = log.filter(request_id=rid)
    batch = list(
        log.filter(
            status=RequestStatus.PENDING,
            content_type_id=Subquery(target.values("content_type_id")[:1]),
            object_id=Subquery(target.values("object_id")[:1]),
        )
        .select_for_update(skip_locked=True)
        .order_by("version")[:BATCH_SIZE]
    )
    if not batch:
        # A request that names no model matches no record: it would stay pending for good.
        orphan = (
            log.filter(request_id=rid, kind=RequestKind.UPDATE, status=RequestStatus.PENDING, content_type=None)
            .select_for_update(skip_locked=True)
            .first()
        )
        if orphan is not None:
            return _finish(log, rejected={orphan.pk: "the request names no model (content_type is NULL)."})
        if not log.filter(request_id=rid).exists():
            raise RequestNotFound(
                f"request {rid} is not in database {using!r} ({describe_database(using)}): this worker's "
                "DATABASES differ from those of the process that enqueued it (two projects sharing one RQ "
                "queue?), or the request was purged."
            )
        return {}
    try:
        content_type = ContentType.objects.db_manager(using).get_for_id(batch[0].content_type_id)  # type: ignore[arg-type]
    except ContentType.DoesNotExist:
        # The log has no foreign key on content types (see ProcessedRequest.content_type).
        content_type = None
    model = None if content_type is None else content_type.model_class()
    if model is None:
        missing = f"content type {batch[0].content_type_id}" if content_type is None else f"model {content_type}"
        return _finish(log, rejected={r.pk: f"{missing} no longer exists" for r in batch})

    rejected: dict[int, str] = {}
    try:
        pk = clean_pk(model, batch[0].object_id)
    except InvalidUpdate as exc:
        return _finish(log, rejected={r.pk: str(exc) for r in batch})
    valid: list[tuple[ProcessedRequest, dict[str, Any]]] = []
    for request in batch:
        try:
            if not request.version:
                raise InvalidUpdate("the request has no version.")
            if not isinstance(request.changes, dict):
                raise InvalidUpdate(
                    f"changes must be a JSON object of field: value, not {type(request.changes).__name__}."
                )
            cleaned = clean_changes(model, request.changes, allowed=getattr(model, "safe_update_fields", ()))
        except InvalidUpdate as exc:
            rejected[request.pk] = str(exc)
            continue
        valid.append((request, cleaned))
    if not valid:
        return _finish(log, rejected=rejected)

    try:
        # A savepoint: a value the database refuses (a constraint, a trigger) must not sink the batch.
        with transaction.atomic(using=using):
            written = _write(model, pk, _winners(valid), using)
    except DatabaseError as exc:
        if is_transient(exc):
            raise  # RQ retries the job; nothing here is the requests' fault
        # Find the culprit: apply the requests one by one, in version order, each in its own savepoint.
        applied: set[int] = set()
        for request, cleaned in valid:
            try:
                with transaction.atomic(using=using):
                    one = _write(model, pk, _winners([(request, cleaned)]), using)
            except DatabaseError as exc:
                if is_transient(exc):
                    raise
                rejected[request.pk] = f"the database refused it: {type(exc).__name__}: {exc}"[:2000]
                continue
            if one:
                applied.add(request.pk)
        stale = [r.pk for r, _ in valid if r.pk not in applied and r.pk not in rejected]
        return _finish(log, applied=list(applied), stale=stale, rejected=rejected)
    if written is None:
        if not model._default_manager.db_manager(using).filter(pk=pk).exists():
            rejected.update({r.pk: "the target object does not exist" for r, _ in valid})
            return _finish(log, rejected=rejected)
        written = {}
    applied_pks = set(written.values())
    stale = [r.pk for r, _ in valid if r.pk not in applied_pks]
    return _finish(log, applied=list(applied_pks), stale=stale, rejected=rejected)


# SQLSTATE classes and codes of errors that are not about the values written: the same statement may
# succeed when it runs again, so RQ retries the job. Every other error with a SQLSTATE (a trigger's RAISE
# EXCEPTION, P0001; a constraint, 23xxx; a bad value, 22xxx; a permission, 42501 ...) is the statement's
# own and would fail again: the request that causes it is rejected.
_TRANSIENT_SQLSTATE_CLASSES = frozenset(
    {
        "08",  # connection exception
        "40",  # transaction rollback: serialization failure 40001, deadlock 40P01, ...
        "53",  # insufficient resources: disk full, out of memory, too many connections
        "57",  # operator intervention: query canceled (statement_timeout) 57014, shutdown 57P01-57P03
        "58",  # system error (an I/O error)
        "XX",  # internal error: the server's fault, not the value's
    }
)
_TRANSIENT_SQLSTATES = frozenset(
    {
        db.LOCK_NOT_AVAILABLE,  # 55P03: lock_timeout or NOWAIT
        "55006",  # object in use
        "25006",  # read-only transaction: a primary that became a standby in a failover
        "25P03",  # idle_in_transaction_session_timeout
    }
)


def is_transient(exc: BaseException) -> bool:
    """True if database error ``exc`` may not happen again when the job is retried.

    PostgreSQL says so in the error's SQLSTATE (see above). An error without one comes from the client
    library: a connection lost before the server answered (``OperationalError``, ``InterfaceError``) is
    transient; on SQLite "database is locked" is an ``OperationalError`` too, and its refusals of a value
    (a constraint, a trigger's ``RAISE(ABORT)``) are ``IntegrityError``.
    """
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        return sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES or sqlstate in _TRANSIENT_SQLSTATES
    return isinstance(exc, OperationalError | InterfaceError)


def describe_database(using: str) -> str:
    """``vendor NAME at HOST:PORT`` of database ``using``, for error messages (no password)."""
    connection = connections[using]
    config = connection.settings_dict
    where = f" at {config.get('HOST')}:{config.get('PORT') or 'default port'}" if config.get("HOST") else ""
    return f"{connection.display_name} {config.get('NAME')}{where}"


def _winners(valid: list[tuple[ProcessedRequest, dict[str, Any]]]) -> dict[str, tuple[int, int, Any]]:
    """Per field, the newest request's ``(version, request pk, value)``."""
    winners: dict[str, tuple[int, int, Any]] = {}
    for request, cleaned in valid:
        assert request.version is not None
        for name, value in cleaned.items():
            if name not in winners or winners[name][0] < request.version:
                winners[name] = (request.version, request.pk, value)
    return winners


def _write(
    model: type[models.Model], pk: Any, winners: dict[str, tuple[int, int, Any]], using: str
) -> dict[str, int] | None:
    """Run the guarded update; return ``{field: request pk}`` of what it wrote, or None if nothing was."""
    values = {name: (value, version) for name, (version, _pk, value) in winners.items()}
    written = write_if_newer(model, pk, values, connections[using])
    return None if written is None else {name: winners[name][1] for name in written}


def _finish(
    log: models.QuerySet[ProcessedRequest],
    *,
    applied: Sequence[int] = (),
    stale: Sequence[int] = (),
    rejected: dict[int, str] | None = None,
) -> dict[str, int]:
    if applied or stale:
        log.filter(pk__in=[*applied, *stale]).update(
            status=Case(When(pk__in=applied, then=Value(RequestStatus.APPLIED)), default=Value(RequestStatus.STALE)),
            error="",
            attempts=F("attempts") + 1,
            processed_at=Now(),
        )
    for pk, error in (rejected or {}).items():
        logger.warning("safeupdates: request %s rejected: %s", pk, error)
        log.filter(pk=pk).update(
            status=RequestStatus.REJECTED, error=error, attempts=F("attempts") + 1, processed_at=Now()
        )
    counts = {"applied": len(applied), "stale": len(stale), "rejected": len(rejected or {})}
    return {status: count for status, count in counts.items() if count}


def _record_failed_attempt(rid: uuid.UUID, using: str, exc: Exception) -> None:
    """Count the failed attempt; mark the request ``failed`` if RQ will not retry it."""
    final = not queues.will_retry()
    connection = connections[using]
    try:
        if connection.in_atomic_block:
            return  # called synchronously inside a transaction: the caller decides
        connection.close_if_unusable_or_obsolete()
        update: dict[str, Any] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "attempts": F("attempts") + 1}
        if final:
            update.update(status=RequestStatus.FAILED, processed_at=Now())
        ProcessedRequest.objects.using(using).filter(request_id=rid, status=RequestStatus.PENDING).update(**update)
    except DatabaseError:
        # The database is still unreachable: the request stays pending and the relay delivers it again.
        logger.exception("safeupdates: could not record the failure of request %s", rid)


@dataclass
class RelayReport:
    """What a relay pass found and did. Batch items and reduces count as jobs."""

    older_than: float
    dry_run: bool = False
    #: Records (and batch items, reduces) with work pending for longer than ``older_than``.
    due: int = 0
    #: Jobs this pass put on a queue: new ones, and ones moved out of RQ's scheduled or deferred registry.
    enqueued: int = 0
    #: Of ``enqueued``: jobs moved out of a registry, where they would have waited forever.
    moved: int = 0
    #: Records whose job was found waiting: in its queue, or scheduled for a retry that is not yet due.
    waiting: int = 0
    warnings: list[str] = field(default_factory=list)
    #: With ``retry_failed``: ``failed`` update requests made ``pending`` again (or that would be).
    revived: int | None = None
    _moved_scheduled: dict[str, int] = field(default_factory=dict, repr=False)

    def summary(self) -> str:
        revived = ""
        if self.revived is not None:
            revived = f"{self.revived} failed request(s) {'would be' if self.dry_run else ''} made pending again; "
            revived = revived.replace("  ", " ")
        if self.dry_run:
            return f"{revived}would deliver {self.due} job(s) for work pending > {self.older_than:g}s"
        moved = f" ({self.moved} moved from RQ's scheduled or deferred registry)" if self.moved else ""
        return (
            f"{revived}{self.due} due (pending > {self.older_than:g}s): enqueued {self.enqueued} job(s){moved}, "
            f"{self.waiting} already queued"
        )

    def warn(self, message: str) -> None:
        logger.warning("safeupdates relay: %s", message)
        self.warnings.append(message)


#: More work for every relay pass, ``step(older_than, *, dry_run, using, report)``: the optional job tools
#: register theirs when their app is ready (the batches of ``fan_out()``: overdue items and reduces).
relay_steps: list[Callable[..., Any]] = []


def relay(
    older_than: float | None = None, *, dry_run: bool = False, using: str | None = None, retry_failed: bool = False
) -> RelayReport:
    """Deliver again every record that has a request ``pending`` for more than ``older_than`` seconds
    (default ``SAFEUPDATES_RELAY_AFTER``), and the batch items and reduces that are overdue.

    Covers jobs lost between commit and enqueue, lost with Redis, abandoned by a killed worker, or left
    in RQ's scheduled registry with no scheduler to move them. Safe to run at any time and from several
    places: applying is idempotent and versioned. Ages are measured with the database's clock. A record
    whose queue is no longer in ``RQ_QUEUES`` is delivered on ``SAFEUPDATES_QUEUE``, with a warning: its
    requests must not wait for a queue that no worker serves, nor stop the other records. Raises
    :class:`BackendUnavailable` if Redis or the database cannot be reached.

    ``retry_failed`` first makes every ``failed`` update request ``pending`` again: a request fails when
    transient database errors outlast RQ's retries (a long outage), and its write was rolled back with
    them, so delivering it again is safe; it is then due at once.
    """
    seconds = conf.relay_after() if older_than is None else older_than
    using = using or router.db_for_write(ProcessedRequest)  # the primary: a replica may lag behind
    report = RelayReport(older_than=seconds, dry_run=dry_run)
    cutoff = db.older_than(seconds)
    due = Q(created_at__lte=cutoff)
    if retry_failed:
        failed = ProcessedRequest.objects.using(using).filter(kind=RequestKind.UPDATE, status=RequestStatus.FAILED)
        with unreachable_database(using):
            revived = list(failed.values_list("pk", flat=True))
            if not dry_run:
                failed.filter(pk__in=revived).update(status=RequestStatus.PENDING, processed_at=None)
        report.revived = len(revived)
        due |= Q(pk__in=revived)  # due in this very pass, whatever their age
    pending = (
        ProcessedRequest.objects.using(using)
        .filter(due, kind=RequestKind.UPDATE, status=RequestStatus.PENDING)
        .values_list("content_type_id", "object_id", "request_id", "queue")
    )
    # One delivery per record: its job applies every pending request of the record.
    targets: dict[tuple[int, str], tuple[uuid.UUID, str]] = {}
    with unreachable_database(using):
        for content_type_id, object_id, request_id, wanted in pending.iterator():
            targets.setdefault((content_type_id, object_id), (request_id, wanted or conf.queue_name()))
    report.due += len(targets)
    used: set[str] = set()
    if not dry_run:
        for (content_type_id, object_id), (request_id, wanted) in targets.items():
            queue_name = relay_queue(wanted, f"record {content_type_id}:{object_id}", report)
            if queue_name is None:
                continue
            used.add(queue_name)
            with queues.unreachable_redis(queue_name):
                _job, outcome = queues.deliver_with_outcome(
                    request_id, content_type_id, object_id, queue_name, force=True
                )
            if outcome == queues.WAITING:
                report.waiting += 1
                continue
            report.enqueued += 1
            if outcome != queues.ENQUEUED:
                report.moved += 1
            if outcome == queues.MOVED_SCHEDULED:
                report._moved_scheduled[queue_name] = report._moved_scheduled.get(queue_name, 0) + 1
    for step in relay_steps:
        with unreachable_database(using):
            step(seconds, dry_run=dry_run, using=using, report=report)
    for queue_name in sorted(used):
        _check_scheduler(queue_name, report)
    if report.due:
        logger.info("safeupdates relay: %s", report.summary())
    return report


def relay_pending(older_than: float | None = None, *, dry_run: bool = False, using: str | None = None) -> int:
    """Run a :func:`relay` pass; return how many jobs it enqueued (with ``dry_run``, how many are due).

    Usable as a scheduled RQ job.
    """
    report = relay(older_than, dry_run=dry_run, using=using)
    return report.due if dry_run else report.enqueued


def relay_queue(queue_name: str, what: str, report: RelayReport) -> str | None:
    """The queue on which the relay delivers ``what``'s work, wanted on ``queue_name``; None if none."""
    configured = getattr(settings, "RQ_QUEUES", None) or {}
    if queue_name in configured:
        return queue_name
    default = conf.queue_name()
    if default in configured:
        report.warn(f"{what} has work for queue {queue_name!r}, which is not in RQ_QUEUES: delivered on {default!r}.")
        return default
    report.warn(
        f"{what} has work for queue {queue_name!r}, which is not in RQ_QUEUES, and neither is SAFEUPDATES_QUEUE "
        f"{default!r}: not delivered. Fix RQ_QUEUES (system check safeupdates.E002)."
    )
    return None


@contextmanager
def unreachable_database(using: str) -> Iterator[None]:
    """Raise :class:`BackendUnavailable` for a transient error of database ``using`` inside the block."""
    try:
        yield
    except DatabaseError as exc:
        if not is_transient(exc):
            raise
        config = connections[using].settings_dict
        where = f"{config.get('HOST')}:{config.get('PORT') or 'default port'}/" if config.get("HOST") else ""
        raise BackendUnavailable(connections[using].display_name, f"{where}{config.get('NAME')}", exc) from exc


def _check_scheduler(queue_name: str, report: RelayReport) -> None:
    """Warn if jobs wait in ``queue_name``'s scheduled registry (or were overdue there) with no RQ
    scheduler running for the queue: RQ's retries with back-off would then only run when the relay
    moves them."""
    waiting, running = queues.scheduler_state(queue_name)
    moved = report._moved_scheduled.get(queue_name, 0)
    if running or not (waiting or moved):
        return
    overdue = f", {moved} overdue ones were moved to the queue by this pass" if moved else ""
    report.warn(
        f"no RQ scheduler is running for queue {queue_name!r}: {waiting} job(s) wait in its scheduled "
        f"registry{overdue}. Start the workers with --with-scheduler, or RQ's retries wait for the relay."
    )
