"""The core write path works without the optional job tools of ``safeupdates.contrib``: a project with
only contenttypes, auth, django_rq and safeupdates (and its own model) migrates, writes and enqueues,
and no module of contrib is ever loaded; nor does it need the extras' packages (``prometheus-client``,
OpenTelemetry), which cannot be imported there."""

from __future__ import annotations

from tests.projects import CORE_APPS, Project

MODELS = """
from django.db import models

from safeupdates.models import SafeUpdateModel


class Thing(SafeUpdateModel):
    safe_update_fields = ("name",)

    name = models.CharField(max_length=20, default="")
"""

DRIVE = """
import importlib
import sys
from pathlib import Path


class Uninstalled:
    \"\"\"The extras' packages are not installed here: importing them raises ModuleNotFoundError.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("prometheus_client", "opentelemetry"):
            raise ModuleNotFoundError(f"No module named {name!r} (an extra, not installed here)", name=name)
        return None


sys.meta_path.insert(0, Uninstalled())

import django

django.setup()
import django_rq
from django.apps import apps
from django.core.management import call_command

import safeupdates

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

# Every module of the core imports without loading contrib.
package = Path(safeupdates.__file__).parent
core = [
    ".".join(("safeupdates", *path.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
    for path in sorted(package.rglob("*.py"))
    if "contrib" not in path.relative_to(package).parts
]
for name in core:
    importlib.import_module(name)
assert "safeupdates.delivery.rq" in core and "safeupdates.management.commands.safeupdates_relay" in core
loaded = sorted(name for name in sys.modules if name.startswith("safeupdates.contrib"))
assert not loaded, loaded
print("core alone: ok")
"""


def test_the_core_works_without_the_contrib_apps(tmp_path, redis):
    # The admin too, so that safeupdates.admin imports as in most projects.
    project = Project(tmp_path, ["django.contrib.admin", *CORE_APPS, "alone"])
    project.app("alone", migrations=True, models=MODELS)
    (tmp_path / "drive.py").write_text(DRIVE)
    done = project.python("drive.py")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "core alone: ok" in done.stdout
