"""Settings are read at call time: a change through ``override_settings``, pytest-django's ``settings``
or plain assignment (set or deleted) is seen by the next call."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import override_settings

from safeupdates import conf

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENT = ROOT / "docs" / "deployment.md"


def test_a_setting_changed_set_or_deleted_is_read_again(settings):
    assert conf.queue_name() == conf.QUEUE.default
    settings.SAFEUPDATES_QUEUE = "elsewhere"
    assert conf.queue_name() == "elsewhere"
    settings.SAFEUPDATES_QUEUE = "again"
    assert conf.queue_name() == "again"
    del settings.SAFEUPDATES_QUEUE
    assert conf.queue_name() == conf.QUEUE.default


def test_override_settings_is_seen_inside_and_undone_after():
    before = conf.max_clock_skew()
    with override_settings(SAFEUPDATES_MAX_CLOCK_SKEW=7):
        assert conf.max_clock_skew() == timedelta(seconds=7)
        with override_settings(SAFEUPDATES_MAX_CLOCK_SKEW=timedelta(minutes=1)):
            assert conf.max_clock_skew() == timedelta(minutes=1)
        assert conf.max_clock_skew() == timedelta(seconds=7)
    assert conf.max_clock_skew() == before


def test_a_setting_assigned_or_deleted_at_run_time_is_read_again():
    """Assigned to django.conf.settings directly (no override_settings), then deleted: each is seen."""
    from django.conf import settings as django_settings

    assert conf.job_timeout() == conf.JOB_TIMEOUT.default
    django_settings.SAFEUPDATES_JOB_TIMEOUT = 5
    try:
        assert conf.job_timeout() == 5
    finally:
        del django_settings.SAFEUPDATES_JOB_TIMEOUT
    assert conf.job_timeout() == conf.JOB_TIMEOUT.default


def test_a_setting_read_before_django_loads_its_settings_loads_them():
    """A getter may run before anything else read a setting (at a module's import, in a fresh worker)."""
    code = (
        "from django.conf import settings; from safeupdates import conf; assert not settings.configured; "
        "print(conf.relay_after(), conf.job_timeout())"
    )
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    run = subprocess.run(
        [sys.executable, "-c", code], env=environment, cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert (run.returncode, run.stdout, run.stderr) == (0, "0 60\n", "")  # tests.settings: RELAY_AFTER = 0


def docs_settings_table() -> list[str]:
    """The rows of the settings table of docs/deployment.md."""
    header = "| setting | default | meaning | a valid value |\n|---|---|---|---|\n"
    text = DEPLOYMENT.read_text()
    return text[text.index(header) + len(header) :].split("\n\n")[0].splitlines()


def shown_default(setting: conf.Setting) -> str:
    if setting.shown_default:
        return setting.shown_default
    value = setting.default
    return f"`{json.dumps(value) if isinstance(value, str | dict) else repr(value)}`"


def test_the_docs_settings_table_shows_every_setting_as_declared():
    """Every setting, in the declared order, with its default, meaning and valid values as conf declares them."""
    declared = [
        f"| `{s.name}` | {shown_default(s)} | {s.meaning} | {s.valid.format(default=s.default)} |"
        for s in conf.SETTINGS
    ]
    assert docs_settings_table() == declared


def test_the_default_of_stuck_after_is_the_one_the_docs_show():
    defaults = {setting.name: setting.default for setting in (conf.RELAY_AFTER, conf.RETRY)}
    with override_settings(**defaults):
        assert conf.stuck_after() == 141  # twice 30, 60, and 1 + 5 + 15
    assert conf.STUCK_AFTER.shown_default.endswith("(141)")


def test_every_setting_is_read_by_the_package():
    """A setting whose getters nothing in safeupdates calls (or passes on) is a setting that sets nothing."""
    package = Path(conf.__file__).parent
    getters: dict[str, set[str]] = {}  # setting constant -> the conf functions that read it
    used: set[str] = set()  # names of conf used outside their own function
    for path in package.rglob("*.py"):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_read" and path.name == "conf.py":
                    getters.setdefault(node.args[0].id, set()).add(function.name)  # type: ignore[attr-defined]
                elif isinstance(node, ast.Name) and path.name == "conf.py" and node.id != function.name:
                    used.add(node.id)
                elif isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "conf":
                    used.add(node.attr)
    declared = {name for name, value in vars(conf).items() if isinstance(value, conf.Setting)}
    assert {name for name in declared if not getters.get(name, set()) & used} == set()


def test_the_package_reads_settings_through_the_public_api():
    """No ``settings._wrapped`` or other internals of Django's LazySettings, which a release may change."""
    package = Path(conf.__file__).parent
    private = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in package.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and getattr(node.value, "id", None) == "settings"
        and node.attr.startswith("_")
    ]
    assert private == []


@pytest.mark.parametrize(
    ("retry", "backoff"),
    [
        ({"max": 5, "interval": [1, 5]}, 1 + 5 + 5 + 5 + 5),  # the last interval for every later retry, as RQ
        ({"max": 2, "interval": [1, 5, 15]}, 1 + 5),
        ({"max": 3, "interval": 4}, 12),
        ({"max": 3, "interval": []}, 0),
        ({"max": 0, "interval": [1]}, 0),
    ],
)
def test_stuck_after_counts_every_retry_s_wait_as_the_retries_take_it(settings, retry, backoff):
    """A request is stuck only once every retry's wait has passed: each wait as the backends take it
    (``delivery.retry_delay``, RQ's ``Retry``), not only the waits the list spells out."""
    from safeupdates import delivery

    settings.SAFEUPDATES_RETRY = retry
    settings.SAFEUPDATES_RELAY_AFTER = 30
    settings.SAFEUPDATES_JOB_TIMEOUT = 60
    assert sum(delivery.retry_delay(number) for number in range(retry["max"])) == backoff
    assert conf.stuck_after() == 2 * 30 + 60 + backoff
