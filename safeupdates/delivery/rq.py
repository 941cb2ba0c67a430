"""Delivery through RQ (django-rq), the default: :class:`RQBackend`, and everything else that touches RQ.

The django-rq queues, job ids and options, delivery of the apply jobs (one job per record, shared with
RQ's ``unique=True``), RQ's registries and scheduler as the relay sees them, the running job's retries,
and the sweep's taking of other records' waiting jobs. The rest of the core never imports ``rq``,
``django_rq`` or ``redis``: the stages call the seam (:mod:`safeupdates.delivery`), which calls
:class:`RQBackend`. Functions given to workers travel as dotted paths (:func:`dotted_path`), so this module
imports nothing of the job path. The job tools of :mod:`safeupdates.contrib` use its queues too.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import django_rq
from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import DEFAULT_DB_ALIAS
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, Retry, Worker, get_current_job
from rq.exceptions import DuplicateJobError, InvalidJobOperation, NoSuchJobError
from rq.job import JOB_ID_PATTERN, Job, JobStatus
from rq.scheduler import RQScheduler
from rq.utils import as_text, current_timestamp, import_attribute

from safeupdates import conf, tracing
from safeupdates.delivery import APPLY_UPDATE, Backend, Delivery, QueueHealth, Redelivered, RunningJob
from safeupdates.exceptions import BackendUnavailable, InvalidControl, InvalidUpdate

logger = logging.getLogger("safeupdates")

# Job states in which a queued job has not yet read the pending requests: it will see ours.
_WILL_RUN = frozenset({JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED})


def dotted_path(func: Callable[..., Any] | str) -> str:
    """Return the dotted path by which a worker imports ``func`` (a module-level callable or a path).

    Raises :class:`~safeupdates.exceptions.InvalidControl` for what a worker could not import: lambdas,
    nested functions, functions of ``__main__``, paths that do not import or name no callable.
    """
    if isinstance(func, str):
        resolve(func)
        return func
    if not callable(func):
        raise InvalidControl(f"func must be a callable or its dotted path, not {func!r}.")
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        raise InvalidControl(
            f"{func!r} cannot be imported by a worker; pass a function defined at module level (not a lambda, "
            "a nested function or one from __main__) or its dotted path."
        )
    path = f"{module}.{qualname}"
    imported: Any = None
    with contextlib.suppress(ImportError, AttributeError, ValueError):
        imported = import_attribute(path)
    if imported is not func and imported != func:
        raise InvalidControl(f"{func!r} is not importable as {path!r}; pass a module-level function or its path.")
    return path


def resolve(path: str) -> Callable[..., Any]:
    """Import the callable at dotted ``path``."""
    try:
        target = import_attribute(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidControl(f"func {path!r} cannot be imported: {exc}") from None
    if not callable(target):
        raise InvalidControl(f"func {path!r} names {target!r}, which is not callable.")
    return target  # type: ignore[no-any-return]


_QUEUES: dict[tuple[str, str], Queue] = {}


def get_queue(name: str) -> Queue:
    """The django-rq queue ``name``, built once per configuration and reused.

    ``django_rq.get_queue()`` builds a new Redis client, and so opens a new connection, on every call:
    that connect was most of the cost of an ``enqueue_update()``. redis-py's pool is thread-safe and
    resets itself in a forked child. Enqueues happen at once (``commit_mode="auto"``): callers choose the
    moment, for example in ``on_commit``.
    """
    config = repr(settings.RQ_QUEUES.get(name))
    key = (name, config)
    queue = _QUEUES.get(key)
    if queue is None:
        queue = _QUEUES[key] = django_rq.get_queue(name, commit_mode="auto")
    return queue


def queue_problem() -> tuple[str, str, str] | None:
    """What is wrong with the queue settings of the job path, as ``(message, hint, check id)``; None if
    nothing is: django_rq must be installed (E001) and ``SAFEUPDATES_QUEUE`` be one of ``RQ_QUEUES`` (E002)."""
    if not apps.is_installed("django_rq"):
        return (
            "django_rq is not in INSTALLED_APPS.",
            "SAFEUPDATES_DELIVERY is 'rq' (the default): safeupdates delivers its jobs through django-rq. "
            "Add 'django_rq' to INSTALLED_APPS and configure RQ_QUEUES, or set SAFEUPDATES_DELIVERY to 'celery' "
            "or 'tasks' (docs/delivery.md).",
            "safeupdates.E001",
        )
    queues = getattr(settings, "RQ_QUEUES", {}) or {}
    name = conf.queue_name()
    if name not in queues:
        return (
            f"SAFEUPDATES_QUEUE is {name!r}, which is not a queue in RQ_QUEUES.",
            f"Add {name!r} to RQ_QUEUES or set SAFEUPDATES_QUEUE to one of: "
            f"{', '.join(sorted(queues)) or '(none configured)'}.",
            "safeupdates.E002",
        )
    return None


def job_id(content_type_id: int, object_id: str, using: str = DEFAULT_DB_ALIAS) -> str:
    """The id that every apply job of one record shares: a short object id as it is, else its digest.

    A record of a database other than ``default`` has its database in the id (``safeupdates_<alias>-``:
    an alias of letters and digits as it is, else ``_`` and its digest), so that the records of two
    databases with the same content type id and key never share a job.
    """
    key = (
        object_id
        if JOB_ID_PATTERN.fullmatch(object_id) and len(object_id) <= 64
        else (hashlib.sha1(object_id.encode()).hexdigest())
    )
    if using == DEFAULT_DB_ALIAS:
        return f"safeupdates-{content_type_id}-{key}"
    database = using if using.isascii() and using.isalnum() and len(using) <= 32 else None
    database = database or f"_{hashlib.sha1(using.encode()).hexdigest()[:20]}"
    return f"safeupdates_{database}-{content_type_id}-{key}"


def job_kwargs(using: str) -> dict[str, str]:
    """The keyword arguments of an apply job: the request's database, unless it is ``default`` (the
    jobs of ``default`` stay what they always were)."""
    return {} if using == DEFAULT_DB_ALIAS else {"using": using}


def deliver(
    request_id: uuid.UUID | str,
    content_type_id: int,
    object_id: str,
    queue_name: str,
    *,
    force: bool = False,
    likely_queued: bool = False,
    meta: dict[str, Any] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job | None:
    """Make sure a job will apply ``request_id``; return the job put on the queue, or None if one was
    already waiting there. ``meta`` goes into a new job's meta (a trace context; never the changes).
    ``using`` is the database the request is in: the job carries it (see :func:`job_kwargs`).

    Jobs of one record share an id and are enqueued with RQ's ``unique=True``: while that job is still
    queued (not started), it will read our request when it starts, so no new job is needed. Once it
    has started it may have read the pending requests already, so the record's follow-up job (a second
    shared id) takes the request; once that has started too, a job of our own is enqueued.
    ``likely_queued`` (other requests of the record are pending: a burst) asks for the job's status
    first, one small round trip that usually settles it, instead of a unique enqueue that would fail.
    ``force=True`` (the relay) also checks that a job RQ calls queued, scheduled or deferred is really
    on its way to a worker: see :func:`_find_waiting`.
    """
    return deliver_with_outcome(
        request_id,
        content_type_id,
        object_id,
        queue_name,
        force=force,
        likely_queued=likely_queued,
        meta=meta,
        using=using,
    )[0]


# What a delivery found or did: enqueued a job, moved the record's job out of RQ's scheduled or deferred
# registry onto the queue, or found it waiting (in the queue, or scheduled and not yet due).
ENQUEUED, MOVED_SCHEDULED, MOVED_DEFERRED, WAITING = "enqueued", "moved scheduled", "moved deferred", "waiting"


def deliver_with_outcome(
    request_id: uuid.UUID | str,
    content_type_id: int,
    object_id: str,
    queue_name: str,
    *,
    force: bool = False,
    likely_queued: bool = False,
    meta: dict[str, Any] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> tuple[Job | None, str]:
    """:func:`deliver`, and what it found or did (``ENQUEUED`` ...).

    A record has two job ids, tried in turn: its job, and its follow-up job. While the record's job runs
    (a slow or cut-off worker), the requests committed meanwhile share the follow-up job instead of
    getting one job each. Only when both have started (or failed) does a request get a job of its own.
    Where the record's job is known to be gone (its status was asked: ``likely_queued``) while its
    follow-up job waits, that one reads the request: no job is enqueued.
    """
    queue = get_queue(queue_name)
    args, kwargs = (str(request_id),), job_kwargs(using)
    options = job_options(content_type_id, object_id)
    record_job = job_id(content_type_id, object_id, using)
    follow_up = f"{record_job}-next"
    for candidate in (record_job, follow_up):
        status = _job_status(queue, candidate) if likely_queued else None
        if status is None and likely_queued and candidate == record_job:
            # The record's job is gone (it ran: no result is kept); its follow-up may still wait.
            waiting = _job_status(queue, follow_up)
            if waiting in _WILL_RUN:
                found = _find_waiting(queue, follow_up, waiting) if force else (None, WAITING)
                if found is not None:
                    return found
        if status is None:
            job = queue.create_job(APPLY_UPDATE, args=args, kwargs=kwargs, job_id=candidate, meta=meta, **options)
            try:
                return _enqueue_unique(queue, job), ENQUEUED
            except DuplicateJobError:
                status = _job_status(queue, candidate)
        if status in _WILL_RUN:
            if not force:
                return None, WAITING
            found = _find_waiting(queue, candidate, status)
            if found is not None:
                return found
        # Started, failed, or lost on its way: it may have read the pending requests already.
    return queue.enqueue_call(APPLY_UPDATE, args=args, kwargs=kwargs, meta=meta, **options), ENQUEUED


def deliver_many(
    queue_name: str, deliveries: Sequence[tuple[str, int, str]], using: str = DEFAULT_DB_ALIAS
) -> tuple[int, int, list[int]]:
    """For the relay: settle in two round trips the records of ``deliveries`` (``(request_id,
    content_type_id, object_id)``) whose job is gone or plainly waiting; return ``(jobs enqueued, jobs
    found waiting, indexes of the rest)``, which :func:`deliver_with_outcome` then checks one by one
    (started, stuck in a registry, lost on its way). ``using``: the database the requests are in.

    One pipeline asks, per record, the status of its job and of its follow-up job and the job's place in
    the queue. A record with neither job gets one, all in a second pipeline (RQ's ``enqueue_many``); a
    record whose job is queued and in the queue needs nothing. Per record, a unique enqueue or a status
    and a place asked in turn cost two round trips each: a relay pass after Redis lost its data delivers
    hundreds. Should an ``enqueue_update()`` create one of these jobs between the two pipelines, the
    record's job is pushed twice and runs twice, which applying allows (the second run finds nothing).
    """
    queue = get_queue(queue_name)
    ids = [job_id(content_type_id, object_id, using) for _request_id, content_type_id, object_id in deliveries]
    with queue.connection.pipeline(transaction=False) as asked:
        # The queue back in RQ's set of queues, should Redis have lost its data: once per pass.
        asked.sadd(queue.redis_queues_keys, queue.key)
        for record_job in ids:
            asked.hget(Job.key_for(record_job), "status")
            asked.hget(Job.key_for(f"{record_job}-next"), "status")
            asked.lpos(queue.key, record_job)
        answers = asked.execute()[1:]
    lost, waiting, rest = [], 0, []
    for index in range(len(deliveries)):
        status, next_status, position = answers[3 * index : 3 * index + 3]
        if status is None and next_status is None:
            lost.append(index)
        elif status is not None and as_text(status) == JobStatus.QUEUED and position is not None:
            waiting += 1
        else:
            rest.append(index)
    if lost:
        queue.enqueue_many(
            [
                Queue.prepare_data(
                    APPLY_UPDATE,
                    args=(str(deliveries[index][0]),),
                    kwargs=job_kwargs(using),
                    job_id=ids[index],
                    **job_options(deliveries[index][1], deliveries[index][2]),
                )
                for index in lost
            ]
        )
    return len(lost), waiting, rest


def _find_waiting(queue: Queue, job_id: str, status: JobStatus) -> tuple[Job | None, str] | None:
    """For the relay: is the job that RQ calls queued, scheduled or deferred really on its way?

    Returns ``(None, WAITING)`` if it is, ``(job, _MOVED_...)`` if it was stuck in a registry and has
    been moved onto the queue, and None if it is lost (the caller enqueues a new job). How RQ 3.0 keeps
    them: a job taken off the queue by a worker that was killed before it started it is still "queued"
    but in no queue. A retry with back-off is "scheduled" in the queue's ScheduledJobRegistry, and only
    an RQ scheduler (a worker started ``--with-scheduler``) moves it to the queue when it is due: without
    one it waits forever. A "deferred" job waits in the DeferredJobRegistry for jobs it depends on, and
    safeupdates never makes a job depend on another.
    """
    if status == JobStatus.QUEUED:
        return (None, WAITING) if queue.get_job_position(job_id) is not None else None
    scheduled = status == JobStatus.SCHEDULED
    registry = queue.scheduled_job_registry if scheduled else queue.deferred_job_registry
    due_at = queue.connection.zscore(registry.key, job_id)
    if due_at is None:
        return None
    if scheduled and due_at > current_timestamp():
        return None, WAITING  # a retry waiting out its back-off (the relay reports a missing scheduler)
    try:
        # The registry's ZREM decides who moves the job, should a scheduler take it at the same moment.
        return registry.requeue(job_id), MOVED_SCHEDULED if scheduled else MOVED_DEFERRED
    except InvalidJobOperation:
        return None, WAITING  # a scheduler moved it meanwhile
    except NoSuchJobError:
        return None


def _job_status(queue: Queue, job_id: str) -> JobStatus | None:
    """The status of job ``job_id`` (one HGET), or None if there is no such job (or it has no status)."""
    try:
        return queue.job_class(job_id, connection=queue.connection).get_status()
    except InvalidJobOperation:
        return None


def job_options(content_type_id: int, object_id: str) -> dict[str, Any]:
    """RQ options of an apply job: native timeout, retries with back-off, no result kept."""
    options: dict[str, Any] = {
        "timeout": conf.job_timeout(),
        "result_ttl": 0,
        "failure_ttl": 7 * 24 * 3600,
        "description": f"safeupdates apply {content_type_id}:{object_id}",
    }
    retry = conf.retry()
    if retry.get("max"):
        options["retry"] = Retry(**retry)
    return options


# Queues this process has registered in RQ's set of queue names (what ``rq info`` lists).
_registered: set[tuple[int, str]] = set()


def _enqueue_unique(queue: Queue, job: Job) -> Job:
    """Enqueue ``job`` with RQ's ``unique=True``; raise DuplicateJobError if its id exists.

    RQ runs its unique enqueue as one Lua script (check the id, save the job, push it) at once, but first
    adds the queue's name to its set of queues in a separate round trip, on every enqueue. That name
    only needs adding once: here it goes onto a pipeline that runs the first time this process delivers
    on the queue; a relay pass puts it back once per queue after Redis lost its data (the first pipeline
    of :func:`deliver_many`).
    An ``enqueue_update()`` then costs one Redis round trip, a plain ``queue.enqueue()`` two.
    """
    key = (id(queue.connection), queue.key)
    with queue.connection.pipeline() as registration:
        try:
            return queue.enqueue_job(job, pipeline=registration, unique=True)
        finally:
            # RQ 3.0 runs the script outside the pipeline and leaves only that SADD on it. Should a
            # release queue anything else there, the pipeline runs: slower, never a job left unsent.
            queued = [args[0] for args, _options in registration.command_stack]
            if key not in _registered or queued != ["SADD"]:
                registration.execute()
                _registered.add(key)


def scheduler_state(queue_name: str) -> tuple[int, bool]:
    """``(jobs waiting in the queue's scheduled registry, whether an RQ scheduler runs for the queue)``.

    A running scheduler holds RQ's scheduler lock of the queue (renewed every second).
    """
    queue = get_queue(queue_name)
    with unreachable_redis(queue_name):
        waiting = int(queue.connection.zcard(queue.scheduled_job_registry.key))
        running = bool(queue.connection.exists(RQScheduler.get_locking_key(queue_name)))
    return waiting, running


@contextmanager
def unreachable_redis(queue_name: str) -> Iterator[None]:
    """Raise :class:`BackendUnavailable` if the Redis server of queue ``queue_name`` cannot be reached."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise BackendUnavailable("Redis", _where(queue_name), exc) from exc


def _where(queue_name: str) -> str:
    """The address of queue ``queue_name``'s Redis server, without a password."""
    options = get_queue(queue_name).connection.connection_pool.connection_kwargs
    db = options.get("db") or 0  # django-rq passes db=None for a URL that names none: redis-py's 0
    if options.get("path"):
        return f"unix://{options['path']}?db={db}"
    return f"redis://{options.get('host', 'localhost')}:{options.get('port', 6379)}/{db}"


#: Seconds between two summaries of an outage of Redis in the log (see :meth:`RQBackend.unreachable`).
OUTAGE_SUMMARY_EVERY = 60.0


class _Outage:
    """The deliveries of this process that found Redis unreachable, since the last one that reached it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.since: float | None = None
        self.left = 0
        self.summarized_at = 0.0

    def failed(self, where: str) -> None:
        now = time.monotonic()
        with self.lock:
            if self.since is None:
                self.since, self.left, self.summarized_at = now, 0, now
            self.left += 1
            if now - self.summarized_at < OUTAGE_SUMMARY_EVERY:
                return
            self.summarized_at = now
            lasted, left = now - self.since, self.left
        logger.warning(
            "safeupdates: Redis at %s has been unreachable for %.0f s: %d request(s) saved and left for the "
            "relay (safeupdates_relay) meanwhile.",
            where,
            lasted,
            left,
        )

    def reached(self, where: str) -> None:
        if self.since is None:  # the usual case: no lock taken
            return
        with self.lock:
            if self.since is None:
                return
            lasted, left, self.since, self.left = time.monotonic() - self.since, self.left, None, 0
        logger.warning(
            "safeupdates: Redis at %s is reachable again after %.0f s; %d request(s) saved meanwhile wait for "
            "the relay (safeupdates_relay).",
            where,
            lasted,
            left,
        )


_outage = _Outage()


def current_job_id() -> str | None:
    """The id of the RQ job this code runs in, or None outside a job."""
    job = get_current_job()
    return None if job is None else str(job.id)


# Takes waiting apply jobs (ARGV: job ids) off the queue (KEYS[1]) at once, against a worker's dequeue:
# a job id still in the queue's list is removed and its hash (KEYS[i + 1]) deleted, so that the record's
# next request enqueues a job anew; a job a worker has already taken is left alone. Returns 1 for each
# id taken, else 0.
_TAKE_WAITING = """
local taken = {}
for i, job_id in ipairs(ARGV) do
    taken[i] = redis.call("LREM", KEYS[1], 1, job_id)
    if taken[i] == 1 then
        redis.call("DEL", KEYS[i + 1])
    end
end
return taken
"""
_take_waiting_scripts: dict[int, Any] = {}


def take_waiting(records: Sequence[tuple[int, str]], using: str = DEFAULT_DB_ALIAS) -> list[bool]:
    """Take the waiting apply jobs of ``records`` (``(content_type_id, object_id)`` each, in database
    ``using``) off the running job's queue, in one round trip; for each record, whether a job was taken.

    The running job then owes a taken record its work: every request whose delivery found the taken
    job waiting was committed before this call returns, so a claim that starts afterwards sees it, and
    a delivery that comes later finds no job and enqueues one (:func:`deliver_with_outcome`). Nothing is
    taken outside an RQ job, nor for a record whose job a worker runs or that has none (the relay's).
    """
    job = get_current_job()
    if job is None or not records:
        return [False] * len(records)
    connection = job.connection
    script = _take_waiting_scripts.get(id(connection))
    if script is None:
        script = _take_waiting_scripts[id(connection)] = connection.register_script(_TAKE_WAITING)
    ids = []
    for content_type_id, object_id in records:
        record_job = job_id(content_type_id, object_id, using)
        ids += [record_job, f"{record_job}-next"]  # the record's job and its follow-up job
    keys = [Queue(str(job.origin), connection=connection).key, *(type(job).key_for(one) for one in ids)]
    taken = script(keys=keys, args=ids)
    return [bool(taken[2 * i] or taken[2 * i + 1]) for i in range(len(records))]


def queue_states(names: list[str]) -> list[QueueHealth]:
    """The :class:`~safeupdates.delivery.QueueHealth` of every queue in ``names`` (each one a key of
    ``RQ_QUEUES``): jobs waiting, scheduled (retries) and failed; live workers; whether an RQ scheduler
    holds the queue's lock.

    Raises :class:`~safeupdates.exceptions.BackendUnavailable` if a queue's Redis cannot be reached.
    """
    states = []
    for name in names:
        queue = get_queue(name)
        with unreachable_redis(name):
            workers = Worker.all(queue=queue)
            states.append(
                QueueHealth(
                    name=name,
                    queued=queue.count,
                    scheduled=queue.scheduled_job_registry.count,
                    failed=queue.failed_job_registry.count,
                    workers=len(workers),
                    busy_workers=sum(1 for worker in workers if worker.get_state() == "busy"),
                    scheduler=bool(queue.connection.exists(RQScheduler.get_locking_key(name))),
                )
            )
    return states


def fail_without_retry() -> None:
    """Make RQ fail the running job at once: its argument is wrong, and will be wrong on every retry.

    RQ 3.0's worker decides whether to retry from the ``retries_left`` of the very job object that
    ``get_current_job()`` returns (``Worker.handle_job_failure``: ``job.should_retry``).
    """
    job = get_current_job()
    if job is not None:
        job.retries_left = 0


def will_retry() -> bool:
    """True if RQ will run the current job again should it fail now (False outside a job)."""
    job = get_current_job()
    return job is not None and bool(job.retries_left)


def retry_is_valid(value: Any) -> bool:
    """Whether ``value`` (``SAFEUPDATES_RETRY``) is keyword arguments that ``rq.Retry`` takes; ``{"max": 0}``:
    no retries, no ``Retry``."""
    max_retries = value.get("max") if isinstance(value, dict) else None
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
        return False
    try:
        Retry(**{**value, "max": max(max_retries, 1)})  # max 0 (no retries) validates the rest alike
    except Exception:  # RQ's own validation, whose messages speak of its internals
        return False
    return True


class RQBackend(Backend):
    """Delivery through RQ: one job per record, shared while it waits (RQ's ``unique=True``), retried
    with back-off by RQ (``SAFEUPDATES_RETRY``), run by ``rqworker --with-scheduler``."""

    label = "RQ"
    no_worker = "none runs, or its Redis restarted and lost the workers' registrations"
    can_list_queued = True
    has_worker_heartbeats = True
    can_take_waiting = True

    def queue_name(self, queue: str | None) -> str:
        configured = getattr(settings, "RQ_QUEUES", None) or {}
        name = queue or conf.queue_name()
        if name in configured:
            return name
        problem = queue_problem() if queue is None else None
        if problem is not None:
            # The settings are wrong, not the call: say what the system check says.
            message, hint, check_id = problem
            raise InvalidUpdate(f"{message} {hint} ({check_id})")
        choices = ", ".join(configured) or "(none configured)"
        raise InvalidUpdate(f"queue {name!r} is not in RQ_QUEUES; pass one of: {choices}.")

    def relay_queue(self, wanted: str, what: str) -> tuple[str | None, str | None]:
        configured = getattr(settings, "RQ_QUEUES", None) or {}
        if wanted in configured:
            return wanted, None
        default = conf.queue_name()
        if default in configured:
            return (
                default,
                f"{what} has work for queue {wanted!r}, which is not in RQ_QUEUES: delivered on {default!r}.",
            )
        return None, (
            f"{what} has work for queue {wanted!r}, which is not in RQ_QUEUES, and neither is SAFEUPDATES_QUEUE "
            f"{default!r}: not delivered. Fix RQ_QUEUES (system check safeupdates.E002)."
        )

    def deliver(
        self, delivery: Delivery, *, likely_queued: bool = False, trace: dict[str, str] | None = None
    ) -> str | None:
        meta = {tracing.TRACE_META_KEY: trace} if trace else None
        job = deliver(
            delivery.request_id,
            delivery.content_type_id,
            delivery.object_id,
            delivery.queue,
            likely_queued=likely_queued,
            meta=meta,
            using=delivery.using,
        )
        return None if job is None else str(job.id)

    def unreachable(self, error: Exception, delivery: Delivery) -> str | None:
        if not isinstance(error, RedisConnectionError | RedisTimeoutError):
            return None
        return f"Redis at {_where(delivery.queue)} is unreachable ({error})"

    def left_for_relay(self, delivery: Delivery) -> None:
        _outage.failed(_where(delivery.queue))

    def delivered(self, delivery: Delivery) -> None:
        _outage.reached(_where(delivery.queue))

    def redeliver(self, deliveries: Sequence[Delivery]) -> Redelivered:
        """Per queue: the records whose job is gone or plainly waiting in two pipelines
        (:func:`deliver_many`), the others one by one (:func:`deliver_with_outcome`, which also moves a
        job stuck in a registry); then a warning per queue whose retries wait for a scheduler."""
        done = Redelivered()
        by_queue: dict[str, list[Delivery]] = {}
        for delivery in deliveries:
            by_queue.setdefault(delivery.queue, []).append(delivery)
        moved_scheduled: dict[str, int] = {}
        for queue_name, members in by_queue.items():
            using = members[0].using
            plain = [(member.request_id, member.content_type_id, member.object_id) for member in members]
            with unreachable_redis(queue_name):
                enqueued, found_waiting, rest = deliver_many(queue_name, plain, using)
            done.enqueued += enqueued
            done.waiting += found_waiting
            for index in rest:
                with unreachable_redis(queue_name):
                    _job, outcome = deliver_with_outcome(
                        *plain[index], queue_name, force=True, likely_queued=True, using=using
                    )
                if outcome == WAITING:
                    done.waiting += 1
                    continue
                done.enqueued += 1
                if outcome != ENQUEUED:
                    done.moved += 1
                if outcome == MOVED_SCHEDULED:
                    moved_scheduled[queue_name] = moved_scheduled.get(queue_name, 0) + 1
        for queue_name in sorted(by_queue):
            warning = _scheduler_warning(queue_name, moved_scheduled.get(queue_name, 0))
            if warning:
                done.warnings.append(warning)
        return done

    def running(self) -> RunningJob | None:
        job = get_current_job()
        if job is None:
            return None
        return RunningJob(str(job.id), str(job.origin), job.meta.get(tracing.TRACE_META_KEY))

    def will_retry(self, request_id: uuid.UUID) -> bool:
        return will_retry()

    def fail_without_retry(self) -> None:
        fail_without_retry()

    def take_waiting(self, records: Sequence[tuple[int, str]], using: str) -> list[bool]:
        return take_waiting(records, using)

    def health(self, queues: Sequence[str] = ()) -> list[QueueHealth]:
        """Every queue of ``RQ_QUEUES`` (a queue outside it takes no request: ``queues`` adds nothing)."""
        return queue_states(sorted(getattr(settings, "RQ_QUEUES", None) or {}))

    def worker_hint(self, queue: str) -> str:
        return f"python manage.py rqworker {queue} --with-scheduler"

    def check(self) -> list[CheckMessage]:
        """E001 / E002: :func:`queue_problem`; W008: django-rq's worker class runs each apply job in a new
        process (:func:`safeupdates.delivery.rq_worker.worker_class_problem`); W002: a
        queue named in another ``SAFEUPDATES_*_QUEUE`` setting is not in ``RQ_QUEUES``."""
        from safeupdates.delivery.rq_worker import worker_class_problem

        messages: list[CheckMessage] = []
        problem = queue_problem()
        if problem is not None:
            message, hint, check_id = problem
            messages.append(Error(message, hint=hint, id=check_id))
        problem = worker_class_problem()
        if problem is not None:
            message, hint, check_id = problem
            messages.append(Warning(message, hint=hint, id=check_id))
        return messages + _queue_setting_warnings()


def _queue_setting_warnings() -> list[CheckMessage]:
    """W002 for each ``SAFEUPDATES_*_QUEUE`` setting of :data:`safeupdates.conf.SETTINGS` that names no queue
    of ``RQ_QUEUES`` (``SAFEUPDATES_QUEUE`` itself is E002's)."""
    queues = getattr(settings, "RQ_QUEUES", {}) or {}
    choices = ", ".join(sorted(queues)) or "(none configured)"
    messages: list[CheckMessage] = []
    for name in sorted(setting.name for setting in conf.SETTINGS if setting.name.endswith("_QUEUE")):
        if name == conf.QUEUE.name or not hasattr(settings, name):
            continue
        value = getattr(settings, name)
        if not isinstance(value, str):
            messages.append(
                Warning(
                    f"{name} is {value!r}, which is not the name of a queue in RQ_QUEUES.",
                    hint=f"Set {name} to one of: {choices}.",
                    id="safeupdates.W002",
                )
            )
        elif value not in queues:
            messages.append(
                Warning(
                    f"{name} is {value!r}, which is not a queue in RQ_QUEUES; jobs sent there would be refused.",
                    hint=f"Add {value!r} to RQ_QUEUES or set {name} to one of: {choices}.",
                    id="safeupdates.W002",
                )
            )
    return messages


def _scheduler_warning(queue_name: str, moved: int) -> str | None:
    """A warning if jobs wait in ``queue_name``'s scheduled registry (or ``moved`` overdue ones were moved
    from it by the relay) with no RQ scheduler running for the queue: RQ's retries with back-off would then
    only run when the relay moves them."""
    waiting, running = scheduler_state(queue_name)
    if running or not (waiting or moved):
        return None
    overdue = f", {moved} overdue ones were moved to the queue by this pass" if moved else ""
    return (
        f"no RQ scheduler is running for queue {queue_name!r}: {waiting} job(s) wait in its scheduled "
        f"registry{overdue}. Start the workers with --with-scheduler, or RQ's retries wait for the relay."
    )
