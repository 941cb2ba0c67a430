"""The third stage of the job path: :func:`relay` delivers again the requests whose job was lost.

A job can be lost between commit and enqueue, with Redis, with a killed worker, or in RQ's scheduled
registry with no scheduler to move it; the relay (``manage.py safeupdates_relay``) finds the requests
pending for too long and delivers their records again. Redelivery is safe: applying is idempotent and
versioned (:mod:`safeupdates.apply`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, router
from django.db.models import Q

from safeupdates import conf, db, queues, signals
from safeupdates.apply import is_transient
from safeupdates.exceptions import BackendUnavailable
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus

__all__ = ["RelayReport", "relay", "relay_pending", "relay_queue", "relay_steps", "unreachable_database"]

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
        log = ProcessedRequest.objects.using(using)
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
    used: set[str] = set()
    if not dry_run and conf.uses_tasks():
        from safeupdates import taskqueue

        taskqueue.redeliver(targets, report, using)
    elif not dry_run:
        by_queue: dict[str, list[tuple[str, int, str]]] = {}
        for (content_type_id, object_id), (request_id, wanted) in targets.items():
            queue_name = relay_queue(wanted, f"record {content_type_id}:{object_id}", report)
            if queue_name is not None:
                by_queue.setdefault(queue_name, []).append((str(request_id), content_type_id, object_id))
        for queue_name, deliveries in by_queue.items():
            used.add(queue_name)
            with queues.unreachable_redis(queue_name):
                # Records whose job is gone or waiting: two pipelines. The others one by one.
                enqueued, found_waiting, rest = queues.deliver_many(queue_name, deliveries, using)
            report.enqueued += enqueued
            report.waiting += found_waiting
            for index in rest:
                with queues.unreachable_redis(queue_name):
                    _job, outcome = queues.deliver_with_outcome(
                        *deliveries[index], queue_name, force=True, likely_queued=True, using=using
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
    signals.relay_finished.send_robust(sender=None, report=report)
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
