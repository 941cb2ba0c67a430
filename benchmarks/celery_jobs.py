"""Celery tasks the Celery benchmark sends (``benchmarks/celery_bench.py``); its workers import this module
(``celery -A tests.celery_app worker -I benchmarks.celery_jobs``)."""

from __future__ import annotations

from celery import shared_task
from django.db import connection

from benchmarks.saveapp.models import PlainRow

#: The PostgreSQL advisory lock that holds the benchmark's Celery workers (:func:`gate`).
GATE_LOCK = 434343


@shared_task(name="benchmarks.naive_toggle", ignore_result=True, acks_late=True, serializer="json")  # type: ignore[untyped-decorator,misc,unused-ignore]
def naive_toggle(pk: int, field: str, value: bool) -> None:
    """The baseline: one task per toggle, written the way a hand-made Celery task is: load, set, save()."""
    row = PlainRow.objects.get(pk=pk)
    setattr(row, field, value)
    row.save()


# acks_late: a worker then holds no more gates than it has pool processes (CELERY_WORKER_PREFETCH_MULTIPLIER 1
# counts unacknowledged messages). Acknowledged on receipt, a gate frees its prefetch slot at once: on a Redis
# broker two runs of three timed out waiting for the four gates to hold a process each (a worker holding a
# third gate in its buffer is the likely cause); with acks_late the next run did not.
@shared_task(name="benchmarks.gate", ignore_result=True, acks_late=True)  # type: ignore[untyped-decorator,misc,unused-ignore]
def gate() -> None:
    """Hold a pool process until the benchmark lets go of :data:`GATE_LOCK`, so that a backlog piles up."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock_shared(%s), pg_advisory_unlock_shared(%s)", [GATE_LOCK, GATE_LOCK])
