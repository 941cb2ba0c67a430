from django.db import migrations, models


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    """AddIndex, built CONCURRENTLY on PostgreSQL: the request log takes writes while it is built."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            if schema_editor.connection.vendor == "postgresql":
                schema_editor.add_index(model, self.index, concurrently=True)
            else:
                schema_editor.add_index(model, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            if schema_editor.connection.vendor == "postgresql":
                schema_editor.remove_index(model, self.index, concurrently=True)
            else:
                schema_editor.remove_index(model, self.index)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run in a transaction.
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
    ]
