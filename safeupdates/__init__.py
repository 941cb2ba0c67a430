"""safeupdates: safe asynchronous model updates for Django (versioned, idempotent, never lost)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "aenqueue_update", "enqueue_update", "replay"]

if TYPE_CHECKING:
    from safeupdates.audit import replay
    from safeupdates.jobs import aenqueue_update, enqueue_update

# Public name -> module that defines it. Imported lazily, so that importing the package does not import
# models before the app registry is ready.
_LAZY = {
    "enqueue_update": "safeupdates.jobs",
    "aenqueue_update": "safeupdates.jobs",
    "replay": "safeupdates.audit",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
