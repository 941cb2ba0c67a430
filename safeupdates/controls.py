"""Deprecated: the old import path of the job controls, now the app :mod:`safeupdates.contrib.controls`
(add it to ``INSTALLED_APPS``). A name imported from here warns (``DeprecationWarning``); the module goes
in safeupdates 0.3.0. Jobs queued under these dotted paths (``controlled_call``, ``reap_if_abandoned``)
still run."""

from __future__ import annotations

from typing import Any

from safeupdates.deprecation import moved, queued_job

# Queued jobs name these paths; a worker must import them without a warning (safeupdates.deprecation).
controlled_call = queued_job(__name__, "controlled_call")
reap_if_abandoned = queued_job(__name__, "reap_if_abandoned")


def __getattr__(name: str) -> Any:
    return moved(__name__, name)
