"""Exceptions raised by safeupdates. Every one derives from :class:`SafeUpdatesError`."""

from __future__ import annotations

from django.db import DataError

__all__ = [
    "BackendUnavailable",
    "InvalidControl",
    "InvalidUpdate",
    "LockUnavailable",
    "NeverLoadedError",
    "RequestNotFound",
    "SafeUpdatesError",
    "StaleObjectError",
    "UnstorableValue",
]


class SafeUpdatesError(Exception):
    """Base class of every error safeupdates raises on purpose."""


class StaleObjectError(SafeUpdatesError):
    """A ``save()`` lost the race: the row was written after this instance was loaded."""


class NeverLoadedError(StaleObjectError):
    """A ``save()`` would write over a row its instance never loaded (a new instance with that row's key)."""


class InvalidUpdate(SafeUpdatesError, ValueError):
    """The arguments of an update are wrong; nothing was written.

    The message is for the developer and the server's log: it may quote the value refused. Where the
    refusal is about one field's value, ``model`` (its label, ``"app.Model"``) and ``field`` (its name)
    say so, and ``reason`` what is wrong with it (the message after the field's name and value), for a
    surface to tell a client who sees that field without quoting a value of a field the client does not
    see. A ``reason`` without ``field`` is about no field's value, and quotes none: any client may be told
    it. None where it is not known (a surface then tells its client that a value could not be stored).
    """

    def __init__(
        self, *args: object, model: str | None = None, field: str | None = None, reason: str | None = None
    ) -> None:
        super().__init__(*args)
        self.model, self.field, self.reason = model, field, reason

    def located(self, model: str, field: str, prefix: str) -> InvalidUpdate:
        """Say that this refusal is of ``model``'s ``field``, whose message starts with ``prefix`` (the
        field and its value, as the raiser wrote them): the rest of the message is the ``reason``. Kept
        as it is if it names a field already, or if its message does not start with ``prefix``; returns
        itself, to be raised."""
        message = str(self)
        if self.field is None and message.startswith(prefix):
            self.model, self.field = model, field
            self.reason = message[len(prefix) :].strip() or None
        return self


class UnstorableValue(InvalidUpdate, DataError):
    """``save()`` refused a value no column can hold, before any statement: nothing was written.

    Also Django's :class:`~django.db.DataError`, which a plain ``save()`` raises for such a value, so that
    both ``except InvalidUpdate`` and ``except DatabaseError`` around a ``save()`` catch it.
    """

    @classmethod
    def of(cls, refusal: InvalidUpdate) -> UnstorableValue:
        """``refusal`` (an :class:`InvalidUpdate` of a value) as an UnstorableValue, with its location."""
        if isinstance(refusal, cls):
            return refusal
        return cls(*refusal.args, model=refusal.model, field=refusal.field, reason=refusal.reason)


class LockUnavailable(SafeUpdatesError):
    """A row lock could not be taken (``nowait=True``, or the lock timeout expired)."""


class InvalidControl(SafeUpdatesError, ValueError):
    """An argument of ``enqueue()``, ``@idempotent`` or ``fan_out()`` is wrong; nothing was enqueued or run."""


class RequestNotFound(SafeUpdatesError, LookupError):
    """An apply job's request is not in the worker's database: the job fails rather than report success."""


class BackendUnavailable(SafeUpdatesError):
    """A relay pass could not reach Redis or the database. Nothing is lost: the next pass delivers."""

    def __init__(self, backend: str, where: str, error: BaseException) -> None:
        self.backend, self.where = backend, where
        self.reason = " ".join(str(error).split()) or type(error).__name__  # one line
        super().__init__(f"{backend} unreachable at {where} ({self.reason})")
