"""Job controls on RQ: unique-while-queued jobs, per-key serial (FIFO) jobs and throttled jobs.

:func:`enqueue` is the one entry point. Every job it enqueues runs through :func:`controlled_call`, which
applies the controls when the job *starts* and then calls the function. The controls are built on what
RQ and a maintained library already do, never on home-made copies:

- ``serial_key``: RQ's own :class:`rq.RateLimit` with ``concurrency=1``. Waiting jobs wait in RQ's
  rate-limit registry, ordered by their enqueue time (whole seconds) and then by job id; our job ids carry
  a counter from Redis, so jobs enqueued within the same second keep their order too.
- ``throttle``: the fixed window of :mod:`limits` on Redis storage (the window is the lifetime of a Redis
  key, so it runs on Redis time). A job over the limit returns :class:`rq.Retry` and RQ schedules it
  again for when the window resets: deferred, never dropped.
- ``unique_key``: a pointer in Redis naming the job of that key that is waiting, written in the same
  Redis transaction as the job; a second ``enqueue`` while that job has not started adds nothing.

No key outlives its job by more than the job timeout: the serial slot of a job whose worker was killed is
handed back by a watchdog job that RQ's scheduler runs once the job's timeout (plus
:data:`REAP_GRACE`) has passed (see :func:`reap_if_abandoned`), the throttle windows expire with their
period, and a unique pointer stops counting the moment its job starts.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import uuid
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

import django_rq
from django.conf import settings
from django.utils.text import Truncator
from redis import Redis
from redis.exceptions import WatchError
from rq import Queue, RateLimit, Retry, get_current_job
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.utils import as_text, import_attribute

from safeupdates import conf
from safeupdates.contrib import require_app
from safeupdates.delivery.rq import dotted_path, get_queue
from safeupdates.exceptions import InvalidControl
from safeupdates.write.validation import has_lone_surrogate, shown

if TYPE_CHECKING:
    from limits import RateLimitItem
    from limits.strategies import FixedWindowRateLimiter
    from redis import ConnectionPool

__all__ = ["controlled_call", "enqueue", "parse_throttle", "reap_if_abandoned"]

logger = logging.getLogger("safeupdates")

#: Seconds, on top of a serial job's timeout, after which its slot is taken back if its worker died.
REAP_GRACE: Final = 2
#: Seconds a unique pointer lives at most. It is deleted when its job starts; this only bounds a pointer
#: whose job was lost before starting. A job that waits longer than this no longer suppresses duplicates.
UNIQUE_TTL: Final = 24 * 3600
#: How often a throttled job may be deferred: in effect without limit, so that it is never dropped.
MAX_DEFERRALS: Final = 2**31 - 1

_PREFIX = "safeupdates"
_SEQUENCE_KEY = f"{_PREFIX}:serial-sequence"
_META = "safeupdates"
# Statuses of a job that has not started yet and will run: a unique job in one of them suppresses others.
_WAITING = frozenset(
    status.value
    for status in (
        JobStatus.QUEUED,
        JobStatus.SCHEDULED,
        JobStatus.DEFERRED,
        JobStatus.RATE_LIMITED,
        JobStatus.READY_TO_ENQUEUE,
    )
)
_THROTTLE = re.compile(r"\s*(\d+)\s*/\s*(second|minute|hour)\s*")
_SAFE_KEY = re.compile(r"[\w.:@/+=-]{1,100}")
# Deletes KEYS[1] only while it still holds ARGV[1] (the pointer of another job is left alone).
_DELETE_IF_EQUAL = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def enqueue(
    func: Callable[..., Any] | str,
    *args: Any,
    queue: str | None = None,
    unique_key: str | None = None,
    serial_key: str | None = None,
    throttle: str | None = None,
    throttle_key: str | None = None,
    job_timeout: int | None = None,
    retry: Retry | None = None,
    **kwargs: Any,
) -> Job | None:
    """Enqueue ``func(*args, **kwargs)`` as an RQ job under the given controls; return the job, or None.

    ``func`` is a module-level callable or its dotted path (workers import it). ``queue`` names a queue
    of ``RQ_QUEUES`` (default: :func:`safeupdates.conf.fast_queue`). ``job_timeout`` is RQ's native
    timeout in seconds (default: the queue's); ``retry`` an :class:`rq.Retry` for exceptions.

    - ``unique_key``: while a job enqueued with this key is waiting (queued, scheduled or deferred, not
      yet started), returns None and adds nothing. Once that job has started, a new one is enqueued: a
      request made after the job began reading its inputs is never dropped.
    - ``serial_key``: jobs sharing the key run one at a time, in enqueue order, across all workers.
    - ``throttle``: ``"N/second"``, ``"N/minute"`` or ``"N/hour"``: at most N jobs sharing
      ``throttle_key`` (default: the function's dotted path) start per window; a job over the limit is
      deferred to the next window, never dropped. Windows run on Redis time.

    The job is enqueued at once, also inside a transaction: if the job must see the caller's writes, call
    this from ``transaction.on_commit`` in the caller's ``atomic()`` block (Django refuses ``on_commit``
    outside ``atomic()`` in a transaction managed by hand, ``set_autocommit(False)``: call this after
    ``commit()`` there).
    Bad arguments raise :class:`InvalidControl` and enqueue nothing.
    ``unique_key`` cannot be combined with ``serial_key`` (RQ keeps no unique rate-limited jobs), nor
    ``serial_key`` with ``throttle`` (a deferred job would give up its place in the line).
    """
    require_app("safeupdates.contrib.controls")
    path = dotted_path(func)
    queue_name = _clean_queue(queue)
    timeout = _clean_timeout(job_timeout)
    unique = _clean_key("unique_key", unique_key)
    serial = _clean_key("serial_key", serial_key)
    if throttle is None and throttle_key is not None:
        raise InvalidControl("throttle_key is given without throttle; pass throttle='N/second|minute|hour' too.")
    if throttle is not None:
        parse_throttle(throttle)
    if retry is not None and not isinstance(retry, Retry):
        raise InvalidControl(f"retry must be an rq.Retry, e.g. Retry(max=3, interval=10), not {retry!r}.")
    if unique and serial:
        raise InvalidControl(
            "unique_key and serial_key cannot be combined: RQ keeps no unique rate-limited jobs. Use serial_key "
            "alone and let the job read its inputs when it runs (a duplicate then costs one cheap run)."
        )
    if serial and throttle is not None:
        raise InvalidControl(
            "serial_key and throttle cannot be combined: a throttled job is deferred and would give up its "
            "place in the line. Throttle the producer instead, or use one control only."
        )

    controls: dict[str, Any] = {}
    if unique:
        controls["unique"] = _redis_key("unique", unique)
    if serial:
        controls["serial"] = serial
    if throttle is not None:
        controls["throttle"] = [throttle, _clean_key("throttle_key", throttle_key) or path]

    rq_queue = get_queue(queue_name)
    options: dict[str, Any] = {
        "args": (path, *args),
        "kwargs": kwargs,
        "timeout": timeout,
        "description": _describe(path, args, kwargs),
        "meta": {_META: controls},
        "retry": retry,
    }
    if serial:
        if not rq_queue.is_async:
            raise InvalidControl(f"serial_key needs an asynchronous queue; queue {queue_name!r} runs jobs at once.")
        # Waiting jobs are promoted by (enqueue second, job id): a counter from Redis in the id keeps the
        # order of jobs enqueued within the same second, whichever process enqueued them.
        sequence = int(rq_queue.connection.incr(_SEQUENCE_KEY))
        options["job_id"] = f"{_PREFIX}-{sequence:020d}-{uuid.uuid4().hex[:8]}"
        options["rate_limit"] = RateLimit(_redis_key("serial", serial), 1)
    job = rq_queue.create_job(controlled_call, **options)
    if unique:
        return _enqueue_unique(rq_queue, job, controls["unique"], unique)
    return rq_queue.enqueue_job(job)


def controlled_call(func_path: str, /, *args: Any, **kwargs: Any) -> Any:
    """RQ job function of :func:`enqueue`: apply the job's controls, then return ``func(*args, **kwargs)``.

    A throttled job over its limit returns :class:`rq.Retry` for the start of the next window instead of
    calling the function. A unique job gives up its pointer before calling it, so a request made from now
    on queues a new job. A serial job arms the watchdog that hands its slot back if its worker dies.
    """
    func = import_attribute(func_path)
    job = get_current_job()
    controls: dict[str, Any] = (job.meta.get(_META) or {}) if job is not None else {}
    if job is None or not controls:
        return func(*args, **kwargs)
    connection = job.connection
    if "throttle" in controls:
        text, key = controls["throttle"]
        delay = _throttle_delay(connection, parse_throttle(text), key)
        if delay:
            logger.info("safeupdates: job %s throttled (%s per %r); deferred by %ss", job.id, text, key, delay)
            return Retry(max=MAX_DEFERRALS, interval=delay)
    if "unique" in controls:
        connection.register_script(_DELETE_IF_EQUAL)(keys=[controls["unique"]], args=[job.id])
    watchdog = _arm_watchdog(job) if "serial" in controls else None
    try:
        return func(*args, **kwargs)
    finally:
        if watchdog is not None:
            _disarm_watchdog(connection, watchdog)


def reap_if_abandoned(job_id: str, started_at: str) -> str:
    """RQ job (the serial watchdog): hand back the slot of serial job ``job_id`` if its worker died.

    Scheduled by :func:`controlled_call` for the moment the job's timeout (plus :data:`REAP_GRACE`) has
    passed. RQ has killed a live job by then, so a job still ``started`` in the run that began at
    ``started_at`` has lost its worker. Its execution is marked expired and RQ's own clean-up of abandoned
    jobs runs: the job is retried (if it has retries left) or moved to the failed registry with
    ``AbandonedJobError``, and its slot goes to the next job of the key. Returns what it did.
    """
    current = get_current_job()
    connection: Redis[Any] = current.connection if current is not None else django_rq.get_connection()
    status, run, origin = (
        as_text(value) if value is not None else None
        for value in connection.hmget(Job.key_for(job_id), ["status", "started_at", "origin"])
    )
    if status != JobStatus.STARTED or run != started_at or not origin:
        return f"job {job_id} is {status or 'gone'}: nothing to reap"
    registry = StartedJobRegistry(origin, connection=connection)
    executions = [
        member for member in connection.zrange(registry.key, 0, -1) if as_text(member).split(":")[0] == job_id
    ]
    if executions:
        connection.zadd(registry.key, dict.fromkeys(executions, 0), xx=True)
    registry.cleanup()
    logger.warning("safeupdates: serial job %s outlived its timeout (worker lost); its slot was handed on", job_id)
    return f"job {job_id} abandoned: handed to RQ's clean-up"


def parse_throttle(throttle: str) -> RateLimitItem:
    """Return the :mod:`limits` item of ``"N/second"``, ``"N/minute"`` or ``"N/hour"`` (N >= 1)."""
    match = _THROTTLE.fullmatch(throttle) if isinstance(throttle, str) else None
    if match is None or int(match[1]) < 1:
        raise InvalidControl(
            f"throttle must look like '10/minute' (N/second, N/minute or N/hour with N >= 1), not {throttle!r}."
        )
    from limits import RateLimitItemPerHour, RateLimitItemPerMinute, RateLimitItemPerSecond

    item_class = {
        "second": RateLimitItemPerSecond,
        "minute": RateLimitItemPerMinute,
        "hour": RateLimitItemPerHour,
    }[match[2]]
    return item_class(int(match[1]))


def _clean_queue(queue: str | None) -> str:
    name = conf.fast_queue() if queue is None else queue
    queues = getattr(settings, "RQ_QUEUES", {}) or {}
    if not isinstance(name, str) or name not in queues:
        raise InvalidControl(f"queue {name!r} is not in RQ_QUEUES; pass one of: {', '.join(sorted(queues))}.")
    return name


def _clean_timeout(job_timeout: object) -> int | None:
    if job_timeout is None:
        return None
    if isinstance(job_timeout, bool) or not isinstance(job_timeout, int) or job_timeout <= 0:
        raise InvalidControl(f"job_timeout must be a positive number of seconds (int), not {job_timeout!r}.")
    return job_timeout


def _clean_key(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidControl(f"{name} must be a non-empty string, e.g. f'user:{{user.pk}}', not {value!r}.")
    if has_lone_surrogate(value):  # as Redis gets it: a key's digest, a rate limit's key
        raise InvalidControl(
            f"{name} {shown(value)} contains a lone surrogate (\\ud800 to \\udfff), which no encoding "
            "can carry to Redis; a client's JSON made it of an unpaired \\u escape: refuse or repair it there."
        )
    return value


def _redis_key(kind: str, key: str) -> str:
    """A Redis-safe name for a user key: the key itself when short and plain, else its digest."""
    safe = key if _SAFE_KEY.fullmatch(key) else "sha1-" + hashlib.sha1(key.encode()).hexdigest()
    return f"{_PREFIX}:{kind}:{safe}"


def _describe(path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    arguments = [repr(arg) for arg in args] + [f"{name}={value!r}" for name, value in kwargs.items()]
    return Truncator(f"{path}({', '.join(arguments)})").chars(200)


def _enqueue_unique(queue: Queue, job: Job, pointer: str, unique_key: str) -> Job | None:
    """Enqueue ``job`` unless the job that ``pointer`` names is still waiting; both in one transaction."""
    with queue.connection.pipeline() as pipe:
        while True:
            try:
                pipe.watch(pointer)
                # After WATCH, a pipeline runs commands at once (until MULTI) and returns their values.
                holder: bytes | None = pipe.get(pointer)  # type: ignore[assignment]
                if holder is not None:
                    holder_key = queue.job_class.key_for(as_text(holder))
                    # Watched too: if it starts between this read and EXEC, the transaction is retried.
                    pipe.watch(holder_key)
                    status: bytes | None = pipe.hget(holder_key, "status")  # type: ignore[assignment]
                    if status is not None and as_text(status) in _WAITING:
                        pipe.reset()
                        logger.debug(
                            "safeupdates: not enqueued: job %s with unique_key %r is still waiting",
                            as_text(holder),
                            unique_key,
                        )
                        return None
                pipe.multi()
                pipe.set(pointer, job.id, ex=UNIQUE_TTL)
                queue.enqueue_job(job, pipeline=pipe)
                pipe.execute()
                return job
            except WatchError:
                continue


# One limiter per Redis connection pool (a worker has one).
_LIMITERS: weakref.WeakKeyDictionary[ConnectionPool, tuple[FixedWindowRateLimiter, Any]] = weakref.WeakKeyDictionary()


def _limiter(connection: Redis[Any]) -> tuple[FixedWindowRateLimiter, Any]:
    pool = connection.connection_pool
    cached = _LIMITERS.get(pool)
    if cached is None:
        from limits.storage import RedisStorage
        from limits.strategies import FixedWindowRateLimiter

        storage = RedisStorage("redis://", connection_pool=pool)
        cached = _LIMITERS[pool] = (FixedWindowRateLimiter(storage), storage)
    return cached


def _throttle_delay(connection: Redis[Any], item: RateLimitItem, key: str) -> int:
    """Count a start against the window of ``key``; return 0 if allowed, else seconds until it resets."""
    limiter, storage = _limiter(connection)
    if limiter.hit(item, _PREFIX, key):
        return 0
    # The window is the lifetime of this Redis key: its TTL is the wait, measured by Redis.
    remaining_ms = int(connection.pttl(storage.prefixed_key(item.key_for(_PREFIX, key))))
    return max(1, math.ceil(remaining_ms / 1000))


def _arm_watchdog(job: Job) -> str | None:
    """Schedule :func:`reap_if_abandoned` for when ``job`` must have ended; return the watchdog's id."""
    if not job.timeout or int(job.timeout) <= 0:
        return None  # no timeout: only RQ's own maintenance frees the slot of a lost job
    # The run's identity, as RQ stored it when this run started (a retry run stores a new one).
    run = job.connection.hget(job.key, "started_at")
    if not run:
        return None
    # One watchdog per run: a retry of the job arms its own while the previous one may still be running.
    watchdog_id = f"{job.id}-watchdog-{uuid.uuid4().hex[:8]}"
    queue = Queue(job.origin, connection=job.connection, serializer=job.serializer)
    queue.enqueue_in(
        timedelta(seconds=int(job.timeout) + REAP_GRACE),
        reap_if_abandoned,
        job.id,
        as_text(run),
        job_id=watchdog_id,
        at_front=True,
        job_timeout=60,
        result_ttl=0,
        description=f"safeupdates watchdog of serial job {job.id}",
    )
    return watchdog_id


def _disarm_watchdog(connection: Redis[Any], watchdog_id: str) -> None:
    try:
        Job.fetch(watchdog_id, connection=connection).delete()
    except NoSuchJobError:
        pass
    except Exception:  # the watchdog finds nothing to do if it runs
        logger.exception("safeupdates: could not delete watchdog %s", watchdog_id)
