"""docs/delivery.md's Celery files, as a project writes them: the app made as Celery's Django guide makes
it is Celery's current app, safeupdates' apply task registers with it at start-up, and ``manage.py check``
finds nothing to say (no W024: apply tasks go to the queue a worker consumes without ``-Q``)."""

from __future__ import annotations

import pytest

from tests.docs_blocks import file_blocks
from tests.projects import CORE_APPS, Project

PROJECT_CHECK = """
import django

django.setup()
import proj  # what manage.py and celery -A proj import first
from celery import current_app
from django.core.management import call_command

app = current_app._get_current_object()
assert app is proj.celery_app and app.main == "proj", app
task = app.tasks["safeupdates.jobs.apply_update"]
assert (task.acks_late, task.reject_on_worker_lost, task.serializer) == (True, True, "json"), task
assert "safeupdates.jobs.relay_pending" in app.tasks and "safeupdates-relay" in app.conf.beat_schedule
call_command("check", fail_level="WARNING")

from safeupdates import delivery

assert delivery.queue_name(None) == app.conf.task_default_queue == "celery"
print("celery project: ok")
"""


@pytest.mark.once
def test_the_pages_celery_files_make_a_project_that_checks_clean(tmp_path):
    files = file_blocks("docs/delivery.md")
    assert set(files) == {"proj/celery.py", "proj/__init__.py", "proj/settings.py"}
    project = Project(tmp_path, [*CORE_APPS])
    project.app("proj", **{"celery": files["proj/celery.py"], "__init__": files["proj/__init__.py"]})
    # The page's settings go with the rest of the project's (its proj/celery.py names proj.settings only
    # where DJANGO_SETTINGS_MODULE is not set already).
    with open(project.root / "project_settings.py", "a") as settings:
        settings.write("\n" + files["proj/settings.py"])
    ran = project.python("-c", PROJECT_CHECK)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip().endswith("celery project: ok")
