"""Settings of safeupdates, each read at call time so that ``override_settings`` works.

Every setting is optional and prefixed ``SAFEUPDATES_``. :data:`SETTINGS` declares each one once: the
getters below read it, the system check E005 (:mod:`safeupdates.checks`) validates it, never at import,
and the settings table of the deployment docs shows it (a test keeps that table equal to this one).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings

#: The longest span a time setting or a command's age may give: 1000 years, far inside every supported
#: database's date range. A longer one overflows the date arithmetic it takes part in (``now +
#: SAFEUPDATES_MAX_CLOCK_SKEW``, the relay's and the purge's cutoffs) at run time.
MAX_DAYS = 365_000
MAX_SECONDS = MAX_DAYS * 86_400

#: Where the project's Celery app is found by default: Celery's current app, which is the project's app once
#: its package imports it (``proj/__init__.py``, as Celery's Django guide does).
DEFAULT_CELERY_APP = "celery.current_app"


def _whole(minimum: int, maximum: float = math.inf) -> Callable[[Any], bool]:
    """A whole number from ``minimum`` to ``maximum`` (not a bool, not a float, not a numeric string)."""
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= maximum


def _seconds(value: Any) -> bool:
    """A finite number of seconds from 0 to 1000 years, or a ``timedelta`` of that."""
    if isinstance(value, timedelta):
        return timedelta(0) <= value <= timedelta(seconds=MAX_SECONDS)
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= MAX_SECONDS
    )


@dataclass(frozen=True)
class Setting:
    """One setting of safeupdates."""

    #: Its name, ``SAFEUPDATES_...``.
    name: str
    #: The value read where it is not set; None also where the getter computes it (see :attr:`shown_default`).
    default: Any
    #: What it sets: E005's message says "It sets <meaning>.", and the docs' settings table shows it.
    meaning: str
    #: What a valid value looks like (``{default!r}`` shows the default), with the check that says so where it
    #: is not E005. E005's hint is "Set it to <valid>.".
    valid: str
    #: E005's test of a value: a callable, or the dotted path of one in a module that conf may not import
    #: (delivery's). None: not E005's (another check's, or none).
    accepts: Callable[[Any], bool] | str | None = None
    #: The default as the docs show it, where it is computed from other settings.
    shown_default: str = ""


QUEUE = Setting(
    "SAFEUPDATES_QUEUE",
    "default",
    "which queue the apply jobs go to",
    "a key of RQ_QUEUES (E002); with the Tasks framework, one of its backend's QUEUES (E023); with Celery, a "
    "queue its workers consume (W024)",
)
DELIVERY = Setting(
    "SAFEUPDATES_DELIVERY",
    "rq",
    "how apply jobs are delivered: RQ through django-rq, Django's Tasks framework, or the project's Celery app",
    '"rq", "tasks" or "celery" (E020)',
)
TASK_BACKEND = Setting(
    "SAFEUPDATES_TASK_BACKEND",
    "default",
    'the backend that apply tasks go to with SAFEUPDATES_DELIVERY = "tasks"',
    "a key of TASKS (E022) whose backend runs tasks (E024)",
)
CELERY_APP = Setting(
    "SAFEUPDATES_CELERY_APP",
    DEFAULT_CELERY_APP,
    'the Celery app that apply tasks are published to with SAFEUPDATES_DELIVERY = "celery"',
    "the dotted path of the project's Celery app (E026)",
)
CELERY_QUEUE = Setting(
    "SAFEUPDATES_CELERY_QUEUE",
    None,
    "the Celery queue apply tasks are routed to when enqueue_update() names none",
    "the Celery app's default queue or one of its task_queues (W024)",
    shown_default="`SAFEUPDATES_QUEUE` where it is set, else the Celery app's default queue",
)
FAST_QUEUE = Setting(
    "SAFEUPDATES_FAST_QUEUE",
    None,
    "the queue of enqueue() when it names none",
    "a key of RQ_QUEUES (W002)",
    shown_default="`SAFEUPDATES_QUEUE`",
)
MAX_CLOCK_SKEW = Setting(
    "SAFEUPDATES_MAX_CLOCK_SKEW",
    300,
    "how far in the future the client timestamp of update_if_newer(synced_at=...) may lie",
    "a number of seconds (0 up to 1000 years) or a timedelta; the default is {default!r}",
    _seconds,
)
JOB_TIMEOUT = Setting(
    "SAFEUPDATES_JOB_TIMEOUT",
    60,
    "RQ's job_timeout of an apply job, and how long @idempotent waits for its lock outside a job",
    "a whole number of seconds, 0 or more; the default is {default!r}",
    _whole(0),
)
RETRY = Setting(
    "SAFEUPDATES_RETRY",
    {"max": 3, "interval": [1, 5, 15]},
    "how RQ retries an apply job after a transient database error: the keyword arguments of rq.Retry",
    "a dict such as {default!r} (the default): max is how many retries (a whole number, 0 "
    "for none), interval the seconds to wait before each (a whole number, or a list of them)",
    "safeupdates.delivery.rq.retry_is_valid",
)
RELAY_AFTER = Setting(
    "SAFEUPDATES_RELAY_AFTER",
    30,
    "how long a request may stay pending before safeupdates_relay delivers it again",
    "a whole number of seconds, 0 up to 1000 years; the default is {default!r}",
    _whole(0, MAX_SECONDS),
)
STUCK_AFTER = Setting(
    "SAFEUPDATES_STUCK_AFTER",
    None,
    "how old a pending request may grow before safeupdates_status says nothing applies it, where the delivery "
    "backend cannot show its workers",
    "a number of seconds, 0 up to 1000 years; by default twice SAFEUPDATES_RELAY_AFTER, plus "
    "SAFEUPDATES_JOB_TIMEOUT and the retries' back-off",
    _seconds,
    shown_default="twice `RELAY_AFTER` + `JOB_TIMEOUT` + the retries' back-off (141)",
)
RETENTION = Setting(
    "SAFEUPDATES_RETENTION",
    30,
    "how long safeupdates_purge keeps applied and stale requests",
    "a whole number of days, 0 or more; the default is {default!r}",
    _whole(0),
)
#: Valid values of a retention per outcome: None keeps the requests; else whole days, up to 1000 years.
_KEPT_OR_DAYS = (
    "a whole number of days, 0 or more, or None to keep them until they are re-driven; the default is {default!r}"
)
FAILED_RETENTION = Setting(
    "SAFEUPDATES_FAILED_RETENTION",
    90,
    "how long safeupdates_purge keeps failed requests (their retries ran out; they can be re-driven)",
    _KEPT_OR_DAYS,
    lambda value: value is None or _whole(0, MAX_DAYS)(value),
)
REJECTED_RETENTION = Setting(
    "SAFEUPDATES_REJECTED_RETENTION",
    90,
    "how long safeupdates_purge keeps rejected requests (refused for their values, or their row was gone; they "
    "can be re-driven)",
    _KEPT_OR_DAYS,
    lambda value: value is None or _whole(0, MAX_DAYS)(value),
)
TASK_RETENTION = Setting(
    "SAFEUPDATES_TASK_RETENTION",
    None,
    "how long safeupdates_purge keeps the rows of completed @idempotent tasks (a deleted row lets its task run again)",
    "None, to keep them forever (the default), or a whole number of days, 0 or more",
    lambda value: value is None or _whole(0)(value),
)
REDUCE_ATTEMPTS = Setting(
    "SAFEUPDATES_REDUCE_ATTEMPTS",
    5,
    "how many failed runs of a batch's reduce make the batch reduce_failed",
    "a whole number, 1 or more (the first run counts); the default is {default!r}",
    _whole(1),
)
SWEEP_RECORDS = Setting(
    "SAFEUPDATES_SWEEP_RECORDS",
    200,
    "how many other records an apply job may apply after its own, taking their waiting jobs off the queue",
    "a whole number, 0 or more (0: a job applies its own record only); the default is {default!r}",
    _whole(0),
)
PREPARED_STATEMENTS = Setting(
    "SAFEUPDATES_PREPARED_STATEMENTS",
    True,
    "whether guarded writes and checked saves run as prepared statements on PostgreSQL",
    "True or False; the default is {default!r}",
    lambda value: isinstance(value, bool),
)
METRICS_CACHE = Setting(
    "SAFEUPDATES_METRICS_CACHE",
    10,
    "how many seconds the Prometheus gauges read from the request log are reused before they are read again",
    "a number of seconds (no check)",
)
METRICS_TOKEN = Setting(
    "SAFEUPDATES_METRICS_TOKEN",
    None,
    "a bearer token that opens the metrics view to a scraper",
    "a string, or None: only logged-in staff users may read the metrics (no check)",
)

#: Every setting of safeupdates, in the order of the docs' table.
#:
#: :meta hide-value:
SETTINGS = (
    QUEUE,
    DELIVERY,
    TASK_BACKEND,
    CELERY_APP,
    CELERY_QUEUE,
    FAST_QUEUE,
    MAX_CLOCK_SKEW,
    JOB_TIMEOUT,
    RETRY,
    RELAY_AFTER,
    STUCK_AFTER,
    RETENTION,
    FAILED_RETENTION,
    REJECTED_RETENTION,
    TASK_RETENTION,
    REDUCE_ATTEMPTS,
    SWEEP_RECORDS,
    PREPARED_STATEMENTS,
    METRICS_CACHE,
    METRICS_TOKEN,
)


def _read(setting: Setting) -> Any:
    return getattr(settings, setting.name, setting.default)


def queue_name() -> str:
    """``SAFEUPDATES_QUEUE``."""
    return str(_read(QUEUE))


def delivery() -> str:
    """``SAFEUPDATES_DELIVERY``: a key of :data:`safeupdates.delivery.BACKENDS`."""
    return str(_read(DELIVERY))


def celery_app() -> str:
    """``SAFEUPDATES_CELERY_APP``."""
    return str(_read(CELERY_APP))


def celery_queue() -> str | None:
    """``SAFEUPDATES_CELERY_QUEUE``, else ``SAFEUPDATES_QUEUE`` where it is set; None where neither is (the
    Celery app's own default queue, which its workers consume without ``-Q``)."""
    value = _read(CELERY_QUEUE)
    if value is None and hasattr(settings, QUEUE.name):
        value = _read(QUEUE)
    return None if value is None else str(value)


def task_backend() -> str:
    """``SAFEUPDATES_TASK_BACKEND``."""
    return str(_read(TASK_BACKEND))


def max_clock_skew() -> timedelta:
    """``SAFEUPDATES_MAX_CLOCK_SKEW``."""
    value = _read(MAX_CLOCK_SKEW)
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def job_timeout() -> int:
    """``SAFEUPDATES_JOB_TIMEOUT``, in seconds."""
    return int(_read(JOB_TIMEOUT))


def sweep_records() -> int:
    """``SAFEUPDATES_SWEEP_RECORDS``."""
    return int(_read(SWEEP_RECORDS))


def retry() -> dict[str, Any]:
    """``SAFEUPDATES_RETRY`` (a copy)."""
    return dict(_read(RETRY))


def relay_after() -> int:
    """``SAFEUPDATES_RELAY_AFTER``, in seconds."""
    return int(_read(RELAY_AFTER))


def stuck_after() -> float:
    """``SAFEUPDATES_STUCK_AFTER``, in seconds. By default what a working system takes at most: the relay's
    wait twice (the request's own, and one more pass), the job's timeout and every retry's back-off."""
    value = _read(STUCK_AFTER)
    if value is not None:
        return float(value)
    arguments = retry()
    retries = int(arguments.get("max") or 0)
    interval = arguments.get("interval", 0)
    intervals = list(interval) if isinstance(interval, list | tuple) else [interval] * retries
    # As the retries take them: the last interval for every retry past the list's end (RQ's Retry does so).
    intervals += intervals[-1:] * (retries - len(intervals))
    backoff = sum(float(seconds) for seconds in intervals[:retries])
    return float(2 * relay_after() + job_timeout() + backoff)


def retention() -> int:
    """``SAFEUPDATES_RETENTION``, in days."""
    return int(_read(RETENTION))


def failed_retention() -> int | None:
    """``SAFEUPDATES_FAILED_RETENTION``, in days; None keeps failed requests until they are re-driven."""
    value = _read(FAILED_RETENTION)
    return None if value is None else int(value)


def rejected_retention() -> int | None:
    """``SAFEUPDATES_REJECTED_RETENTION``, in days; None keeps rejected requests until they are re-driven."""
    value = _read(REJECTED_RETENTION)
    return None if value is None else int(value)


def task_retention() -> int | None:
    """``SAFEUPDATES_TASK_RETENTION``, in days; None keeps the rows forever."""
    value = _read(TASK_RETENTION)
    return None if value is None else int(value)


def reduce_attempts() -> int:
    """``SAFEUPDATES_REDUCE_ATTEMPTS``."""
    return int(_read(REDUCE_ATTEMPTS))


def fast_queue() -> str:
    """``SAFEUPDATES_FAST_QUEUE``, else ``SAFEUPDATES_QUEUE``."""
    value = _read(FAST_QUEUE)
    return queue_name() if value is None else str(value)


def prepared_statements() -> bool:
    """``SAFEUPDATES_PREPARED_STATEMENTS``."""
    return bool(_read(PREPARED_STATEMENTS))


def metrics_cache() -> float:
    """``SAFEUPDATES_METRICS_CACHE``, in seconds."""
    return float(_read(METRICS_CACHE))


def metrics_token() -> str | None:
    """``SAFEUPDATES_METRICS_TOKEN``; None where it is not set or empty."""
    value = _read(METRICS_TOKEN)
    return None if value in (None, "") else str(value)
