"""The delivery seam: where a committed request's apply job goes, RQ or Django's Tasks framework.

``SAFEUPDATES_DELIVERY = "rq"`` (the default) delivers through django-rq (:mod:`safeupdates.queues`);
``"tasks"`` through the ``TASKS`` backend ``SAFEUPDATES_TASK_BACKEND`` (:mod:`safeupdates.taskqueue`).
Either way the request log is the outbox: a job or task carries request ids and the record's identity,
never the changes, and :mod:`safeupdates.relay` delivers again whatever was lost, through the same
delivery. The rest of the job path calls this module, never one of the two directly, where a delivery
choice matters; :mod:`safeupdates.taskqueue` (which imports ``django.tasks``) is imported only when used.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from safeupdates import conf, queues, tracing
from safeupdates.attempts import Attempt, current_attempt, current_job_id, running

__all__ = [
    "Attempt",
    "current_attempt",
    "current_job_id",
    "deliver_or_leave_for_relay",
    "queue_name",
    "running",
    "will_retry",
]


def deliver_or_leave_for_relay(
    request_id: uuid.UUID | str,
    content_type_id: int,
    object_id: str,
    queue_name: str,
    *,
    what: str,
    likely_queued: bool = False,
    meta: dict[str, Any] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Deliver committed request ``request_id`` of record ``content_type_id:object_id`` (in database
    ``using``); if the queue or the task backend cannot be reached, leave it (pending) to the relay.
    ``meta`` goes into a new RQ job's meta; a task gets its trace context as its ``trace`` argument."""
    if conf.uses_tasks():
        from safeupdates import taskqueue

        trace = (meta or {}).get(tracing.TRACE_META_KEY) or None
        taskqueue.deliver_or_leave_for_relay(
            request_id, content_type_id, object_id, queue_name, what=what, using=using, trace=trace
        )
        return
    queues.deliver_or_leave_for_relay(
        request_id,
        content_type_id,
        object_id,
        queue_name,
        what=what,
        likely_queued=likely_queued,
        meta=meta,
        using=using,
    )


def queue_name(queue: str | None) -> str | None:
    """With tasks delivery, the task queue to deliver on (``queue``, else ``SAFEUPDATES_QUEUE``), checked
    against the backend's ``QUEUES``; None with RQ delivery (the caller checks ``RQ_QUEUES``)."""
    if not conf.uses_tasks():
        return None
    from safeupdates import taskqueue

    return taskqueue.queue_name(queue)


def will_retry(request_id: uuid.UUID) -> bool:
    """True if the running job (RQ) or task (tasks delivery) of ``request_id`` will run again should it
    fail now: the request then stays ``pending`` (see :func:`safeupdates.taskqueue.will_retry`)."""
    if current_attempt() is not None:
        from safeupdates import taskqueue

        return taskqueue.will_retry(request_id)
    return queues.will_retry()
