"""The database's clock: time comes from the database, never from a worker's or a web process's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, models
from django.db.models import ExpressionWrapper
from django.db.models.functions import Now

from safeupdates.database import statements
from safeupdates.database.cursors import fetch_one


def database_now(using: str = "default") -> datetime:
    """The database server's current time, aware (UTC)."""
    connection = connections[using]
    sql = statements.CURRENT_TIMESTAMP if connection.vendor == "postgresql" else statements.SQLITE_NOW
    value = fetch_one(connection, sql)[0]
    now: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value  # SQLite: a string, UTC
    return now if now.tzinfo else now.replace(tzinfo=UTC)


def older_than(seconds: float) -> ExpressionWrapper[Any]:
    """An expression for "``seconds`` before now" on the database's clock, to compare timestamps with."""
    return ExpressionWrapper(Now() - timedelta(seconds=seconds), output_field=models.DateTimeField())
