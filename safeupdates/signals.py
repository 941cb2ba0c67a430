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

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.dispatch import Signal

__all__ = [
    "OUTCOME_SIGNALS",
    "lock_unavailable",
    "refusals_on",
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

#: A write of a model instance that moved on since it was loaded was refused (``StaleObjectError``,
#: ``NeverLoadedError``, an admin/form conflict, an HTTP 412/409), once per refusal. Arguments:
#: ``sender`` (the model), ``pk``, ``version`` (the ``lock_version`` the writer had; None for a new
#: instance that never loaded the row), ``fields`` (the fields it meant to write, sorted; empty for a
#: delete, an action or a request whose fields are not known yet), ``surface`` (``"save"``, ``"delete"``
#: for code; ``"admin"``, ``"form"``, ``"http"``, ``"drf"`` for a refusal in their requests, also one
#: the save made there), ``using``.
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


@dataclass
class _Surface:
    name: str
    refused: set[tuple[str, str, str]] = field(default_factory=set)  # (model, pk, using) signalled


_SURFACE: ContextVar[_Surface | None] = ContextVar("safeupdates_surface", default=None)


@contextmanager
def refusals_on(surface: str) -> Iterator[None]:
    """While a surface (the admin, a form's view, an HTTP view) handles a request: each record's refused
    write is signalled once, named ``surface``.

    A surface refuses some writes itself, before any save (an old edit token, an If-Match naming an
    older version); the others are refused by the save (a write that landed after the surface's check).
    A surface that checks its record again after such a refusal, to show why, finds it refused a second
    time: within this block that is the same refusal, and sends nothing. Nested blocks share what was
    signalled; the innermost names it.
    """
    outer = _SURFACE.get()
    token = _SURFACE.set(_Surface(surface, outer.refused if outer is not None else set()))
    try:
        yield
    finally:
        _SURFACE.reset(token)


def stale_save_refused_robust(
    model: type[Any], *, pk: Any, version: int | None, fields: Iterable[str], surface: str, using: str
) -> None:
    """Send :data:`stale_save_refused` at once, robustly: for the places that refuse a stale write.

    Within :func:`refusals_on`, the surface handling the request names it (``surface`` otherwise), and a
    record refused once already sends nothing."""
    current = _SURFACE.get()
    if current is not None:
        key = ((model._meta.concrete_model or model)._meta.label, str(pk), using)
        if key in current.refused:
            return
        current.refused.add(key)
        surface = current.name
    stale_save_refused.send_robust(
        sender=model, pk=pk, version=version, fields=tuple(sorted(fields)), surface=surface, using=using
    )
