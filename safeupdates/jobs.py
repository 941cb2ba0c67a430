"""The job path, stage by stage (:mod:`safeupdates.pipeline`): :func:`enqueue_update` (the outbox and the
on-commit delivery), :func:`apply_update` (the job) and :func:`relay` (redelivery of requests whose job was
lost; :func:`relay_pending` as a scheduled job), :func:`redrive` (failed and rejected requests made pending
and delivered again). A request's status changes only in
:mod:`safeupdates.lifecycle`; what delivers the jobs is :mod:`safeupdates.delivery`'s to say.

This module keeps the public names of the job path in one place. Jobs name their function by dotted
path: ``safeupdates.jobs.apply_update`` (``safeupdates.delivery.APPLY_UPDATE``) is the one every apply
job carries, already queued ones included, and stays importable here.
"""

from __future__ import annotations

from typing import Any

from safeupdates.database.errors import describe_database, is_transient, unreachable_database
from safeupdates.pipeline.apply import BATCH_SIZE, apply_update
from safeupdates.pipeline.enqueue import aenqueue_update, enqueue_update
from safeupdates.pipeline.redrive import Redriven, redrive
from safeupdates.pipeline.relay import RelayReport, relay, relay_pending, relay_queue, relay_steps

__all__ = [
    "BATCH_SIZE",
    "Redriven",
    "RelayReport",
    "aenqueue_update",
    "apply_update",
    "describe_database",
    "enqueue_update",
    "is_transient",
    "redrive",
    "relay",
    "relay_pending",
    "relay_queue",
    "relay_steps",
    "unreachable_database",
]


def __getattr__(name: str) -> Any:
    # deliver() is RQ's (safeupdates.delivery.rq): imported when used, so that a project delivering
    # otherwise imports nothing of RQ through the job path.
    if name == "deliver":
        from safeupdates.delivery.rq import deliver

        return deliver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
