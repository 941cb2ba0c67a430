"""The core write path works without the optional job tools of ``safeupdates.contrib``: a project with
only contenttypes, auth, django_rq and safeupdates (and its own model) migrates, writes and enqueues."""

from __future__ import annotations

import subprocess
import sys

from django.conf import settings

from tests.workers import ROOT, subprocess_env

SETTINGS = """
import os

SECRET_KEY = "core-alone"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_rq", "safeupdates", "alone"]
NAME = os.path.join(os.path.dirname(__file__), "db.sqlite3")
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": NAME}}
RQ_QUEUES = {"default": {"URL": os.environ["REDIS_URL"]}}
"""

MODELS = """
from django.db import models

from safeupdates.models import SafeUpdateModel


class Thing(SafeUpdateModel):
    safe_update_fields = ("name",)

    name = models.CharField(max_length=20, default="")
"""

DRIVE = """
import django

django.setup()
import django_rq
from django.apps import apps
from django.core.management import call_command

assert not [app.name for app in apps.get_app_configs() if app.name.startswith("safeupdates.contrib")]
call_command("makemigrations", "alone", verbosity=0)
call_command("migrate", verbosity=0)

from alone.models import Thing
from safeupdates import enqueue_update
from safeupdates.jobs import apply_update, relay_steps
from safeupdates.versions import next_version

thing = Thing.objects.create(name="a")
assert Thing.objects.update_if_newer(thing.pk, version=next_version(), name="b").applied
request = enqueue_update(Thing, thing.pk, name="c")
assert [job.args[0] for job in django_rq.get_queue("default").jobs] == [str(request.request_id)]
apply_update(str(request.request_id))
assert Thing.objects.get(pk=thing.pk).name == "c"
request.refresh_from_db()
assert request.status == "applied", request.status
assert relay_steps == []  # no batches: nothing registered
print("core alone: ok")
"""


def test_the_core_works_without_the_contrib_apps(tmp_path, redis):
    (tmp_path / "alone" / "migrations").mkdir(parents=True)
    (tmp_path / "alone" / "__init__.py").write_text("")
    (tmp_path / "alone" / "migrations" / "__init__.py").write_text("")
    (tmp_path / "alone" / "models.py").write_text(MODELS)
    (tmp_path / "alone_settings.py").write_text(SETTINGS)
    (tmp_path / "drive.py").write_text(DRIVE)
    env = subprocess_env(DJANGO_SETTINGS_MODULE="alone_settings", REDIS_URL=settings.REDIS_URL)
    env["PYTHONPATH"] = f"{tmp_path}:{ROOT}"
    done = subprocess.run(
        [sys.executable, "drive.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "core alone: ok" in done.stdout
