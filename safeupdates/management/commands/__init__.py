"""The commands of ``manage.py``, and the argument check they share."""

from __future__ import annotations

from django.core.management.base import CommandError

#: The largest ``--batch-size``.
MAX_BATCH_SIZE = 1_000_000


def check_batch_size(batch_size: int) -> None:
    """Refuse a ``--batch-size`` below 1 or above :data:`MAX_BATCH_SIZE`, with a ``CommandError``."""
    if batch_size < 1:
        raise CommandError(f"--batch-size must be at least 1, not {batch_size}.")
    if batch_size > MAX_BATCH_SIZE:  # a bigint's LIMIT at most, and memory long before that
        raise CommandError(
            f"--batch-size must be a whole number from 1 to {MAX_BATCH_SIZE}, not {batch_size}; a larger "
            "batch gains nothing over a few of that size."
        )
