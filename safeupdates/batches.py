"""Deprecated: the old import path of the batches of ``fan_out()``, now the app
:mod:`safeupdates.contrib.batches` (add it to ``INSTALLED_APPS``). A name imported from here warns
(``DeprecationWarning``); the module goes in safeupdates 0.3.0. Jobs queued under these dotted paths
still run."""

from __future__ import annotations

from typing import Any

from safeupdates.deprecation import moved, queued_job

# Queued jobs name these paths; a worker must import them without a warning (safeupdates.deprecation).
run_batch_item = queued_job(__name__, "run_batch_item")
run_batch_reduce = queued_job(__name__, "run_batch_reduce")


def __getattr__(name: str) -> Any:
    return moved(__name__, name)
