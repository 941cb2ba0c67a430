"""Imported by the Celery benchmark's second worker pool only (``-I benchmarks.celery_every_message``): its
apply tasks run every message against the database, without the worker process's memory of requests it
knows are done (:func:`safeupdates.delivery.celery.done_here`), so that the benchmark shows what a message
per request costs without it."""

from __future__ import annotations

from safeupdates.delivery import celery as celery_delivery


def _never(using: str, request_id: str) -> bool:
    return False


celery_delivery.done_here = _never
