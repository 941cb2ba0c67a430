"""The delivery seam: where a committed request's apply job goes, whatever delivers it.

The stages of the job path (:mod:`safeupdates.pipeline`) call the verbs of this module and never ask
which backend runs: deliver a record's job after the commit or leave it to the relay
(:func:`deliver_or_leave_for_relay`), deliver again what the relay found overdue (:func:`redeliver`),
the queue to deliver on (:func:`queue_name`, :func:`relay_queue`), which job runs now
(:func:`running_job`), will it run again (:func:`will_retry`), and what the queues look like
(:func:`health`). Each verb asks :func:`backend`, the :class:`Backend` that ``SAFEUPDATES_DELIVERY``
names; each backend is one module of this package (:mod:`~safeupdates.delivery.rq`,
:mod:`~safeupdates.delivery.tasks`, :mod:`~safeupdates.delivery.celery`) with its own system checks
(:meth:`Backend.check`, run by :func:`check`) and start-up (:meth:`Backend.ready`, run by :func:`ready`),
so a new one is one new file and a line in :data:`BACKENDS`, the only list of the deliveries.

Whatever the backend, the request log is the outbox: a job carries request ids and the record's
identity, never the changes, and the relay delivers again whatever was lost. This package is the only
part of the core that imports a queue library (``rq``, ``django_rq``, ``redis``, ``django.tasks``,
``celery``, ``kombu``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS
from django.utils.module_loading import import_string

from safeupdates import conf

__all__ = [
    "APPLY_UPDATE",
    "BACKENDS",
    "Backend",
    "Delivery",
    "QueueHealth",
    "Redelivered",
    "Registered",
    "RunningJob",
    "Unavailable",
    "backend",
    "check",
    "current_job_id",
    "deliver_or_leave_for_relay",
    "fail_without_retry",
    "health",
    "queue_name",
    "ready",
    "redeliver",
    "relay_queue",
    "requires",
    "retry_delay",
    "running_job",
    "take_waiting",
    "will_retry",
]

logger = logging.getLogger("safeupdates")

#: The apply job's function, by the dotted path under which workers import it: every backend's job runs it.
#: A wire path: jobs already queued name it, so it never changes.
APPLY_UPDATE = "safeupdates.jobs.apply_update"


class Registered(NamedTuple):
    """A delivery backend as :data:`BACKENDS` lists it."""

    #: Its :class:`Backend` subclass, by dotted path (imported when first used).
    path: str
    #: What it delivers through, for check E020's hint.
    what: str


#: The deliveries: ``SAFEUPDATES_DELIVERY`` -> its backend. The only list of them.
BACKENDS: dict[str, Registered] = {
    "rq": Registered("safeupdates.delivery.rq.RQBackend", "the default: RQ through django-rq"),
    "tasks": Registered(
        "safeupdates.delivery.tasks.TasksBackend",
        "Django's Tasks framework, on the TASKS backend named by SAFEUPDATES_TASK_BACKEND",
    ),
    "celery": Registered(
        "safeupdates.delivery.celery.CeleryBackend", "the project's Celery app, SAFEUPDATES_CELERY_APP"
    ),
}


@dataclass(frozen=True)
class Delivery:
    """One record's apply job to deliver: the request that asks for it, the record, where, which database."""

    request_id: str
    content_type_id: int
    object_id: str
    queue: str
    using: str = DEFAULT_DB_ALIAS

    @property
    def record(self) -> str:
        """``content_type_id:object_id``, as the logs and the relay's warnings name a record."""
        return f"{self.content_type_id}:{self.object_id}"


@dataclass
class Redelivered:
    """What the relay's deliveries did; the relay adds these up in its report."""

    #: Jobs put on a queue: new ones, and ones moved out of a registry where they would have waited forever.
    enqueued: int = 0
    #: Of ``enqueued``: jobs moved out of such a registry (RQ's scheduled and deferred registries).
    moved: int = 0
    #: Records whose job was found waiting (only a backend that :attr:`~Backend.can_list_queued` can tell).
    waiting: int = 0
    #: What deserves the operator's attention (the relay logs each one).
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunningJob:
    """The apply job (or task) this code runs in: its id, its queue, and the trace context it carries."""

    id: str | None
    queue: str | None
    trace: dict[str, str] | None = None


@dataclass(frozen=True)
class QueueHealth:
    """What a backend tells of one queue, for ``safeupdates_status``; None where it cannot tell."""

    name: str
    queued: int | None
    scheduled: int | None = None
    failed: int | None = None
    workers: int | None = None
    busy_workers: int | None = None
    scheduler: bool | None = None

    @property
    def scheduler_gone(self) -> bool:
        """Workers live, but no scheduler runs for the queue: RQ's retries wait for the relay."""
        return bool(self.workers) and self.scheduler is False


class Backend:
    """What a delivery backend does for the stages. One subclass per module of this package.

    Capabilities are class flags, as Django's task backends declare theirs: the stages read them,
    they never test which backend they have.
    """

    #: What @idempotent decorates on it, for check W021's hint.
    task_functions: ClassVar[str] = "its task functions"
    #: What the status page calls it when it cannot be asked ("RQ cannot be asked: ...").
    label: ClassVar[str] = "the delivery backend"
    #: Why a queue can show no worker, for the status page ("no worker is registered on it (...)").
    no_worker: ClassVar[str] = "none runs, or its broker restarted and lost the workers' registrations"
    #: Whether it can tell that a record's job is waiting: a burst of one record then costs one job, and
    #: the relay counts it "already queued". Without it every request gets a job and the relay delivers
    #: from the request log alone: the guarded, idempotent apply makes a duplicate harmless.
    can_list_queued: ClassVar[bool] = False
    #: Whether :meth:`health` knows the live workers of a queue (heartbeats).
    has_worker_heartbeats: ClassVar[bool] = False
    #: Whether a running apply job may take other records' waiting jobs off its queue and apply them
    #: itself (:meth:`take_waiting`: the sweep of :mod:`safeupdates.pipeline.apply`).
    can_take_waiting: ClassVar[bool] = False

    def __init__(self, name: str) -> None:
        #: The value of ``SAFEUPDATES_DELIVERY`` that selects it (its key in :data:`BACKENDS`).
        self.name = name

    def queue_name(self, queue: str | None) -> str:
        """The queue an ``enqueue_update()`` delivers on: ``queue``, else ``SAFEUPDATES_QUEUE``; raise
        :class:`~safeupdates.exceptions.InvalidUpdate` naming the choices if the backend does not serve it."""
        raise NotImplementedError

    def relay_queue(self, wanted: str, what: str) -> tuple[str | None, str | None]:
        """The queue on which the relay delivers ``what``'s work, wanted on ``wanted`` (None: nowhere), and
        a warning if that is not ``wanted``: a request must not wait for a queue no worker serves."""
        raise NotImplementedError

    def deliver(
        self, delivery: Delivery, *, likely_queued: bool = False, trace: dict[str, str] | None = None
    ) -> str | None:
        """Make sure a job will apply ``delivery.request_id``: the id of the job (or task, or message) it
        enqueued, or None if the record's job was found waiting (it will read the request).
        ``likely_queued``: other requests of the record are pending (a burst). ``trace``: a trace context
        for the job to continue. Raises what the broker raises."""
        raise NotImplementedError

    def unreachable(self, error: Exception, delivery: Delivery) -> str | None:
        """If ``error`` (raised by :meth:`deliver`) means the broker cannot be reached, why, in words for
        the one warning line of a request left for the relay; None: not an outage (it propagates)."""
        return None

    def left_for_relay(self, delivery: Delivery) -> None:
        """Called after the warning line of a request left for the relay (an outage that lasts is worth a
        summary now and then)."""

    def delivered(self, delivery: Delivery) -> None:
        """Called after :meth:`deliver` succeeded (an outage that ended is worth a line)."""

    def redeliver(self, deliveries: Sequence[Delivery]) -> Redelivered:
        """The relay's deliveries, one per record whose requests are overdue. Raises
        :class:`~safeupdates.exceptions.BackendUnavailable` if the broker cannot be reached."""
        raise NotImplementedError

    def running(self) -> RunningJob | None:
        """The apply job this code runs in, or None outside one."""
        return None

    def will_retry(self, request_id: uuid.UUID) -> bool:
        """Called in the running apply job as it fails on a transient database error: True if the job
        will run again (the request stays ``pending``), False if this was its last try."""
        return False

    def fail_without_retry(self) -> None:
        """Make the running job fail now, without retries: its argument is wrong, and always will be."""

    def take_waiting(self, records: Sequence[tuple[int, str]], using: str) -> list[bool]:
        """Take the waiting apply jobs of ``records`` off the running job's queue (see
        :attr:`can_take_waiting`); for each record, whether one was taken."""
        return [False] * len(records)

    def health(self, queues: Sequence[str] = ()) -> list[QueueHealth]:
        """Each queue it serves, as far as it can tell, and each of ``queues`` (those with pending requests)
        that it cannot list by itself. Raises :class:`~safeupdates.exceptions.BackendUnavailable` if the
        broker cannot be asked."""
        return []

    def worker_hint(self, queue: str) -> str:
        """What to run so that a worker serves ``queue`` (the status page's advice)."""
        return f"start a worker of queue {queue!r}"

    def check(self) -> list[CheckMessage]:
        """System check messages for its settings (run by :func:`check`)."""
        return []

    def ready(self) -> None:
        """Start-up, in every process, once the app registry is ready (run by :func:`ready`, after its module
        was imported: Celery's tasks register then). No database may be touched."""


class Unavailable(ImproperlyConfigured):
    """A backend's module cannot import its queue library: ``problem`` is the system check error that says so."""

    def __init__(self, problem: CheckMessage) -> None:
        super().__init__(f"{problem.msg} {problem.hint} ({problem.id})")
        self.problem = problem


@contextmanager
def requires(problem: CheckMessage) -> Iterator[None]:
    """Around a backend module's import of its queue library: an ImportError there raises :class:`Unavailable`
    with ``problem``, which :func:`check` reports and :func:`ready` passes over."""
    try:
        yield
    except ImportError as exc:
        raise Unavailable(problem) from exc


_loaded: dict[str, Backend] = {}


def backend() -> Backend:
    """The backend that ``SAFEUPDATES_DELIVERY`` names, made once per value (read at call time, so that
    ``override_settings`` switches it). Raises :class:`Unavailable` if its library cannot be imported."""
    name = conf.delivery()
    chosen = _loaded.get(name)
    if chosen is None:
        if name not in BACKENDS:
            raise ImproperlyConfigured(
                f"SAFEUPDATES_DELIVERY = {name!r} is not one of {', '.join(map(repr, BACKENDS))} (safeupdates.E020)."
            )
        chosen = _loaded[name] = import_string(BACKENDS[name].path)(name)
    return chosen


def check() -> list[CheckMessage]:
    """The delivery's system checks: E020, ``SAFEUPDATES_DELIVERY`` names none of :data:`BACKENDS`; the error
    of a backend whose library cannot be imported (:class:`Unavailable`: E021, E025); else the backend's own
    (:meth:`Backend.check`)."""
    name = conf.delivery()
    if name not in BACKENDS:
        *others, last = (f'"{key}" ({registered.what})' for key, registered in BACKENDS.items())
        return [
            Error(
                f"SAFEUPDATES_DELIVERY = {name!r} is not valid. It sets how apply jobs are delivered.",
                hint=f"Set it to {', '.join(others)} or {last}.",
                id="safeupdates.E020",
            )
        ]
    try:
        return backend().check()
    except Unavailable as exc:
        return [exc.problem]


def ready() -> None:
    """Start-up (safeupdates' ``AppConfig.ready()``): import the chosen backend's module and run its
    :meth:`Backend.ready`; nothing where it cannot be made (its system check says why)."""
    if conf.delivery() not in BACKENDS:
        return  # E020
    try:
        chosen = backend()
    except Unavailable:  # E021, E025
        return
    chosen.ready()


def deliver_or_leave_for_relay(
    request_id: uuid.UUID | str,
    content_type_id: int,
    object_id: str,
    queue: str,
    *,
    what: str,
    likely_queued: bool = False,
    trace: dict[str, str] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Deliver committed request ``request_id`` of record ``content_type_id:object_id`` (in database
    ``using``) on ``queue``; if the broker cannot be reached, leave it to the relay.

    The request is saved (pending) and the relay delivers it, so an unreachable broker is worth one
    WARNING line per request (``what`` names its record), no traceback. Any other error propagates.
    """
    chosen = backend()
    delivery = Delivery(str(request_id), content_type_id, object_id, queue, using)
    try:
        chosen.deliver(delivery, likely_queued=likely_queued, trace=trace)
    except Exception as exc:
        reason = chosen.unreachable(exc, delivery)
        if reason is None:
            raise
        logger.warning(
            "safeupdates: request %s (%s) is saved, but %s: the relay will deliver it.",
            request_id,
            what,
            reason,
            extra={"request_id": str(request_id)},
        )
        chosen.left_for_relay(delivery)
        return
    chosen.delivered(delivery)


def redeliver(deliveries: Sequence[Delivery]) -> Redelivered:
    """The relay's deliveries (see :meth:`Backend.redeliver`)."""
    return backend().redeliver(deliveries) if deliveries else Redelivered()


def queue_name(queue: str | None) -> str:
    """The queue an ``enqueue_update()`` delivers on (see :meth:`Backend.queue_name`)."""
    return backend().queue_name(queue)


def relay_queue(wanted: str, what: str, warn: Callable[[str], object]) -> str | None:
    """The queue on which the relay delivers ``what``'s work, wanted on ``wanted``; a warning goes to
    ``warn`` (see :meth:`Backend.relay_queue`). None: nowhere."""
    queue, warning = backend().relay_queue(wanted, what)
    if warning:
        warn(warning)
    return queue


def running_job() -> RunningJob | None:
    """The apply job this code runs in, or None outside one."""
    return backend().running()


def current_job_id() -> str | None:
    """The id of the job or task this code runs in (its outcome signals carry it); None outside one."""
    job = backend().running()
    return None if job is None else job.id


def will_retry(request_id: uuid.UUID) -> bool:
    """True if the running job of ``request_id`` will run again should it fail now (see
    :meth:`Backend.will_retry`): the request then stays ``pending``."""
    return backend().will_retry(request_id)


def retry_delay(number: int) -> float:
    """Seconds before retry ``number`` (0 for the first) of a backend that retries by itself (Celery,
    Tasks): ``SAFEUPDATES_RETRY``'s ``interval``, its last entry for every later retry."""
    interval = conf.retry().get("interval", 0)
    if isinstance(interval, list | tuple):
        return float(interval[min(number, len(interval) - 1)]) if interval else 0.0
    return float(interval)


def fail_without_retry() -> None:
    """Make the running job fail now, without retries (see :meth:`Backend.fail_without_retry`)."""
    backend().fail_without_retry()


def take_waiting(records: Sequence[tuple[int, str]], using: str) -> list[bool]:
    """Take other records' waiting jobs off the running job's queue (see :meth:`Backend.take_waiting`)."""
    chosen = backend()
    return chosen.take_waiting(records, using) if chosen.can_take_waiting else [False] * len(records)


def health(queues: Sequence[str] = ()) -> list[QueueHealth]:
    """What the backend tells of its queues and of ``queues`` (see :meth:`Backend.health`)."""
    return backend().health(queues)
