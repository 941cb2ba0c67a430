"""What a guarded write did: its :class:`Outcome`, decided by one rule (:func:`outcome_of_write`).

Every path that writes a request's changes decides its outcome here: ``update_if_newer()`` (the
manager), the apply job (per request of a merged batch), and the one-statement recorded write on
PostgreSQL, whose statement holds the same rule in SQL, beside the status it records
(``statements._recorded``: applied if the UPDATE wrote, else stale if the row exists, else missing).
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class Outcome(enum.StrEnum):
    """What an update did."""

    APPLIED = "applied"
    """At least one field was written."""
    STALE = "stale"
    """Every field already carried a newer write (or the timestamp was not newer): nothing written."""
    DUPLICATE = "duplicate"
    """The request id was already processed: nothing written."""
    MISSING = "missing"
    """No row has that primary key: nothing written."""


def outcome_of_write(wrote: bool, row_exists: bool | Callable[[], bool]) -> Outcome:
    """The outcome of a guarded write: ``APPLIED`` if it wrote any field, else ``STALE`` if the row is
    there (a newer write held every field), else ``MISSING``. ``row_exists`` may be a function, asked
    only when nothing was written (a query the common case never pays)."""
    if wrote:
        return Outcome.APPLIED
    exists = row_exists() if callable(row_exists) else row_exists
    return Outcome.STALE if exists else Outcome.MISSING
