"""Job functions the benchmark enqueues (imported by the rqworker processes it starts)."""

from __future__ import annotations

import time
from typing import Any

from django.db import connection
from rq import get_current_job
from rq.job import Job

from benchmarks.saveapp.models import PlainRow
from tests.testapp.models import Profile

try:  # Django 6.0+
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[import-not-found,no-redef,unused-ignore]

#: The PostgreSQL advisory lock that holds the benchmark's db_workers (:func:`task_gate`).
GATE_LOCK = 424242


def naive_toggle(pk: int, field: str, value: bool) -> None:
    """The baseline job: one job per toggle, a plain ``filter().update()`` without any guard."""
    Profile.objects.filter(pk=pk).update(**{field: value})


def naive_save(pk: int, field: str, value: Any) -> None:
    """The job a toggle is without the app, written the way a hand-made RQ job is: load the row, set the
    field, ``save()`` (``benchmarks/latency.py``; a plain table of the same shape, ``saveapp.PlainRow``)."""
    row = PlainRow.objects.get(pk=pk)
    setattr(row, field, value)
    row.save()


def gate(started_key: str, release_key: str, timeout: int = 120) -> None:
    """Hold a worker until the benchmark releases it, so that a backlog can pile up behind it.

    Counts itself in ``started_key``, then blocks on ``release_key`` (a Redis list) for at most
    ``timeout`` seconds.
    """
    job = get_current_job()
    assert job is not None
    job.connection.incr(started_key)
    job.connection.blpop([release_key], timeout=timeout)


@task(backend="db", queue_name="safeupdates-bench")  # type: ignore[untyped-decorator,misc,unused-ignore]
def task_gate() -> None:
    """The Django-task :func:`gate` of a db_worker: wait for the benchmark's advisory lock :data:`GATE_LOCK`
    (held by the benchmark while the backlog piles up) and let it go at once."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock_shared(%s), pg_advisory_unlock_shared(%s)", [GATE_LOCK, GATE_LOCK])


#: The Redis list where :class:`TimedJob` leaves each job's run time (``benchmarks/latency.py``).
JOB_TIMES_KEY = "safeupdates-bench-latency:job-times"


class TimedJob(Job):
    """RQ's ``Job`` that times its function inside the work horse (the fork and RQ's bookkeeping excluded)
    and pushes ``"<function> <ms>"`` to :data:`JOB_TIMES_KEY`: the benchmark's timer inside the job
    (``rqworker --job-class benchmarks.jobs.TimedJob``)."""

    def perform(self) -> Any:
        start = time.perf_counter()
        try:
            return super().perform()
        finally:
            self.connection.rpush(JOB_TIMES_KEY, f"{self.func_name} {(time.perf_counter() - start) * 1000:.3f}")
