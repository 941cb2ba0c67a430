"""The version source: one monotonic counter in the database, never a clock.

On PostgreSQL it is the sequence ``safeupdates_version_seq`` created by the app's migration: ``nextval``
is atomic across every process and machine sharing the database, is never rolled back, and does not
depend on any table's contents, so purging old requests cannot make it go back. Elsewhere a one-row
counter table is incremented inside a transaction; the database's write lock makes that atomic.
"""

from __future__ import annotations

from django.db import connections, transaction
from django.db.models import F

__all__ = ["SEQUENCE_NAME", "next_version"]

SEQUENCE_NAME = "safeupdates_version_seq"
_NEXTVAL_SQL = f"SELECT nextval('{SEQUENCE_NAME}')"


def next_version(using: str = "default") -> int:
    """Return a new version, strictly greater than every version returned before on this database."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_NEXTVAL_SQL)
            return int(cursor.fetchone()[0])
    return _next_from_counter(using)


def _next_from_counter(using: str) -> int:
    from safeupdates.models import VersionCounter

    counters = VersionCounter.objects.using(using)
    with transaction.atomic(using=using):
        if not counters.filter(pk=1).update(value=F("value") + 1):
            # The row is created by the migration; a test-suite flush can remove it.
            counters.create(pk=1, value=1)
        return int(counters.values_list("value", flat=True).get(pk=1))
