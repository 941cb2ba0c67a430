"""Item and reduce functions for the fan-out tests; importable by the workers."""

from __future__ import annotations

from django.db.models import F

from tests.testapp.models import Profile, ReduceRun


def add_score(item: dict[str, int]) -> None:
    """Add ``item["points"]`` to profile ``item["pk"]``; fail for a negative number of points."""
    if item["points"] < 0:
        raise ValueError("negative points")
    Profile.objects.filter(pk=item["pk"]).update(score=F("score") + item["points"])


def record_reduce(batch_id: str) -> None:
    """Record one run of the reduce."""
    ReduceRun.objects.create(batch_id=batch_id)


def failing_reduce(batch_id: str) -> None:
    """A reduce that writes, then raises: its write must be rolled back, its failure counted."""
    ReduceRun.objects.create(batch_id=batch_id)
    raise RuntimeError("the report service is down")


def hold_until_released(item: dict[str, str]) -> None:
    """Record the start in Redis list ``item["log"]``, then block until the test pushes to ``item["release"]``."""
    import django_rq

    connection = django_rq.get_connection("default")
    connection.rpush(item["log"], "start")
    if connection.blpop([item["release"]], timeout=60) is None:
        raise TimeoutError("nobody released the item")
