"""The merge rule of the write path: the newest version per field wins (:func:`newest_per_field`).

A job that applies a burst of one record's requests, and ``bulk_update_if_newer()`` merging the updates
of one row, both write what applying each request in version order would leave: per field, the value of
the newest version that touched it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

_K = TypeVar("_K")


def newest_per_field(requests: Iterable[tuple[int, _K, Mapping[str, Any]]]) -> dict[str, tuple[int, _K, Any]]:
    """Merge ``(version, key, changes)`` requests per field: the newest version's ``(version, key, value)``.

    Strictly newer wins: of two requests with the same version, the first one counts, as it would when
    applied one by one (the second then finds its version already there).
    """
    winners: dict[str, tuple[int, _K, Any]] = {}
    for version, key, changes in requests:
        for name, value in changes.items():
            current = winners.get(name)
            if current is None or current[0] < version:
                winners[name] = (version, key, value)
    return winners
