"""Exceptions raised by safeupdates. Every one derives from :class:`SafeUpdatesError`."""

from __future__ import annotations

__all__ = ["InvalidControl", "InvalidUpdate", "LockUnavailable", "SafeUpdatesError", "StaleObjectError"]


class SafeUpdatesError(Exception):
    """Base class of every error safeupdates raises on purpose."""


class StaleObjectError(SafeUpdatesError):
    """A ``save()`` lost the race: the row was written after this instance was loaded."""


class InvalidUpdate(SafeUpdatesError, ValueError):
    """The arguments of an update are wrong; nothing was written."""


class LockUnavailable(SafeUpdatesError):
    """A row lock could not be taken (``nowait=True``, or the lock timeout expired)."""


class InvalidControl(SafeUpdatesError, ValueError):
    """An argument of ``enqueue()``, ``@idempotent`` or ``fan_out()`` is wrong; nothing was enqueued or run."""
