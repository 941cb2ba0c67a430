from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from tests.projects import CORE_APPS, Project, last_line
from tests.test_contrib_apps import MISSING_APP


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


#: A module of a project that uses each job tool, imported when the project starts (its models.py).
TOOL_USERS = {
    "safeupdates.contrib.batches": "from safeupdates.contrib.batches.jobs import fan_out  # noqa: F401\n",
    "safeupdates.contrib.controls": "from safeupdates.contrib.controls.jobs import enqueue  # noqa: F401\n",
    "safeupdates.contrib.idempotent": """
        from safeupdates.contrib.idempotent.decorators import idempotent


        @idempotent(key="mail:{user_id}")
        def send_mail(user_id):
            pass
    """,
}


@pytest.mark.parametrize("installed", [True, False], ids=["installed", "missing"])
@pytest.mark.parametrize("app", sorted(TOOL_USERS))
def test_makemigrations_with_and_without_each_contrib_app(tmp_path, app, installed):
    """With its app, a job tool adds no migration; without it, the project stops at start-up with
    ImproperlyConfigured naming the app, and nothing is offered for safeupdates' own migrations (a
    contrib model registered under the ``safeupdates`` label would be written into the library)."""
    project = Project(tmp_path, [*CORE_APPS, *([app] if installed else []), "shop"])
    project.app("shop", models=TOOL_USERS[app])
    done = project.manage("makemigrations", "--check", "--dry-run")
    if installed:
        assert (done.returncode, done.stdout.strip()) == (0, "No changes detected"), done.stderr
        return
    assert done.returncode == 1, done.stdout
    assert "Migrations for" not in done.stdout
    assert last_line(done.stderr) == f"django.core.exceptions.ImproperlyConfigured: {MISSING_APP[app]}"


@pytest.mark.parametrize("installed", [[], sorted(TOOL_USERS)], ids=["core-alone", "every-contrib-app"])
def test_makemigrations_of_the_core_alone_and_with_every_contrib_app(tmp_path, installed):
    project = Project(tmp_path, [*CORE_APPS, *installed])
    done = project.manage("makemigrations", "--check", "--dry-run")
    assert (done.returncode, done.stdout.strip()) == (0, "No changes detected"), done.stderr


def test_the_models_of_a_contrib_app_carry_their_own_label():
    """Imported without their app installed, they register under ``safeupdates_batches``, which
    nothing migrates: never under ``safeupdates``, whose migrations ship in the wheel."""
    from django.apps import apps

    from safeupdates.contrib.batches.models import Batch, BatchItem

    assert [model._meta.original_attrs.get("app_label") for model in (Batch, BatchItem)] == ["safeupdates_batches"] * 2
    assert sorted(m.__name__ for m in apps.get_app_config("safeupdates").get_models()) == [
        "FailedRequest",  # a proxy of the request log, for the admin's list of failed requests
        "ProcessedRequest",
        "VersionCounter",
        "WaitingMessage",
    ]
