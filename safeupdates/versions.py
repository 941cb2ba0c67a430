"""The version source: one monotonic counter in the database, never a clock.

On PostgreSQL it is the sequence ``safeupdates_version_seq`` created by the app's migration: ``nextval``
is atomic across every process and machine sharing the database, is never rolled back, and does not
depend on any table's contents, so purging old requests cannot make it go back. Elsewhere a one-row
counter table is incremented by one UPDATE that returns the new value; the database's write lock makes
that atomic.

The source never hands out a version below one already stored: after every ``migrate`` (which may have
dropped and created the sequence again) :func:`raise_floor` moves it above the highest version in the
request log and in every ``LockVersionMixin`` table.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction
from django.db.models import F

from safeupdates.database import statements
from safeupdates.database.cursors import fetch_one
from safeupdates.database.internals import update_returning
from safeupdates.database.registry import holds_versions, request_log, version_counter
from safeupdates.database.statements import SEQUENCE_NAME
from safeupdates.exceptions import InvalidUpdate

__all__ = [
    "MAX_VERSION",
    "SEQUENCE_NAME",
    "ensure_issued",
    "floor_after_migrate",
    "last_issued",
    "next_version",
    "raise_floor",
]

#: The largest version a ``BigIntegerField`` holds.
MAX_VERSION = 2**63 - 1

# Per PostgreSQL database: where this process last saw the sequence (a version it handed out, or its value
# read), the cache of ensure_issued. The latest seen, not the highest: a sequence goes back when it is
# restored or created again, and the next look at it must take the cache back too. raise_floor (after
# every migrate) drops it. Not kept for the counter table, whose increments roll back with their
# transaction.
_issued: dict[str, int] = {}


def next_version(using: str = "default") -> int:
    """Return a new version, strictly greater than every version returned before on this database."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        version = int(fetch_one(connection, statements.NEXTVAL)[0])
        _issued[using] = version
        return version
    return _next_from_counter(using)


def last_issued(using: str = "default") -> int:
    """The highest version the source has handed out so far (0 if none)."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        return int(fetch_one(connection, statements.LAST_VALUE)[0])
    value = version_counter().objects.using(using).filter(pk=1).values_list("value", flat=True).first()
    return int(value or 0)


def ensure_issued(version: int, using: str = "default") -> None:
    """Raise :class:`InvalidUpdate` unless ``version`` was handed out by the source already.

    A version from the future would win every field it writes until the source catches up with it,
    freezing them. On PostgreSQL it costs a query only for a version above where this process last saw
    the sequence; that query is what it accepts or refuses by, and where it has seen the sequence since.
    """
    if version <= _issued.get(using, 0):
        return
    current = last_issued(using)
    if connections[using].vendor == "postgresql":
        _issued[using] = current  # also when it went back (a restore): never kept above what was read
    if version > current:
        raise InvalidUpdate(
            f"version {version} has not been handed out by the version source yet (last: {current}); "
            "allocate versions with safeupdates.versions.next_version(), never make them up."
        )


def _next_from_counter(using: str) -> int:
    VersionCounter = version_counter()
    counters = VersionCounter.objects.using(using)
    value = VersionCounter._meta.get_field("value")
    # One statement, atomic on its own: the UPDATE returns the value it wrote (SQLite 3.35+).
    taken = update_returning(counters.filter(pk=1), [(value, None, F("value") + 1)], [value])
    if taken:
        return int(taken[0][0])
    with transaction.atomic(using=using):
        # The row is created by the migration; a test-suite flush can remove it. Start again above every
        # version stored, never at 1.
        if not counters.filter(pk=1).update(value=F("value") + 1):
            counters.create(pk=1, value=_stored_floor(using) + 1)
        return int(counters.values_list("value", flat=True).get(pk=1))


def _stored_floor(using: str) -> int:
    """The highest version stored in the request log or in any ``LockVersionMixin`` table (0 if none)."""
    from django.apps import apps
    from django.db.models import Max

    connection = connections[using]
    tables = set(connection.introspection.table_names())
    highest = 0
    for model in apps.get_models():
        if model._meta.proxy or model._meta.db_table not in tables:
            continue
        if model is request_log():
            name = "version"
        elif holds_versions(model) and model._meta.get_field("lock_version").model is model:
            name = "lock_version"
        else:
            continue
        # lock_version is at least every version written to its row, so it stands for field_versions too.
        value = model._base_manager.using(using).aggregate(top=Max(name))["top"]
        highest = max(highest, int(value or 0))
    return highest


def floor_after_migrate(using: str = "default", plan: Any = None, **kwargs: Any) -> None:
    """The ``post_migrate`` receiver: :func:`raise_floor` after a ``migrate``.

    ``flush`` sends ``post_migrate`` too, without a ``plan`` (and every ``TransactionTestCase`` of a
    project flushes after each test). It empties the tables and leaves PostgreSQL's sequence where it
    was: no floor to look for there, and no query per versioned table. It deletes the counter table's
    row, though, which is made again here: made by the first version taken after the flush, inside a
    ``TestCase``'s transaction, it would be rolled back with the test, and looked for again by every
    test after it.
    """
    if plan is not None or connections[using].vendor != "postgresql":
        raise_floor(using)


def raise_floor(using: str = "default", **kwargs: Any) -> None:
    """Move the source above every version stored (after every ``migrate``: :func:`floor_after_migrate`).

    ``migrate safeupdates zero`` drops the sequence (or the counter table) while the rows of the models
    that use the app keep their versions; without this, the source would start again at 1 and every
    later request to an existing row would silently be stale. What this process saw of the old source is
    forgotten (:func:`ensure_issued`).
    """
    _issued.pop(using, None)
    connection = connections[using]
    if connection.vendor == "postgresql":
        if fetch_one(connection, *statements.sequence_exists())[0] is None:
            return  # migrated to zero: no source to move
        floor = _stored_floor(using)
        if floor:
            fetch_one(connection, *statements.raise_sequence(floor))
        return
    VersionCounter = version_counter()
    if VersionCounter._meta.db_table not in connection.introspection.table_names():
        return
    floor = _stored_floor(using)
    with transaction.atomic(using=using):
        counters = VersionCounter.objects.using(using)
        if not counters.filter(pk=1).exists():
            counters.create(pk=1, value=floor)
        else:
            counters.filter(pk=1, value__lt=floor).update(value=floor)
