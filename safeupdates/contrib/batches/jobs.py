"""Fan-out / fan-in: :func:`fan_out` runs one job per item and the reduce exactly once at the end.

"All items done" is decided in PostgreSQL, not in Redis: each item is a row of the request log
(kind ``batch_item``, pointed at by its :class:`~safeupdates.contrib.batches.models.BatchItem`) that its
job locks, runs and marks in one transaction, incrementing the batch's
``succeeded`` or ``failed`` counter in that same transaction. Duplicate deliveries find the item terminal
and do nothing; two concurrent last items serialize on the batch row, and only the transaction whose
increment reaches ``total`` marks the batch done and enqueues the reduce. The reduce job locks the batch
row and records ``reduced_at``, so it runs once even if it is delivered twice.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, router, transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from rq import Retry, get_current_job
from rq.job import Job

from safeupdates import conf
from safeupdates.contrib import require_app
from safeupdates.contrib.batches.models import Batch, BatchItem, BatchStatus
from safeupdates.database import clock
from safeupdates.database.errors import is_lock_unavailable
from safeupdates.delivery.rq import dotted_path, get_queue, job_kwargs, resolve, unreachable_redis
from safeupdates.exceptions import InvalidControl, InvalidUpdate, RequestNotFound
from safeupdates.jobs import RelayReport, describe_database, relay_queue
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus
from safeupdates.write.validation import check_json, shown

__all__ = ["deliver_item", "deliver_reduce", "fan_out", "relay_batches", "run_batch_item", "run_batch_reduce"]

logger = logging.getLogger("safeupdates")

_ITEM_NAMESPACE = uuid.UUID("8d0f4c52-4b8e-4a7e-9f0c-5b1d9e2f6a11")


#: The most retries an item may have: what the batch's ``retries`` column holds.
MAX_RETRIES = 2**31 - 1


def fan_out(
    item_func: Callable[..., Any] | str,
    items: Iterable[Any],
    *,
    then: Callable[..., Any] | str | None = None,
    queue: str | None = None,
    retries: int = 0,
    using: str | None = None,
) -> Batch:
    """Enqueue ``item_func(item)`` for every item and ``then(batch_id)`` once they have all finished.

    An item has finished when it succeeded, or failed after ``retries`` retries. The batch, its items
    and their jobs are written in the caller's transaction and enqueued when it commits. Items must be
    JSON-serialisable. Returns the :class:`~safeupdates.contrib.batches.models.Batch` (``batch.batch_id``).

    The batch is written to database ``using`` (by default the router's database for writes of
    batches), and its jobs carry that database, as an apply job does.
    """
    require_app("safeupdates.contrib.batches")
    item_path = dotted_path(item_func)
    then_path = "" if then is None else dotted_path(then)
    queue_name = queue or conf.queue_name()
    if queue_name not in getattr(settings, "RQ_QUEUES", {}):
        raise InvalidControl(f"queue {queue_name!r} is not in RQ_QUEUES.")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidControl(f"retries must be a whole number >= 0, got {retries!r}.")
    if retries > MAX_RETRIES:  # the batch's column: a DataError at its INSERT
        raise InvalidControl(f"retries must be at most {MAX_RETRIES}, got {retries}.")
    try:
        iterator = iter(items)
    except TypeError:
        raise InvalidControl(f"items must be an iterable of JSON-serialisable items, got {shown(items)}.") from None
    values = list(iterator)
    try:
        # What the request log's jsonb can hold and JSON reads back (no NaN, no lone surrogate, no NUL, no
        # huge integer or deep nesting), decided before anything is written.
        encoded = [json.loads(json.dumps(check_json(value, f"item {index}"))) for index, value in enumerate(values)]
    except InvalidUpdate as exc:
        raise InvalidControl(f"items must be JSON-serialisable: {exc}") from None
    using = using or router.db_for_write(Batch)
    with transaction.atomic(using=using):
        batch = Batch.objects.using(using).create(
            item_func=item_path, then=then_path, queue=queue_name, retries=retries, total=len(values)
        )
        requests = ProcessedRequest.objects.using(using).create_pending_rows(
            (
                ProcessedRequest(
                    request_id=uuid.uuid5(_ITEM_NAMESPACE, f"{batch.batch_id}:{index}"),
                    key=f"{batch.batch_id}:{index}",
                    changes={"item": value},
                    queue=queue_name,
                )
                for index, value in enumerate(encoded)
            ),
            kind=RequestKind.BATCH_ITEM,
        )
        BatchItem.objects.using(using).bulk_create(
            BatchItem(batch=batch, index=index, request_id=request.request_id) for index, request in enumerate(requests)
        )
        if not values:
            Batch.objects.using(using).filter(pk=batch.pk).update(status=BatchStatus.DONE, finished_at=Now())
        ids = [str(request.request_id) for request in requests]

        def deliver_on_commit() -> None:
            if ids:
                deliver_item(ids, queue_name, retries, using)
            elif then_path:
                deliver_reduce(batch.batch_id, queue_name, using)

        transaction.on_commit(deliver_on_commit, using=using, robust=True)
    batch.refresh_from_db()
    return batch


def deliver_item(request_ids: list[str], queue_name: str, retries: int, using: str = DEFAULT_DB_ALIAS) -> None:
    """Enqueue one item job per request id (of database ``using``), in one Redis round trip."""
    queue = get_queue(queue_name)
    retry = Retry(max=retries, interval=[1, 5, 15][: max(retries, 1)]) if retries else None
    jobs = [
        queue.prepare_data(
            run_batch_item,
            args=(rid,),
            kwargs=job_kwargs(using),
            timeout=conf.job_timeout(),
            result_ttl=0,
            retry=retry,
        )
        for rid in request_ids
    ]
    queue.enqueue_many(jobs)


def deliver_reduce(batch_id: uuid.UUID | str, queue_name: str, using: str = DEFAULT_DB_ALIAS) -> Job:
    """Enqueue the reduce job of ``batch_id`` (of database ``using``)."""
    queue = get_queue(queue_name)
    return queue.enqueue_call(
        run_batch_reduce,
        args=(str(batch_id),),
        kwargs=job_kwargs(using),
        timeout=conf.job_timeout(),
        result_ttl=0,
    )


def run_batch_item(request_id: str, using: str | None = None) -> str:
    """RQ job: run one batch item at most once to success, count it once, finish the batch if last.

    Returns "succeeded", "failed", "duplicate" (the item has finished) or "already running" (another job
    runs it now).
    """
    using = using or router.db_for_write(ProcessedRequest)
    with transaction.atomic(using=using):
        try:
            # NOWAIT: a locked item is being run by another job (the relay delivered it again while it
            # ran). Waiting for that run to end would hold this worker for nothing: its outcome is the
            # item's outcome, and if it fails or its worker dies the item stays pending for a retry or
            # the relay. Items run at most once to success either way: the lock, then the status, decide.
            item = (
                ProcessedRequest.objects.using(using)
                .select_for_update(nowait=True)
                .filter(request_id=request_id, kind=RequestKind.BATCH_ITEM)
                .first()
            )
        except DatabaseError as exc:
            if not is_lock_unavailable(exc):
                raise
            transaction.set_rollback(True, using=using)
            return "already running"
        if item is None:
            raise RequestNotFound(
                f"batch item {request_id} is not in database {using!r} ({describe_database(using)}): this "
                "worker's DATABASES differ from those of the process that enqueued it, or the item was purged."
            )
        if item.status != RequestStatus.PENDING:
            return "duplicate"
        batch = Batch.objects.using(using).get(items__request_id=item.request_id)
        batch_id = batch.batch_id
        error = ""
        try:
            # A savepoint, so that a database error inside the item leaves this transaction usable.
            with transaction.atomic(using=using):
                resolve(batch.item_func)(item.changes["item"])
        except Exception as exc:
            job = get_current_job()
            if job is not None and job.retries_left:
                raise  # RQ retries it; the item stays pending
            error = f"{type(exc).__name__}: {exc}"[:2000]
            logger.warning("safeupdates: batch %s item %s failed: %s", batch_id, item.key, error)
        succeeded = not error
        ProcessedRequest.objects.using(using).filter(pk=item.pk).complete(error)
        counter = "succeeded" if succeeded else "failed"
        Batch.objects.using(using).filter(pk=batch.pk).update(**{counter: F(counter) + 1})
        batch.refresh_from_db(fields=["succeeded", "failed", "total", "status"])
        if batch.succeeded + batch.failed == batch.total and batch.status == BatchStatus.RUNNING:
            Batch.objects.using(using).filter(pk=batch.pk).update(status=BatchStatus.DONE, finished_at=Now())
            if batch.then:
                queue_name = batch.queue

                def reduce_on_commit() -> None:
                    deliver_reduce(batch_id, queue_name, using)

                transaction.on_commit(reduce_on_commit, using=using, robust=True)
    return "succeeded" if succeeded else "failed"


def run_batch_reduce(batch_id: str, using: str | None = None) -> str:
    """RQ job: run the batch's ``then(batch_id)`` once; later deliveries do nothing.

    If ``then`` raises, what it wrote in the database is rolled back, the failure is counted in
    ``reduce_attempts`` and the exception propagates (RQ keeps the job as failed); the relay delivers
    the reduce again, at most once every ``SAFEUPDATES_RELAY_AFTER`` seconds (earlier deliveries return
    "too soon"), until ``SAFEUPDATES_REDUCE_ATTEMPTS`` attempts have failed, and the batch becomes
    ``reduce_failed``. Side effects outside the database repeat with each attempt.
    """
    using = using or router.db_for_write(Batch)
    failure: Exception | None = None
    with transaction.atomic(using=using):
        batch = Batch.objects.using(using).select_for_update().get(batch_id=batch_id)
        if batch.reduced_at is not None or batch.status != BatchStatus.DONE or not batch.then:
            return "nothing to do"
        recent = Batch.objects.using(using).filter(_failed_recently(), pk=batch.pk)
        if batch.reduce_failed_at is not None and recent.exists():
            # Copies of the reduce may have piled up in the queue: a short outage must not use up every
            # attempt at once. Attempts are at least SAFEUPDATES_RELAY_AFTER apart; the relay comes back.
            return "too soon"
        try:
            # A savepoint: what the reduce wrote is undone, the count of its failure is kept.
            with transaction.atomic(using=using):
                resolve(batch.then)(str(batch.batch_id))
        except Exception as exc:
            failure = exc
            attempts = batch.reduce_attempts + 1
            gave_up = attempts >= conf.reduce_attempts()
            error = f"{type(exc).__name__}: {exc}"[:2000]
            logger.warning("safeupdates: batch %s reduce failed (attempt %d): %s", batch_id, attempts, error)
            Batch.objects.using(using).filter(pk=batch.pk).update(
                reduce_attempts=attempts,
                reduce_error=error,
                reduce_failed_at=Now(),
                status=BatchStatus.REDUCE_FAILED if gave_up else BatchStatus.DONE,
            )
        else:
            Batch.objects.using(using).filter(pk=batch.pk).update(reduced_at=Now())
    if failure is not None:
        raise failure  # after the commit: RQ keeps the job as failed; the relay runs it again, or gave up
    return "reduced"


def _failed_recently() -> Q:
    """Batches whose reduce failed less than ``SAFEUPDATES_RELAY_AFTER`` seconds ago (database clock)."""
    return Q(reduce_failed_at__gt=clock.older_than(conf.relay_after()))


def relay_batches(
    older_than: float, *, dry_run: bool = False, using: str | None = None, report: RelayReport | None = None
) -> int:
    """Deliver again batch items pending for more than ``older_than`` seconds, and reduces that are due.

    Returns how many jobs were enqueued (with ``dry_run``: how many are due). A batch whose queue is no
    longer in ``RQ_QUEUES`` is delivered on ``SAFEUPDATES_QUEUE``, with a warning in ``report``.
    """
    report = report or RelayReport(older_than=older_than, dry_run=dry_run)
    using = using or router.db_for_write(Batch)  # the primary: a replica may lag behind
    cutoff = clock.older_than(older_than)
    items = ProcessedRequest.objects.using(using).filter(
        kind=RequestKind.BATCH_ITEM, status=RequestStatus.PENDING, created_at__lte=cutoff
    )
    count = 0
    for batch in Batch.objects.using(using).filter(status=BatchStatus.RUNNING, created_at__lte=cutoff):
        of_batch = BatchItem.objects.using(using).filter(batch=batch).values("request_id")
        ids = [str(rid) for rid in items.filter(request_id__in=of_batch).values_list("request_id", flat=True)]
        if ids and (queue_name := _relay_to(batch, len(ids), report, dry_run)):
            with unreachable_redis(queue_name):
                deliver_item(ids, queue_name, batch.retries, using)
            count += _enqueued(len(ids), report)
    due = (
        Batch.objects.using(using)
        .filter(status=BatchStatus.DONE, reduced_at__isnull=True, finished_at__lte=cutoff)
        .exclude(then="")
        .exclude(_failed_recently())  # not again before its time
    )
    for batch in due:
        if queue_name := _relay_to(batch, 1, report, dry_run):
            with unreachable_redis(queue_name):
                deliver_reduce(batch.batch_id, queue_name, using)
            count += _enqueued(1, report)
    return report.due if dry_run else count


def _relay_to(batch: Batch, jobs: int, report: RelayReport, dry_run: bool) -> str | None:
    """Count ``jobs`` of ``batch`` as due; return the queue to deliver them on (None: a dry run, or none)."""
    report.due += jobs
    return None if dry_run else relay_queue(batch.queue, f"batch {batch.batch_id}", report)


def _enqueued(jobs: int, report: RelayReport) -> int:
    report.enqueued += jobs
    return jobs
