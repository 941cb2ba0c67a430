"""The request log's index on ``(created_at, id)``, built without blocking writers.

It serves ``safeupdates_purge`` (each batch starts where the last one ended, in creation order), the
request-log admin's default order (``-created_at, -id``: the first page reads 100 index entries instead
of sorting the log) and its date hierarchy (the oldest and newest ``created_at``). See the EXPLAIN plans
in docs/benchmarks.md.

On PostgreSQL the index is built with ``CREATE INDEX CONCURRENTLY``: writers go on while it builds (on a
log of millions of rows, that takes a while). ``CONCURRENTLY`` cannot run in a transaction, hence
``atomic = False``; if the build fails (a deadlock, a cancel) PostgreSQL leaves an INVALID index behind:
``DROP INDEX CONCURRENTLY safeupdates_created`` and migrate again. Elsewhere (SQLite) a plain
``CREATE INDEX``. ``django.contrib.postgres`` is imported only on PostgreSQL: it needs psycopg.
"""

from typing import Any

from django.db import migrations, models


class AddIndexConcurrently(migrations.AddIndex):
    """``AddIndex``, built ``CONCURRENTLY`` on PostgreSQL (``django.contrib.postgres``' operation there)."""

    def _postgres(self) -> Any:
        from django.contrib.postgres.operations import AddIndexConcurrently as Concurrently

        return Concurrently(self.model_name, self.index)

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            self._postgres().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            self._postgres().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("safeupdates", "0001_initial"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="processedrequest",
            index=models.Index(fields=["created_at", "id"], name="safeupdates_created"),
        ),
    ]
