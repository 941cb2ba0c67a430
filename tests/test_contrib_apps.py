"""The job tools of ``safeupdates.contrib`` need their app in ``INSTALLED_APPS``: without it, importing or
calling one raises ImproperlyConfigured naming the app, and a tool imported before the app registry could
tell is reported by the system check ``safeupdates.E009``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from tests.projects import CORE_APPS, Project

#: What each tool says when its app is missing: the app to add, and migrate where it has tables.
MISSING_APP = {
    "safeupdates.contrib.batches": "fan_out() needs the app 'safeupdates.contrib.batches': add it to "
    "INSTALLED_APPS and run migrate.",
    "safeupdates.contrib.controls": "enqueue() needs the app 'safeupdates.contrib.controls': add it to INSTALLED_APPS.",
    "safeupdates.contrib.idempotent": "@idempotent needs the app 'safeupdates.contrib.idempotent': add it to "
    "INSTALLED_APPS.",
}


def _fan_out() -> Any:
    from safeupdates.contrib.batches.jobs import fan_out

    return fan_out("tests.testapp.jobs.record", ["a"])


def _enqueue() -> Any:
    from safeupdates.contrib.controls.jobs import enqueue

    return enqueue("tests.testapp.jobs.record", "log", "a", unique_key="a")


def _call_decorated() -> Any:
    from tests.testapp.jobs import charge

    return charge("order-1")


def _decorate() -> Any:
    from safeupdates.contrib.idempotent.decorators import idempotent

    return idempotent(key="mail:{user_id}")(lambda user_id: None)


@pytest.mark.parametrize(
    ("app", "call"),
    [
        ("safeupdates.contrib.batches", _fan_out),
        ("safeupdates.contrib.controls", _enqueue),
        ("safeupdates.contrib.idempotent", _call_decorated),
        ("safeupdates.contrib.idempotent", _decorate),
    ],
    ids=["fan_out", "enqueue", "idempotent-call", "idempotent-decorate"],
)
def test_a_tool_called_without_its_app_raises_naming_the_app(app: str, call: Callable[[], Any]) -> None:
    """Imported while the app was installed, then called with it gone: nothing is written or enqueued
    (no database access is allowed here, and none happens)."""
    without = [name for name in settings.INSTALLED_APPS if name != app]
    with override_settings(INSTALLED_APPS=without), pytest.raises(ImproperlyConfigured) as raised:
        call()
    assert str(raised.value) == MISSING_APP[app]


APPS_PY = """
from django.apps import AppConfig

# Imported while INSTALLED_APPS loads: the registry cannot tell yet whether the tool's app is there.
# (No model can be imported that early, so neither can fan_out() or @idempotent, which need models.)
from safeupdates.contrib.controls.jobs import enqueue  # noqa: F401


class ShopConfig(AppConfig):
    name = "shop"
"""


def test_e009_a_tool_imported_before_the_registry_is_ready(tmp_path):
    project = Project(tmp_path, [*CORE_APPS, "shop"])
    project.app("shop", apps=APPS_PY)
    done = project.manage("check")
    assert done.returncode == 1, done.stdout
    assert done.stderr.splitlines()[:5] == [
        "SystemCheckError: System check identified some issues:",
        "",
        "ERRORS:",
        "?: (safeupdates.E009) enqueue() is imported, but its app 'safeupdates.contrib.controls' is not in "
        "INSTALLED_APPS.",
        "\tHINT: Add 'safeupdates.contrib.controls' to INSTALLED_APPS.",
    ]


def test_no_e009_when_the_tools_apps_are_installed(tmp_path):
    project = Project(tmp_path, [*CORE_APPS, "safeupdates.contrib.controls", "shop"])
    project.app("shop", apps=APPS_PY)
    done = project.manage("check")
    assert (done.returncode, done.stdout.strip()) == (0, "System check identified no issues (0 silenced)."), done.stderr
