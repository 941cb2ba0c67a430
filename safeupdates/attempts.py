"""The apply task running in this thread, with ``SAFEUPDATES_DELIVERY = "tasks"``: what the job path asks
of it (its attempt number, its task result id) where RQ's ``get_current_job()`` answers for an RQ job."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from safeupdates import queues

__all__ = ["Attempt", "current_attempt", "current_job_id", "running"]


@dataclass(frozen=True)
class Attempt:
    """The apply task (tasks delivery) running in this thread: its request, record
    (``content_type_id:object_id``), attempt number (0 first), task result id, task queue and the
    database its request is in."""

    request_id: str
    record: str
    number: int
    task_id: str | None
    queue_name: str
    using: str = "default"


_current: ContextVar[Attempt | None] = ContextVar("safeupdates_task_attempt", default=None)


def current_attempt() -> Attempt | None:
    """The apply task running in this thread, or None outside one (and in RQ jobs)."""
    return _current.get()


@contextmanager
def running(attempt: Attempt) -> Iterator[None]:
    """Make ``attempt`` the :func:`current_attempt` inside the block."""
    token = _current.set(attempt)
    try:
        yield
    finally:
        _current.reset(token)


def current_job_id() -> str | None:
    """The id of the Django task result, or of the RQ job, this code runs in; None outside both."""
    attempt = current_attempt()
    if attempt is not None and attempt.task_id:
        return attempt.task_id
    return queues.current_job_id()
