"""Job functions the benchmark enqueues (imported by the rqworker processes it starts)."""

from __future__ import annotations

from rq import get_current_job

from tests.testapp.models import Profile


def naive_toggle(pk: int, field: str, value: bool) -> None:
    """The baseline job: one job per toggle, a plain ``filter().update()`` without any guard."""
    Profile.objects.filter(pk=pk).update(**{field: value})


def gate(started_key: str, release_key: str, timeout: int = 120) -> None:
    """Hold a worker until the benchmark releases it, so that a backlog can pile up behind it.

    Counts itself in ``started_key``, then blocks on ``release_key`` (a Redis list) for at most
    ``timeout`` seconds.
    """
    job = get_current_job()
    assert job is not None
    job.connection.incr(started_key)
    job.connection.blpop([release_key], timeout=timeout)
