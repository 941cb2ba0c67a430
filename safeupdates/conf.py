"""Settings of safeupdates, each read at call time so that ``override_settings`` works.

Every setting is optional and prefixed ``SAFEUPDATES_``. Values are validated by the system checks in
:mod:`safeupdates.checks`, never at import.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils.functional import empty

#: The longest span a time setting or a command's age may give: 1000 years, far inside every supported
#: database's date range. A longer one overflows the date arithmetic it takes part in (``now +
#: SAFEUPDATES_MAX_CLOCK_SKEW``, the relay's and the purge's cutoffs) at run time.
MAX_DAYS = 365_000
MAX_SECONDS = MAX_DAYS * 86_400

DEFAULT_QUEUE = "default"
DEFAULT_MAX_CLOCK_SKEW = 300
DEFAULT_JOB_TIMEOUT = 60
DEFAULT_SWEEP_RECORDS = 200
DEFAULT_RETRY: dict[str, Any] = {"max": 3, "interval": [1, 5, 15]}
DEFAULT_RELAY_AFTER = 30
DEFAULT_RETENTION = 30
DEFAULT_REDUCE_ATTEMPTS = 5
DEFAULT_METRICS_CACHE = 10
#: The values of ``SAFEUPDATES_DELIVERY``: RQ through django-rq (the default), Django's Tasks framework, or Celery.
DELIVERY_RQ = "rq"
DELIVERY_TASKS = "tasks"
DELIVERY_CELERY = "celery"
DELIVERIES = (DELIVERY_RQ, DELIVERY_TASKS, DELIVERY_CELERY)
#: Where the project's Celery app is found by default: Celery's current app, which is the project's app once
#: its package imports it (``proj/__init__.py``, as Celery's Django guide does).
DEFAULT_CELERY_APP = "celery.current_app"


def _get(name: str, default: Any) -> Any:
    # From the settings object itself: a setting that is not set then costs a plain attribute miss, not
    # the AttributeError that LazySettings.__getattr__ raises and catches (the write path reads some on
    # every call). Assignment, deletion and override_settings all change what this object holds.
    holder = settings._wrapped  # type: ignore[misc]
    if holder is empty:  # settings not loaded yet: let LazySettings load them
        return getattr(settings, f"SAFEUPDATES_{name}", default)
    return getattr(holder, f"SAFEUPDATES_{name}", default)


def queue_name() -> str:
    """Name of the django-rq queue (a key of ``RQ_QUEUES``) that apply jobs go to."""
    return str(_get("QUEUE", DEFAULT_QUEUE))


def delivery() -> str:
    """How apply jobs are delivered (``SAFEUPDATES_DELIVERY``): ``"rq"`` (the default, through django-rq),
    ``"tasks"`` (Django's Tasks framework, on the ``TASKS`` backend ``SAFEUPDATES_TASK_BACKEND``) or
    ``"celery"`` (the project's Celery app, ``SAFEUPDATES_CELERY_APP``)."""
    return str(_get("DELIVERY", DELIVERY_RQ))


def uses_tasks() -> bool:
    """True if apply jobs go through Django's Tasks framework (``SAFEUPDATES_DELIVERY = "tasks"``)."""
    return delivery() == DELIVERY_TASKS


def uses_celery() -> bool:
    """True if apply jobs are Celery tasks of the project's Celery app (``SAFEUPDATES_DELIVERY = "celery"``)."""
    return delivery() == DELIVERY_CELERY


def celery_app() -> str:
    """The dotted path of the project's Celery app (``SAFEUPDATES_CELERY_APP``, default
    ``"celery.current_app"``): the app whose broker apply tasks are published to."""
    return str(_get("CELERY_APP", DEFAULT_CELERY_APP))


def celery_queue() -> str | None:
    """The Celery queue apply tasks are routed to when ``enqueue_update()`` names none:
    ``SAFEUPDATES_CELERY_QUEUE``, else ``SAFEUPDATES_QUEUE`` where it is set; None where neither is (the Celery
    app's own default queue, which its workers consume without ``-Q``)."""
    value = _get("CELERY_QUEUE", None)
    if value is None:
        value = _get("QUEUE", None)
    return None if value is None else str(value)


def task_backend() -> str:
    """The ``TASKS`` alias that apply tasks go to with ``SAFEUPDATES_DELIVERY = "tasks"`` (default
    ``"default"``)."""
    return str(_get("TASK_BACKEND", "default"))


def max_clock_skew() -> timedelta:
    """How far in the future a client timestamp may lie before it is refused (seconds or timedelta)."""
    value = _get("MAX_CLOCK_SKEW", DEFAULT_MAX_CLOCK_SKEW)
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def job_timeout() -> int:
    """RQ's native ``job_timeout`` of an apply job, in seconds."""
    return int(_get("JOB_TIMEOUT", DEFAULT_JOB_TIMEOUT))


def sweep_records() -> int:
    """How many other records an RQ apply job may apply after its own, taking their waiting jobs off the
    queue (``SAFEUPDATES_SWEEP_RECORDS``; 0: a job applies its own record only)."""
    return int(_get("SWEEP_RECORDS", DEFAULT_SWEEP_RECORDS))


def retry() -> dict[str, Any]:
    """Keyword arguments of ``rq.Retry`` for transient database errors (``{"max": 0}`` disables)."""
    return dict(_get("RETRY", DEFAULT_RETRY))


def relay_after() -> int:
    """Seconds a request may stay ``pending`` before the relay delivers it again."""
    return int(_get("RELAY_AFTER", DEFAULT_RELAY_AFTER))


def stuck_after() -> float:
    """Seconds after which a pending request means that nothing applies it, where the delivery backend
    cannot show its workers (``safeupdates_status`` is then unhealthy; ``SAFEUPDATES_STUCK_AFTER``). By
    default what a working system takes at most: the relay's wait twice (``SAFEUPDATES_RELAY_AFTER``: the
    request's own, and one more pass), the job's timeout and every retry's back-off."""
    value = _get("STUCK_AFTER", None)
    if value is not None:
        return float(value)
    interval = retry().get("interval", 0)
    intervals = list(interval) if isinstance(interval, list | tuple) else [interval] * int(retry().get("max") or 0)
    backoff = sum(float(seconds) for seconds in intervals[: int(retry().get("max") or 0)])
    return float(2 * relay_after() + job_timeout() + backoff)


def retention() -> int:
    """Days that terminal requests are kept by ``safeupdates_purge`` when no ``--older-than`` is given."""
    return int(_get("RETENTION", DEFAULT_RETENTION))


def task_retention() -> int | None:
    """Days that ``safeupdates_purge`` keeps the rows of completed ``@idempotent`` tasks; None (the
    default) keeps them forever.

    A task's row is what makes its side effect run once: after its deletion the same key runs again (a
    refund is paid twice). Set it only to the age after which no call of a task can come again.
    """
    value = _get("TASK_RETENTION", None)
    return None if value is None else int(value)


def reduce_attempts() -> int:
    """How many times a batch's reduce may fail before the batch is ``reduce_failed`` (default 5)."""
    return int(_get("REDUCE_ATTEMPTS", DEFAULT_REDUCE_ATTEMPTS))


def fast_queue() -> str:
    """Queue for short jobs (``SAFEUPDATES_FAST_QUEUE``, default ``SAFEUPDATES_QUEUE``).

    :func:`~safeupdates.contrib.controls.jobs.enqueue` uses it when no ``queue=`` is given. Serve it with
    its own worker pool, so that short jobs never wait behind long ones.
    """
    return str(_get("FAST_QUEUE", queue_name()))


def slow_queue() -> str:
    """Queue for long jobs (``SAFEUPDATES_SLOW_QUEUE``, default the fast queue: one pool until you split).

    Pass it as ``enqueue(func, queue=conf.slow_queue())``; give it fewer workers than the fast queue.
    """
    return str(_get("SLOW_QUEUE", fast_queue()))


def prepared_statements() -> bool:
    """Whether guarded writes and checked saves run as server-side prepared statements on PostgreSQL
    (default True)."""
    return bool(_get("PREPARED_STATEMENTS", True))


def metrics_cache() -> float:
    """Seconds the Prometheus gauges read from the request log are reused before they are read again
    (``SAFEUPDATES_METRICS_CACHE``, default 10): a scrape costs at most one query per this period."""
    return float(_get("METRICS_CACHE", DEFAULT_METRICS_CACHE))


def metrics_token() -> str | None:
    """A bearer token that opens the metrics view to a scraper (``SAFEUPDATES_METRICS_TOKEN``); None (the
    default): only logged-in staff users may read it."""
    value = _get("METRICS_TOKEN", None)
    return None if value in (None, "") else str(value)
