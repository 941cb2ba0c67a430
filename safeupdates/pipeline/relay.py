"""The third stage of the job path: :func:`relay` delivers again the requests whose job was lost.

A job can be lost between commit and enqueue, with the broker (Redis restarted empty), with a killed
worker, or in RQ's scheduled registry with no scheduler to move it; the relay (``manage.py
safeupdates_relay``) finds the requests pending for too long in the request log, decides which records
are overdue, and hands them to the delivery seam (:func:`safeupdates.delivery.redeliver`), which knows
how its backend finds and moves lost jobs. Redelivery is safe: applying is idempotent and versioned
(:mod:`safeupdates.pipeline.apply`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import models, router
from django.db.models import Q

from safeupdates import conf, delivery, signals
from safeupdates.database import clock
from safeupdates.database.errors import unreachable_database
from safeupdates.database.registry import content_type_of
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus

logger = logging.getLogger("safeupdates")


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
    #: The delivery backend cannot tell which jobs are queued: every due record was delivered again.
    from_log_alone: bool = False

    def summary(self) -> str:
        revived = ""
        if self.revived is not None:
            revived = f"{self.revived} failed request(s) {'would be' if self.dry_run else ''} made pending again; "
            revived = revived.replace("  ", " ")
        if self.dry_run:
            return f"{revived}would deliver {self.due} job(s) for work pending > {self.older_than:g}s"
        moved = f" ({self.moved} moved from RQ's scheduled or deferred registry)" if self.moved else ""
        blind = (
            "; the delivery backend cannot tell which jobs are queued: every overdue record was delivered again "
            "(a duplicate job changes nothing)"
            if self.from_log_alone and self.enqueued
            else ""
        )
        return (
            f"{revived}{self.due} due (pending > {self.older_than:g}s): enqueued {self.enqueued} job(s){moved}, "
            f"{self.waiting} already queued{blind}"
        )

    def warn(self, message: str) -> None:
        logger.warning("safeupdates relay: %s", message)
        self.warnings.append(message)


#: The longest ``older_than`` a pass takes, in seconds (:data:`safeupdates.conf.MAX_SECONDS`: 1000 years; a
#: longer one overflows the date arithmetic: an ``OverflowError`` or a ``DataError``).
MAX_AGE = conf.MAX_SECONDS


def valid_age(seconds: Any) -> bool:
    """Whether ``seconds`` is an age a pass can measure: a number from 0 to :data:`MAX_AGE` (not NaN)."""
    return not isinstance(seconds, bool) and isinstance(seconds, int | float) and 0 <= seconds <= MAX_AGE


#: More work for every relay pass, ``step(older_than, *, dry_run, using, report)``: the optional job tools
#: register theirs when their app is ready (the batches of ``fan_out()``: overdue items and reduces).
relay_steps: list[Callable[..., Any]] = []


def relay(
    older_than: float | None = None,
    *,
    dry_run: bool = False,
    using: str | None = None,
    retry_failed: bool = False,
    model: type[models.Model] | None = None,
) -> RelayReport:
    """Deliver again every record that has a request ``pending`` for more than ``older_than`` seconds
    (default ``SAFEUPDATES_RELAY_AFTER``), and the batch items and reduces that are overdue.

    Covers jobs lost between commit and enqueue, lost with the broker, abandoned by a killed worker, or
    left in RQ's scheduled registry with no scheduler to move them. Safe to run at any time and from
    several places: applying is idempotent and versioned. Ages are measured with the database's clock. A
    record whose queue the backend no longer serves (not in ``RQ_QUEUES``, say) is delivered on
    ``SAFEUPDATES_QUEUE``, with a warning: its requests must not wait for a queue that no worker serves,
    nor stop the other records. Raises :class:`~safeupdates.exceptions.BackendUnavailable` if the broker
    or the database cannot be reached.

    ``retry_failed`` first makes every ``failed`` update request ``pending`` again: a request fails when
    transient database errors outlast the job's retries (a long outage), and its write was rolled back with
    them, so delivering it again is safe; it is then due at once. ``model``: only the failed requests of that
    model (the pass still delivers every overdue record, as any pass does).
    """
    seconds = conf.relay_after() if older_than is None else older_than
    if not valid_age(seconds):
        name = "SAFEUPDATES_RELAY_AFTER" if older_than is None else "older_than"
        raise ValueError(f"{name} must be a number of seconds from 0 to {MAX_AGE}, not {seconds!r}.")
    using = using or router.db_for_write(ProcessedRequest)  # the primary: a replica may lag behind
    report = RelayReport(older_than=seconds, dry_run=dry_run)
    cutoff = clock.older_than(seconds)
    due = Q(created_at__lte=cutoff)
    if retry_failed:
        log = ProcessedRequest.objects.using(using)
        if model is not None:
            log = log.filter(content_type=content_type_of(model, using))
        with unreachable_database(using):
            if dry_run:
                revived = list(
                    log.filter(kind=RequestKind.UPDATE, status=RequestStatus.FAILED).values_list("pk", flat=True)
                )
            else:
                revived = log.revive()
        report.revived = len(revived)
        due |= Q(pk__in=revived)  # due in this very pass, whatever their age
    waiting = Q(status=RequestStatus.PENDING)
    if retry_failed and dry_run:
        waiting |= Q(pk__in=revived)  # still failed, as a dry run changes nothing: due all the same
    pending = (
        ProcessedRequest.objects.using(using)
        .filter(due, waiting, kind=RequestKind.UPDATE)
        .values_list("content_type_id", "object_id", "request_id", "queue")
    )
    # One delivery per record: its job applies every pending request of the record.
    targets: dict[tuple[int, str], tuple[uuid.UUID, str]] = {}
    with unreachable_database(using):
        for content_type_id, object_id, request_id, wanted in pending.iterator():
            targets.setdefault((content_type_id, object_id), (request_id, wanted or conf.queue_name()))
    report.due += len(targets)
    if not dry_run:
        deliveries = []
        for (content_type_id, object_id), (request_id, wanted) in targets.items():
            queue = relay_queue(wanted, f"record {content_type_id}:{object_id}", report)
            if queue is not None:
                deliveries.append(delivery.Delivery(str(request_id), content_type_id, object_id, queue, using))
        done = delivery.redeliver(deliveries)
        report.from_log_alone = not delivery.backend().can_list_queued
        report.enqueued += done.enqueued
        report.moved += done.moved
        report.waiting += done.waiting
        for warning in done.warnings:
            report.warn(warning)
    for step in relay_steps:
        with unreachable_database(using):
            step(seconds, dry_run=dry_run, using=using, report=report)
    if report.due:
        logger.info("safeupdates relay: %s", report.summary())
    signals.relay_finished.send_robust(sender=None, report=report)
    return report


def relay_pending(older_than: float | None = None, *, dry_run: bool = False, using: str | None = None) -> int:
    """Run a :func:`relay` pass; return how many jobs it enqueued (with ``dry_run``, how many are due).

    Usable as a scheduled RQ job.
    """
    report = relay(older_than, dry_run=dry_run, using=using)
    return report.due if dry_run else report.enqueued


def relay_queue(queue_name: str, what: str, report: RelayReport) -> str | None:
    """The queue on which the relay delivers ``what``'s work, wanted on ``queue_name``; None if none (the
    backend says why in ``report``: see :meth:`safeupdates.delivery.Backend.relay_queue`)."""
    return delivery.relay_queue(queue_name, what, report.warn)
