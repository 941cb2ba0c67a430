"""Signals of safeupdates: one per outcome of a request, a refused stale save, and what operators count.

Outcome signals (:data:`request_applied`, :data:`request_stale`, :data:`request_duplicate`,
:data:`request_rejected`, :data:`request_failed`) are sent for update requests (those of
``enqueue_update()`` and ``update_if_newer(request_id=...)``) once the transaction that recorded the
outcome has committed (``transaction.on_commit``): a job that applies 300 requests sends 300 signals
after its commit, and a rolled-back write sends none. Each receiver gets keyword arguments:

- ``sender``: the model class of the record;
- ``pk``: the record's primary key;
- ``request_id``: the request's UUID;
- ``version``: the request's version;
- ``fields``: the names of the fields this request wrote (empty unless applied);
- ``held``: ``{field: version}`` of the fields this request did not write, each with the version of
  the newer write that held it (a newer request of the same job, or what the row carried; empty
  where it is not known, for a duplicate, a rejection or a failure);
- ``job_id``: the RQ job that recorded the outcome, or None outside a job;
- ``using``: the database alias;
- ``latency``: seconds from the request's creation to its outcome, on the database's clock (None
  for a duplicate, which records nothing).

Receivers run through ``send_robust()``: one that raises is logged (logger ``django.dispatch``) and
changes nothing, neither the write nor the other receivers. :data:`stale_save_refused` is sent at once,
not after commit: a refusal writes nothing, and it happened whether or not the caller's transaction
commits. Declare receivers with ``**kwargs``: later releases may add arguments.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

__all__ = [
    "OUTCOME_SIGNALS",
    "lock_unavailable",
    "relay_finished",
    "request_applied",
    "request_duplicate",
    "request_failed",
    "request_rejected",
    "request_stale",
    "stale_save_refused",
    "stale_save_refused_robust",
]

#: A request wrote at least one field.
request_applied = Signal()
#: A request wrote nothing: each of its fields already held a newer write.
request_stale = Signal()
#: A request already in a terminal status was submitted or delivered again: nothing written or recorded.
request_duplicate = Signal()
#: A request was refused for good (bad data, a value the database refuses, a missing target).
request_rejected = Signal()
#: A request's transient errors outlasted its retries; ``safeupdates_relay --retry-failed`` revives it.
request_failed = Signal()

#: A write of a model instance that moved on since it was loaded was refused (``StaleObjectError``, an
#: admin/form conflict, an HTTP 412/409). Arguments: ``sender`` (the model), ``pk``, ``version`` (the
#: ``lock_version`` the writer had), ``fields`` (the fields it meant to write; empty for a delete),
#: ``surface`` (``"save"``, ``"delete"``, ``"admin"``, ``"form"``, ``"http"``, ``"drf"``), ``using``.
stale_save_refused = Signal()

#: A row lock could not be had in time (``LockUnavailable``, or a job's lock timeout that RQ retries).
#: Arguments: ``sender`` (the model, or None), ``surface`` (``"with_lock"``, ``"idempotent"``, ``"job"``),
#: ``using``.
lock_unavailable = Signal()

#: A relay pass ended. Arguments: ``sender`` (None), ``report`` (its ``RelayReport``: ``enqueued``
#: jobs, ``revived`` failed requests ...).
relay_finished = Signal()

#: The outcome signal of each request status (and ``"duplicate"``).
OUTCOME_SIGNALS: dict[str, Signal] = {
    "applied": request_applied,
    "stale": request_stale,
    "duplicate": request_duplicate,
    "rejected": request_rejected,
    "failed": request_failed,
}


def stale_save_refused_robust(
    model: type[Any], *, pk: Any, version: int | None, fields: tuple[str, ...], surface: str, using: str
) -> None:
    """Send :data:`stale_save_refused` at once, robustly: for the places that refuse a stale write."""
    stale_save_refused.send_robust(
        sender=model, pk=pk, version=version, fields=tuple(fields), surface=surface, using=using
    )
