from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection


@pytest.mark.django_db
def test_no_missing_migrations():
    out = StringIO()
    # --check exits non-zero (SystemExit) when a model change has no migration.
    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=StringIO())
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_version_sequence_exists(postgres_only):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_class WHERE relkind = 'S' AND relname = 'safeupdates_version_seq'")
        assert cursor.fetchone() == (1,)


@pytest.mark.django_db(transaction=True)
def test_migrations_reverse_and_apply_again():
    call_command("migrate", "safeupdates", "zero", verbosity=0)
    call_command("migrate", "safeupdates", verbosity=0)
    from safeupdates.versions import next_version

    assert next_version() >= 1
