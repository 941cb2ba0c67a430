"""Old import path of the batches of ``fan_out()``, now the app :mod:`safeupdates.contrib.batches`
(add it to ``INSTALLED_APPS``). Jobs queued under these dotted paths still run."""

from __future__ import annotations

from safeupdates.contrib.batches.jobs import (
    deliver_item,
    deliver_reduce,
    fan_out,
    relay_batches,
    run_batch_item,
    run_batch_reduce,
)

__all__ = ["deliver_item", "deliver_reduce", "fan_out", "relay_batches", "run_batch_item", "run_batch_reduce"]
