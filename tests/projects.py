"""Throwaway Django projects, run in a subprocess: what only a fresh process shows (the app registry as
``INSTALLED_APPS`` builds it, ``makemigrations``, an import at start-up). One settings module per case."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from django.conf import settings

from tests.workers import ROOT, subprocess_env

#: The core alone: what a project that uses none of the job tools of ``safeupdates.contrib`` installs.
CORE_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_rq", "safeupdates"]

SETTINGS = """
import os

SECRET_KEY = "throwaway"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = {installed!r}
DATABASES = {{
    "default": {{
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(os.path.dirname(__file__), "db.sqlite3"),
        "OPTIONS": {{"transaction_mode": "IMMEDIATE", "timeout": 20}},
    }}
}}
RQ_QUEUES = {{"default": {{"URL": os.environ["REDIS_URL"]}}}}
RQ = {{"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"}}  # as the README says (check W008)
"""


class Project:
    """A project in ``root``: apps written with :meth:`app`, commands run with :meth:`manage` / :meth:`python`."""

    def __init__(self, root: Path, installed: list[str]) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "project_settings.py").write_text(SETTINGS.format(installed=installed))

    def app(self, name: str, *, migrations: bool = False, **modules: str) -> None:
        """Write app ``name`` with ``modules`` (``models="..."``, ``apps="..."``) as the files' source."""
        package = self.root / name
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text("")
        if migrations:
            (package / "migrations").mkdir(exist_ok=True)
            (package / "migrations" / "__init__.py").write_text("")
        for module, source in modules.items():
            (package / f"{module}.py").write_text(textwrap.dedent(source))

    def python(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``python *args`` in the project's directory, on its settings, with this checkout importable."""
        env = subprocess_env(DJANGO_SETTINGS_MODULE="project_settings", REDIS_URL=settings.REDIS_URL)
        env["PYTHONPATH"] = f"{self.root}:{ROOT}"
        return subprocess.run(
            [sys.executable, *args], cwd=self.root, env=env, capture_output=True, text=True, timeout=timeout
        )

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``django-admin *args`` on the project's settings."""
        return self.python("-m", "django", *args)


def last_line(text: str) -> str:
    """The last non-empty line of ``text``: an uncaught exception's type and message."""
    return [line for line in text.splitlines() if line.strip()][-1]
