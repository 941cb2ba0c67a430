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
def test_migrating_to_zero_and_back_never_hands_out_a_version_below_a_stored_one():
    from safeupdates.versions import next_version
    from tests.testapp.models import Profile

    profile = Profile.objects.create(name="kept")  # its table is not the app's: it outlives `migrate zero`
    for _ in range(3):
        next_version()
    call_command("migrate", "safeupdates", "zero", verbosity=0)
    call_command("migrate", "safeupdates", verbosity=0)
    assert next_version() > profile.lock_version
    # So a request allocated now still beats the row's last save.
    assert Profile.objects.update_if_newer(profile.pk, version=next_version(), name="new").applied
