"""The job path, stage by stage: :mod:`safeupdates.enqueuing` (:func:`enqueue_update`: the outbox and the
on-commit enqueue), :mod:`safeupdates.apply` (:func:`apply_update`, the RQ job) and :mod:`safeupdates.relay`
(:func:`relay`: redelivery of requests whose job was lost; :func:`relay_pending` as an RQ job). A request's
status changes only in :mod:`safeupdates.lifecycle`.

This module keeps the public names of the job path in one place. Jobs name their function by dotted
path: ``safeupdates.jobs.apply_update`` (``queues.APPLY_UPDATE``) is the one every apply job carries,
already queued ones included, and stays importable here.
"""

from __future__ import annotations

from safeupdates.apply import BATCH_SIZE, apply_update, describe_database, is_transient
from safeupdates.enqueuing import aenqueue_update, enqueue_update
from safeupdates.exceptions import BackendUnavailable, RequestNotFound
from safeupdates.queues import deliver
from safeupdates.relay import RelayReport, relay, relay_pending, relay_queue, relay_steps, unreachable_database

__all__ = [
    "BATCH_SIZE",
    "BackendUnavailable",
    "RelayReport",
    "RequestNotFound",
    "aenqueue_update",
    "apply_update",
    "deliver",
    "describe_database",
    "enqueue_update",
    "is_transient",
    "relay",
    "relay_pending",
    "relay_queue",
    "relay_steps",
    "unreachable_database",
]
