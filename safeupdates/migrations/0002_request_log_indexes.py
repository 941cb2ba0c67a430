"""Two indexes of the request log, built without blocking writers.

- ``safeupdates_outcomes`` on ``(status, processed_at)``, terminal rows only: the outcomes of the last
  hour and the failed requests (``safeupdates_status``, the metrics) without reading the history.
  Pending rows stay out, so ``enqueue_update()`` never writes it.
- ``safeupdates_created`` on ``(created_at, id)``: ``safeupdates_purge``'s batches (each starts where the
  last one ended, in creation order), the request-log admin's default order and its date hierarchy.
  See the EXPLAIN plans in docs/benchmarks.md.

On PostgreSQL each index is built with ``CREATE INDEX CONCURRENTLY``: writers go on while it builds (on a
log of millions of rows, that takes a while). ``CONCURRENTLY`` cannot run in a transaction, hence
``atomic = False``; if a build fails (a deadlock, a cancel) PostgreSQL leaves an INVALID index behind:
``DROP INDEX CONCURRENTLY <name>`` and migrate again. Elsewhere (SQLite) a plain ``CREATE INDEX``.
"""

from typing import Any

from django.db import migrations, models


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    """``AddIndex``, built ``CONCURRENTLY`` on PostgreSQL: the request log takes writes while it is built."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            if schema_editor.connection.vendor == "postgresql":
                schema_editor.add_index(model, self.index, concurrently=True)
            else:
                schema_editor.add_index(model, self.index)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            if schema_editor.connection.vendor == "postgresql":
                schema_editor.remove_index(model, self.index, concurrently=True)
            else:
                schema_editor.remove_index(model, self.index)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("safeupdates", "0001_initial"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="processedrequest",
            index=models.Index(
                condition=models.Q(("status", "pending"), _negated=True),
                fields=["status", "processed_at"],
                name="safeupdates_outcomes",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="processedrequest",
            index=models.Index(fields=["created_at", "id"], name="safeupdates_created"),
        ),
    ]
