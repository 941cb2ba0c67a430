"""What an operator needs to see of the job path, read at once: :func:`collect` and :class:`Status`.

The backlog per model and queue and the oldest pending request (one query through the
``safeupdates_pending`` index), the records waiting for the relay (pending for longer than
``SAFEUPDATES_RELAY_AFTER``; another such query), outcomes of the last hour and the failed requests (through
``safeupdates_outcomes``), the batches of ``fan_out()`` when their app is installed (found through the
app registry: the core never imports ``safeupdates.contrib``), and what the delivery backend shows of each
queue (:func:`safeupdates.delivery.health`; RQ: jobs waiting, workers, and whether a scheduler runs).
``manage.py safeupdates_status`` prints it and the request log's admin shows it; :meth:`Status.problems`
is what makes either call the system unhealthy.

On PostgreSQL it also reads how the primary replicates (:func:`replication`): a primary whose standbys
replicate asynchronously, or that has no synchronous standby connected, is a warning (an acknowledged
request can be lost in a failover, or commits wait for a standby), never a problem. A single node, with no
standby streaming from it, gets no warning: it is not highly available at all, or its replication is below
PostgreSQL (RDS Multi-AZ, Cloud SQL HA), which the database cannot show; the status says so in a line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.apps import apps
from django.db import ProgrammingError, connections, router, transaction
from django.db.models import Count, DurationField, ExpressionWrapper, Min
from django.db.models.functions import Now

from safeupdates import conf, delivery
from safeupdates.database import statements
from safeupdates.database.clock import database_now, older_than
from safeupdates.database.cursors import fetch_one
from safeupdates.database.errors import is_permission_denied
from safeupdates.database.registry import model_of
from safeupdates.exceptions import BackendUnavailable
from safeupdates.models import TERMINAL_STATUSES, ProcessedRequest, RequestKind, RequestStatus

__all__ = [
    "Backlog",
    "FailedRequest",
    "Replication",
    "Status",
    "backlog",
    "collect",
    "model_label",
    "relay_due",
    "replication",
]

#: The window of :attr:`Status.outcomes`, in seconds.
RECENT = 3600


@dataclass(frozen=True)
class Backlog:
    """The pending requests of one model on one queue, and the age of the oldest (seconds)."""

    model: str
    queue: str
    pending: int
    oldest_age: float


@dataclass(frozen=True)
class FailedRequest:
    """A failed request to look at: ``safeupdates_relay --retry-failed`` delivers update requests again."""

    request_id: str
    kind: str
    model: str
    object_id: str
    key: str
    error: str
    attempts: int
    processed_at: datetime | None


@dataclass(frozen=True)
class Replication:
    """How the primary replicates, as it sees it (:func:`replication`)."""

    #: Physical standbys streaming from the primary (``pg_stat_replication``, base backups and logical
    #: replication left out), and how many of them are synchronous (``sync`` or ``quorum``).
    standbys: int
    synchronous: int
    #: Standbys whose state the database user may not see (it needs ``pg_monitor``).
    hidden: int
    synchronous_standby_names: str
    #: This session's ``synchronous_commit``: ``off`` and ``local`` do not wait for any standby.
    synchronous_commit: str

    def warning(self) -> str:
        """Why an acknowledged request may be lost in a failover (or a commit wait), or ``""``."""
        where = "docs/deployment.md, High availability"
        if self.standbys == 0 and not self.synchronous_standby_names:
            return ""  # a single node: see summary()
        if self.synchronous_commit in {"off", "local"} and self.standbys:
            return (
                f"synchronous_commit is {self.synchronous_commit!r}: a commit does not wait for any of the "
                f"{self.standbys} standby(s), so requests acknowledged just before a failover can be lost with "
                f"their data ({where})."
            )
        if not self.synchronous_standby_names:
            return (
                f"the primary replicates asynchronously to its {self.standbys} standby(s) (synchronous_standby_names "
                "is empty): requests acknowledged just before a failover can be lost with their data; Patroni's "
                f"synchronous_mode (with synchronous_mode_strict) prevents it ({where})."
            )
        if self.synchronous == 0 and self.hidden == 0:
            return (
                f"no synchronous standby is connected (synchronous_standby_names is "
                f"{self.synchronous_standby_names!r}, {self.standbys} standby(s) streaming): commits wait until one "
                f"is, or, where the cluster manager drops the setting, are acknowledged without a copy ({where})."
            )
        return ""

    def summary(self) -> str:
        """One line for the status: what replicates, and how."""
        if self.standbys == 0 and not self.synchronous_standby_names:
            return (
                "no standby streams from this database: a single node, or replication below PostgreSQL "
                "(RDS Multi-AZ, Cloud SQL HA) that it cannot show"
            )
        hidden = f", {self.hidden} whose state this user may not see (grant pg_monitor)" if self.hidden else ""
        return (
            f"{self.standbys} standby(s), {self.synchronous} synchronous{hidden}; synchronous_standby_names "
            f"{self.synchronous_standby_names!r}, synchronous_commit {self.synchronous_commit!r}"
        )


@dataclass
class Status:
    """A snapshot of the job path; see the module's docstring."""

    checked_at: datetime
    backlog: list[Backlog]
    #: Requests recorded in the last hour, per status. Duplicates are not stored: count them with the
    #: ``request_duplicate`` signal (the Prometheus metrics do).
    outcomes: dict[str, int]
    failed: int
    failed_requests: list[FailedRequest]
    #: ``{"running": n, "reduce_failed": n}``; None without the batches app.
    batches: dict[str, int] | None
    queues: list[delivery.QueueHealth] = field(default_factory=list)
    #: Why the delivery backend could not be asked (its Redis, broker or database unreachable), or "".
    backend_error: str = ""
    #: The delivery (``SAFEUPDATES_DELIVERY``) whose queues these are, and what it is called.
    delivery: str = ""
    backend_label: str = "RQ"
    #: Why a queue can show no worker, as the backend knows it.
    no_worker: str = ""
    #: How old a pending request may grow before it means that nothing applies it, where the backend cannot
    #: show its workers (``SAFEUPDATES_STUCK_AFTER``); None where it can (a queue's workers are counted).
    stuck_after: float | None = None
    #: What to run so that a worker serves each queue with pending requests (the problems' advice).
    hints: dict[str, str] = field(default_factory=dict)
    #: Records with an update request pending for longer than ``SAFEUPDATES_RELAY_AFTER`` (:attr:`relay_after`
    #: seconds): waiting for the relay, whose next pass delivers them again (their job may be lost).
    relay_due: int = 0
    relay_after: int = 0
    #: How the primary replicates (PostgreSQL; None elsewhere, or when the database is a standby).
    replication: Replication | None = None

    @property
    def pending(self) -> int:
        return sum(entry.pending for entry in self.backlog)

    @property
    def oldest_pending_age(self) -> float | None:
        """Seconds since the oldest pending request was created (the database's clock); None if none is."""
        return max((entry.oldest_age for entry in self.backlog), default=None)

    def warnings(self) -> list[str]:
        """What deserves a look but does not make the system unhealthy."""
        found = []
        for state in self.queues:
            if state.scheduler_gone and not state.scheduled:  # retries waiting: a problem (problems())
                found.append(
                    f"queue {state.name!r}: {state.workers} worker(s) live but no RQ scheduler runs for it: "
                    f"RQ's retries ({state.scheduled} scheduled) wait for the relay. Restart the workers with "
                    "--with-scheduler (see docs/operations.md)."
                )
        if self.batches and self.batches.get("reduce_failed"):
            found.append(f"{self.batches['reduce_failed']} batch(es) whose reduce gave up (reduce_failed).")
        if self.replication is not None and self.replication.warning():
            found.append(self.replication.warning())
        return found

    def problems(self, *, max_age: float | None = None, max_failed: int | None = None) -> list[str]:
        """Why the system is unhealthy, each with what to do; empty when healthy.

        Without a flag: requests pending on a queue on which no worker is registered (none runs, or its
        Redis restarted and lost the registrations); retries waiting in a queue's scheduled registry with no
        RQ scheduler to move them; where the backend cannot show its workers, a request pending longer than
        :attr:`stuck_after`; the backend unreachable. With ``max_age``: a request pending longer (in place of
        :attr:`stuck_after`); with ``max_failed``: more failed requests.
        """
        found = []
        oldest = self.oldest_pending_age
        if max_age is not None and oldest is not None and oldest > max_age:
            found.append(f"a request has been pending for {oldest:.0f} s (more than --max-age {max_age:g} s).")
        elif max_age is None and self.stuck_after is not None and oldest is not None and oldest > self.stuck_after:
            queue = max(self.backlog, key=lambda entry: entry.oldest_age).queue
            found.append(
                f"a request has been pending for {oldest:.0f} s, longer than a working system takes "
                f"({self.stuck_after:g} s: SAFEUPDATES_STUCK_AFTER): nothing seems to apply it, and the delivery "
                f"backend cannot show its workers: start one: {self.hints.get(queue, '')}."
            )
        if max_failed is not None and self.failed > max_failed:
            found.append(f"{self.failed} failed request(s) (more than --max-failed {max_failed}).")
        if self.backend_error:
            found.append(f"{self.backend_label} cannot be asked: {self.backend_error}")
        found += self.unconsumed()
        for state in self.queues:
            if state.scheduled and state.scheduler is False:
                found.append(
                    f"queue {state.name!r}: {state.scheduled} job(s) wait in its scheduled registry (retries), and "
                    "no RQ scheduler runs for it: restart a worker with --with-scheduler "
                    f"(python manage.py rqworker {state.name} --with-scheduler)."
                )
        return found

    def unconsumed(self) -> list[str]:
        """A problem per queue with pending requests that no worker consumes, as its backend counts them
        (RQ: registered workers; Celery: the broker's consumers, or on Redis the workers' answers), at once:
        a queue the backend cannot count (``workers`` None) waits for :attr:`stuck_after` instead."""
        pending: dict[str, int] = {}
        for entry in self.backlog:
            pending[entry.queue] = pending.get(entry.queue, 0) + entry.pending
        return [
            f"queue {state.name!r}: {pending[state.name]} request(s) pending, and no worker is registered on it "
            f"({self.no_worker}): start or restart one: {self.hints.get(state.name, '')}."
            for state in self.queues
            if pending.get(state.name) and state.workers == 0
        ]

    def as_json(self) -> dict[str, Any]:
        """The snapshot as JSON-ready data (``--json``)."""
        data = asdict(self)
        data["checked_at"] = self.checked_at.isoformat()
        data["pending"] = self.pending
        data["oldest_pending_age"] = self.oldest_pending_age
        for entry in data["failed_requests"]:
            entry["processed_at"] = entry["processed_at"] and entry["processed_at"].isoformat()
        for state, entry in zip(self.queues, data["queues"], strict=True):
            entry["scheduler_gone"] = state.scheduler_gone
        data["warnings"] = self.warnings()
        if self.replication is not None:
            data["replication"]["summary"] = self.replication.summary()
        return data


def model_label(content_type_id: int | None, using: str) -> str:
    """``app_label.Model`` of a content type id, ``"-"`` for none, ``"content type N"`` if it is gone."""
    if content_type_id is None:
        return "-"
    model = model_of(content_type_id, using)
    return f"content type {content_type_id}" if model is None else model._meta.label


def backlog(using: str | None = None) -> list[Backlog]:
    """The pending update requests per model and queue, with the oldest one's age: one query, through
    the ``safeupdates_pending`` index (it reads pending rows only, however long the history)."""
    using = using or router.db_for_write(ProcessedRequest)
    age = ExpressionWrapper(Now() - Min("created_at"), output_field=DurationField())
    rows = (
        ProcessedRequest.objects.using(using)
        .filter(status=RequestStatus.PENDING)
        .values("content_type_id", "queue")
        .annotate(pending=Count("pk"), oldest_age=age)
        .order_by("content_type_id", "queue")
    )
    return [
        Backlog(
            model=model_label(row["content_type_id"], using),
            queue=row["queue"] or "-",
            pending=row["pending"],
            oldest_age=max(0.0, row["oldest_age"].total_seconds()),
        )
        for row in rows
    ]


def relay_due(seconds: float, using: str | None = None) -> int:
    """The records with an update request pending for longer than ``seconds``: those a relay pass
    (:func:`safeupdates.pipeline.relay.relay`) would deliver again. One query through the
    ``safeupdates_pending`` index."""
    using = using or router.db_for_write(ProcessedRequest)
    return (
        ProcessedRequest.objects.using(using)
        .filter(status=RequestStatus.PENDING, kind=RequestKind.UPDATE, created_at__lte=older_than(seconds))
        .values("content_type_id", "object_id")
        .distinct()
        .count()
    )


def replication(using: str | None = None) -> Replication | None:
    """How the primary (the request log's database) replicates: ``pg_stat_replication`` and the settings
    that decide whether a commit waits for a standby (:data:`~safeupdates.database.statements.REPLICATION`).
    None on another database than PostgreSQL, when the database is itself a standby, or when the user may
    not read ``pg_stat_replication`` (a hardened server revokes it from PUBLIC): in a savepoint, so that a
    caller's transaction goes on."""
    using = using or router.db_for_write(ProcessedRequest)
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    try:
        with transaction.atomic(using=using):
            standby, names, commit, standbys, synchronous, hidden = fetch_one(connection, statements.REPLICATION)
    except ProgrammingError as exc:
        if not is_permission_denied(exc):
            raise
        return None
    if standby:
        return None
    return Replication(
        standbys=standbys,
        synchronous=synchronous,
        hidden=hidden,
        synchronous_standby_names=names,
        synchronous_commit=commit,
    )


def collect(*, using: str | None = None, failed_limit: int = 20, ask_rq: bool = True) -> Status:
    """Read the :class:`Status` of the job path: a few indexed queries and, with ``ask_rq``, the delivery
    backend's view of its queues (:func:`safeupdates.delivery.health`; RQ: every queue of ``RQ_QUEUES``).
    An unreachable broker is reported in ``backend_error``, not raised."""
    using = using or router.db_for_write(ProcessedRequest)
    log = ProcessedRequest.objects.using(using)
    # Terminal statuses only, as the safeupdates_outcomes index is (status <> 'pending').
    done = log.filter(status__in=sorted(TERMINAL_STATUSES)).exclude(status=RequestStatus.PENDING)
    recent = done.filter(processed_at__gte=older_than(RECENT)).values("status").annotate(count=Count("pk"))
    outcomes = {str(status): 0 for status in sorted(TERMINAL_STATUSES)}
    outcomes.update({row["status"]: row["count"] for row in recent})
    failed = done.filter(status=RequestStatus.FAILED)
    failed_requests = [
        FailedRequest(
            request_id=str(row.request_id),
            kind=row.kind,
            model=model_label(row.content_type_id, using),
            object_id=row.object_id,
            key=row.key,
            error=row.error,
            attempts=row.attempts,
            processed_at=row.processed_at,
        )
        for row in failed.order_by("-processed_at")[:failed_limit]
    ]
    status = Status(
        checked_at=database_now(using),
        backlog=backlog(using),
        outcomes=outcomes,
        failed=failed.count(),
        failed_requests=failed_requests,
        batches=_batches(using),
        relay_after=conf.relay_after(),
        replication=replication(using),
    )
    status.relay_due = relay_due(status.relay_after, using)
    chosen = delivery.backend()
    status.delivery, status.backend_label, status.no_worker = chosen.name, chosen.label, chosen.no_worker
    status.stuck_after = None if chosen.has_worker_heartbeats else conf.stuck_after()
    status.hints = {entry.queue: chosen.worker_hint(entry.queue) for entry in status.backlog}
    if ask_rq:
        try:
            status.queues = chosen.health(sorted({entry.queue for entry in status.backlog} - {"-"}))
        except BackendUnavailable as exc:
            status.backend_error = str(exc)
    return status


def _batches(using: str) -> dict[str, int] | None:
    """Running and failed batches of ``fan_out()``, if its app is installed (through the app registry)."""
    try:
        batch = apps.get_model("safeupdates_batches", "Batch")  # the app's label: nothing of it is imported
    except LookupError:
        return None
    wanted = [batch.Status.RUNNING, batch.Status.REDUCE_FAILED]
    counts = dict(
        batch._base_manager.using(using)
        .filter(status__in=wanted)
        .values_list("status")
        .annotate(count=Count("pk"))
        .values_list("status", "count")
    )
    return {str(status): counts.get(status, 0) for status in wanted}
