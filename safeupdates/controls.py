"""Old import path of the job controls, now the app :mod:`safeupdates.contrib.controls`. Jobs queued
under these dotted paths (``controlled_call``, ``reap_if_abandoned``) still run."""

from __future__ import annotations

from safeupdates.contrib.controls.jobs import (
    MAX_DEFERRALS,
    REAP_GRACE,
    UNIQUE_TTL,
    InvalidControl,
    controlled_call,
    enqueue,
    parse_throttle,
    reap_if_abandoned,
)

__all__ = [
    "MAX_DEFERRALS",
    "REAP_GRACE",
    "UNIQUE_TTL",
    "InvalidControl",
    "controlled_call",
    "enqueue",
    "parse_throttle",
    "reap_if_abandoned",
]
