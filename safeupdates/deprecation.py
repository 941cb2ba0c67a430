"""Old import paths of the job tools, kept with a ``DeprecationWarning`` until :data:`REMOVED_IN`.

The job tools moved to the apps of ``safeupdates.contrib``, which the core never imports. So the old
names are resolved here, by name, when they are used (from the old modules' ``__getattr__``): importing
the core loads nothing of contrib, and an old name loads only what its new home would. This is the one
core module that names contrib modules (tests/test_layout.py), and it goes with the old paths.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["REMOVED_IN", "moved", "queued_job"]

logger = logging.getLogger("safeupdates")

#: The release that removes the old import paths.
REMOVED_IN = "0.3.0"

_BATCHES = "safeupdates.contrib.batches.jobs"
_CONTROLS = "safeupdates.contrib.controls.jobs"
_IDEMPOTENT = "safeupdates.contrib.idempotent.decorators"

#: Old module -> {name: the module that defines it now}.
MOVED: dict[str, dict[str, str]] = {
    "safeupdates": {"enqueue": _CONTROLS, "fan_out": _BATCHES, "idempotent": _IDEMPOTENT},
    "safeupdates.batches": dict.fromkeys(
        ("deliver_item", "deliver_reduce", "fan_out", "relay_batches", "run_batch_item", "run_batch_reduce"),
        _BATCHES,
    ),
    "safeupdates.controls": {
        **dict.fromkeys(
            (
                "MAX_DEFERRALS",
                "REAP_GRACE",
                "UNIQUE_TTL",
                "controlled_call",
                "enqueue",
                "parse_throttle",
                "reap_if_abandoned",
            ),
            _CONTROLS,
        ),
        "InvalidControl": "safeupdates.exceptions",
    },
    "safeupdates.idempotency": dict.fromkeys(("SKIPPED", "TASK_NAMESPACE", "idempotent", "task_log_key"), _IDEMPOTENT),
    "safeupdates.models": dict.fromkeys(("Batch", "BatchStatus"), "safeupdates.contrib.batches.models"),
}


def _app_of(module: str) -> str:
    """`` (with 'APP' in INSTALLED_APPS)`` for a module of a contrib app; nothing for a core module."""
    parts = module.split(".")
    return f" (with {'.'.join(parts[:3])!r} in INSTALLED_APPS)" if parts[1:2] == ["contrib"] else ""


def moved(module: str, name: str) -> Any:
    """What ``module.name`` named, from its new module, with a ``DeprecationWarning`` that says where it
    is now; ``AttributeError`` for a name that never was there (what a module's own lookup raises)."""
    target = MOVED.get(module, {}).get(name)
    if target is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is deprecated and will be removed in safeupdates {REMOVED_IN}: import {name} "
        f"from {target} instead{_app_of(target)}.",
        DeprecationWarning,
        stacklevel=3,  # the line that used the old name: moved() <- the old module's __getattr__ <- it
    )
    return getattr(importlib.import_module(target), name)


def queued_job(module: str, name: str) -> Callable[..., Any]:
    """The job function at old dotted path ``module.name``, for jobs queued under it before the move:
    runs the function at its new path.

    A worker imports it without a warning: a ``DeprecationWarning`` turned into an error
    (``-W error::DeprecationWarning``) would fail the job. Each run logs a warning instead, so that an
    operator sees whether old jobs are still queued before upgrading to the release that removes them.
    """
    target = MOVED[module][name]

    def run(*args: Any, **kwargs: Any) -> Any:
        logger.warning(
            "safeupdates: a job queued under the old path %s.%s runs %s.%s; safeupdates %s removes the old "
            "paths: let such jobs drain from the queues before upgrading to it.",
            module,
            name,
            target,
            name,
            REMOVED_IN,
        )
        return getattr(importlib.import_module(target), name)(*args, **kwargs)

    run.__module__, run.__name__, run.__qualname__ = module, name, name
    run.__doc__ = f"Job queued under the old path {module}.{name}: runs {target}.{name} (removed in {REMOVED_IN})."
    return run
