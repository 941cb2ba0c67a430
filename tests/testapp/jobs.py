"""Job functions of the controls and idempotency tests, importable by real ``rqworker`` processes.

Every job records what it did in the tests' Redis database, with times from Redis ``TIME`` (one clock
for all processes), so that the tests can check order, overlap and timing.
"""

from __future__ import annotations

import json
import time
from typing import Any

import django_rq
from django.db import connection
from django.db.models import F
from redis import Redis

from safeupdates.contrib.idempotent.decorators import idempotent
from tests.testapp.models import Profile


def redis() -> Redis:
    return django_rq.get_connection("default")


def redis_now(connection: Redis | None = None) -> float:
    """Seconds since the epoch by Redis' clock."""
    seconds, microseconds = (connection or redis()).time()
    return seconds + microseconds / 1_000_000


def runs(log: str) -> list[dict[str, Any]]:
    """The runs recorded under ``log``, in the order they were recorded."""
    return [json.loads(item) for item in redis().lrange(log, 0, -1)]


def record(log: str, label: Any, hold: float = 0.0) -> str:
    """Record a run of ``label`` (start and end by Redis time), holding the worker ``hold`` seconds."""
    connection = redis()
    start = redis_now(connection)
    time.sleep(hold)
    connection.rpush(log, json.dumps({"label": label, "start": start, "end": redis_now(connection)}))
    return f"ran {label}"


def wait_for_release(log: str, label: Any, release: str, timeout: int = 60) -> str:
    """Record the start of ``label``, then block until the test pushes to list ``release``."""
    connection = redis()
    connection.rpush(log, json.dumps({"label": label, "start": redis_now(connection), "event": "start"}))
    if connection.blpop([release], timeout=timeout) is None:
        raise TimeoutError(f"nobody released {label}")
    return f"released {label}"


def hang(log: str, label: Any) -> None:
    """Record the start of ``label``, then sleep until the worker is killed (or RQ's timeout fires)."""
    connection = redis()
    connection.rpush(log, json.dumps({"label": label, "start": redis_now(connection), "event": "start"}))
    time.sleep(3600)


def fail_first_run(log: str, label: Any, hold: float = 0.0) -> str:
    """Record a run of ``label``; the first run raises, later runs succeed."""
    connection = redis()
    start = redis_now(connection)
    attempt = connection.incr(f"attempts:{log}:{label}")
    time.sleep(hold)
    connection.rpush(
        log, json.dumps({"label": label, "start": start, "end": redis_now(connection), "attempt": attempt})
    )
    if attempt == 1:
        raise RuntimeError(f"first run of {label} fails")
    return f"ran {label}"


@idempotent(key="charge:{order}")
def charge(order: str, hold: float = 0.0) -> str:
    """The side effect of the idempotency tests: one charge, counted in Redis and in the database."""
    connection = redis()
    connection.incr(f"charges:{order}")
    connection.rpush(f"charge-started:{order}", redis_now(connection))
    Profile.objects.filter(name=order).update(score=F("score") + 1)
    time.sleep(hold)
    return f"charged {order}"


@idempotent(key=lambda order, **kwargs: f"flaky-charge:{order}")
def flaky_charge(order: str, fail: bool) -> str:
    """Write to the database, then raise if ``fail``: the write must be rolled back with the failure."""
    Profile.objects.filter(name=order).update(score=F("score") + 1)
    if fail:
        raise ValueError(f"card declined for {order}")
    return f"charged {order}"


@idempotent(key="session-timeout:{name}")
def session_timeout(name: str) -> str:
    """The idle-in-transaction timeout the guarded body runs under (PostgreSQL), as ``SHOW`` gives it."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        return str(cursor.fetchone()[0])


def scheduled_jobs(queue: str = "default") -> int:
    """How many jobs wait in the scheduled registry of ``queue`` (a serial job's watchdog is one)."""
    return int(django_rq.get_queue(queue).scheduled_job_registry.count)


def process_and_connection() -> tuple[int, bool]:
    """This process's id, and whether it holds a database connection it did not open (one that crossed a
    fork: the worker's)."""
    import os

    return os.getpid(), connection.connection is not None
