"""safeupdates: safe asynchronous model updates for Django (versioned, idempotent, never lost)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "enqueue_update", "aenqueue_update"]

if TYPE_CHECKING:
    from safeupdates.jobs import aenqueue_update, enqueue_update


def __getattr__(name: str) -> Any:
    # Lazy, so that importing the package does not import models before the app registry is ready.
    if name in ("enqueue_update", "aenqueue_update"):
        from safeupdates import jobs

        return getattr(jobs, name)
    raise AttributeError(f"module 'safeupdates' has no attribute {name!r}")
