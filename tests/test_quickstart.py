"""``docs/quickstart.md`` runs as written: its blocks become a new project, driven end to end.

Each block marked ``<!-- file: PATH -->`` is written to PATH (``(append)``: appended), each command
of a ``<!-- run -->`` block is run, in the order of the page, in a temporary directory. Then the page
and the view are driven with Django's test client in a process of that project: first a click with no
worker running (the page says it is pending), then everything else while the ``rqworker
--with-scheduler`` of the page's "Run it" block applies the jobs; its relay makes a pass. The only
addition is this test's database and Redis, appended to the settings (below).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import environ
import pytest
from django.conf import settings
from django.db import connection

from tests.workers import kill_tree

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "quickstart.md"
_BLOCK = re.compile(r"(?:<!-- (?P<mark>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)

# once: the quick start's project has its own database (SQLite, or one made on DATABASE_URL's server).
pytestmark = [pytest.mark.workers, pytest.mark.once]

# Not part of the docs: point the project at this test's database and Redis database.
SETTINGS_FOR_THE_TEST = """

# --- added by tests/test_quickstart.py (not part of the docs) ---
import os as _os

RQ_QUEUES["default"]["URL"] = _os.environ["QUICKSTART_REDIS_URL"]
if _os.environ.get("QUICKSTART_POSTGRES"):
    import json as _json

    DATABASES = {"default": _json.loads(_os.environ["QUICKSTART_POSTGRES"])}
"""

# The start of both scripts below: the project, and the page's state as a browser sees it.
SETUP = r"""
import os, re, sys, time, uuid

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
import django

django.setup()
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment

from safeupdates.models import ProcessedRequest
from toggles.models import Profile

setup_test_environment()


def page_of(client):
    page = client.get("/settings/")
    assert page.status_code == 200, page
    html = page.content.decode()
    request_id = re.search(r'name="request_id" value="([0-9a-f-]{36})"', html).group(1)
    checked = re.findall(r'name="active" value="(true|false)" checked', html)
    saving = re.search(r"Saving: (\w+)\. Saved now: (\w+);", html)
    return request_id, checked, saving and saving.groups()
"""

# Before any worker runs: a click is pending, and the page says so (the value asked, and the value saved).
PENDING = r"""
grace = User.objects.create_user("grace", password="not-used")
client = Client()
client.force_login(grace)
request_id, checked, saving = page_of(client)
assert (checked, saving) == (["false"], None), (checked, saving)
response = client.post("/settings/toggle/", {"active": "true", "request_id": request_id})
assert response.status_code == 302, response
request_id, checked, saving = page_of(client)
assert (checked, saving) == (["true"], ("Active", "Inactive")), (checked, saving)
assert Profile.objects.get(user=grace).active is False
assert ProcessedRequest.objects.get().status == "pending"
print("pending shown")
"""

DRIVE = r"""
from tests.htmlforms import form_data
from toggles.services import deactivate, spend_credit
from toggles.webhooks import on_subscription_event

grace = Profile.objects.get(user__username="grace")
graces = ProcessedRequest.objects.filter(object_id=str(grace.pk))
log = ProcessedRequest.objects.exclude(object_id=str(grace.pk))  # this script's requests: ada's
user = User.objects.create_user("ada", password="not-used")
client = Client()

# Anonymous: sent to log in, nothing recorded.
response = client.post("/settings/toggle/", {"active": "true", "request_id": str(uuid.uuid4())})
assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), response
assert not log.exists()

client.force_login(user)
request_id, checked, saving = page_of(client)

# Strict input: a 400 for anything but true/false and a UUID, and nothing recorded.
for data in (
    {"request_id": request_id},
    {"active": "yes", "request_id": request_id},
    {"active": "on", "request_id": request_id},
    {"active": "True", "request_id": request_id},
    {"active": "true"},
    {"active": "true", "request_id": "not-a-uuid"},
):
    response = client.post("/settings/toggle/", data)
    assert response.status_code == 400, (data, response.status_code, response.content)
assert not log.exists()

# A double click: the same page's request id twice, recorded once.
for _ in range(2):
    response = client.post("/settings/toggle/", {"active": "true", "request_id": request_id})
    assert response.status_code == 302 and response["Location"] == "/settings/", response
assert log.count() == 1
# The same old page sent again with the other value: refused, not silently dropped.
response = client.post("/settings/toggle/", {"active": "false", "request_id": request_id})
assert response.status_code == 409, response

# A webhook event delivered twice: one request.
event = {"id": "evt_1", "type": "subscription.created", "username": "ada"}
on_subscription_event(event)
on_subscription_event(event)
assert log.count() == 2

# The worker applies both.
deadline = time.monotonic() + 60
while log.filter(status="pending").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
statuses = sorted(log.values_list("status", flat=True))
assert statuses == ["applied", "applied"], statuses
profile = Profile.objects.get(user=user)
assert (profile.active, profile.newsletter) == (True, True), profile.__dict__

# The first click, pending before the worker started, is applied: the page shows it saved.
while graces.filter(status="pending").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
assert list(graces.values_list("status", flat=True)) == ["applied"]
grace_client = Client()
grace_client.force_login(grace.user)
assert page_of(grace_client)[1:] == (["true"], None)

# The admin: a page opened before a toggle landed that changes that toggle too is refused, nothing
# written over; the same page's edit of another field lands beside the toggle.
root = User.objects.create_superuser("root", password="not-used")
admin = Client()
admin.force_login(root)
changelist = admin.get("/admin/toggles/profile/")
assert changelist.status_code == 200 and ">2 requests</a>" in changelist.content.decode(), changelist
url = f"/admin/toggles/profile/{profile.pk}/change/"
data = {**form_data(admin.get(url).content, "profile_form"), "_save": "Save"}
assert data["safeupdates_token"] and data["active"] == "on"
assert deactivate(profile.pk, uuid.uuid4()).applied  # lands while the form is open
unticked = {name: value for name, value in data.items() if name != "active"}
refused = admin.post(url, {**unticked, "credits": "5"})
assert refused.status_code == 200 and "was changed by someone else" in refused.content.decode(), refused
assert (Profile.objects.get(pk=profile.pk).active, Profile.objects.get(pk=profile.pk).credits) == (False, 0)
assert admin.post(url, {**data, "credits": "5"}).status_code == 302
assert (Profile.objects.get(pk=profile.pk).active, Profile.objects.get(pk=profile.pk).credits) == (False, 5)
Profile.objects.filter(pk=profile.pk).update(credits=0, active=True)

# Trusted code.
assert deactivate(profile.pk, uuid.uuid4()).applied
assert Profile.objects.get(pk=profile.pk).active is False
assert spend_credit(profile.pk) is False
Profile.objects.filter(pk=profile.pk).update(credits=1)
assert spend_credit(profile.pk) is True
assert Profile.objects.get(pk=profile.pk).credits == 0
print("quickstart driven")
"""


@dataclass
class Block:
    mark: str
    lang: str
    body: str


def blocks() -> list[Block]:
    return [Block(m["mark"] or "", m["lang"], m["body"]) for m in _BLOCK.finditer(QUICKSTART.read_text())]


def commands(block: Block) -> list[list[str]]:
    """The commands of a console block, as argv lists for this interpreter (comments dropped)."""
    argvs = []
    for line in block.body.splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        if argv[0] == "django-admin":
            argvs.append([sys.executable, "-m", "django", *argv[1:]])
        elif argv[0] == "python":
            argvs.append([sys.executable, *argv[1:]])
        else:
            raise AssertionError(f"a command the test cannot run: {line!r}")
    return argvs


def test_every_code_block_is_marked():
    """A block without a mark would not be run: it could drift from working code unnoticed."""
    unmarked = [b.body for b in blocks() if b.lang in ("python", "html") and not b.mark.startswith("file: ")]
    assert unmarked == []
    assert {b.mark for b in blocks() if b.lang == "console"} <= {"", "run", "run: background"}


def xdist_suffix() -> str:
    """``_gwN`` under pytest-xdist worker gwN, else nothing: a database this suite makes beside its test
    database is one per worker, as that one is."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return f"_{worker}" if worker else ""


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path):
    """The project's database: the docs' SQLite file, or a throwaway PostgreSQL database."""
    if request.param == "sqlite":
        yield None
        return
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL)")
    import psycopg

    config = environ.Env.db_url_config(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/x"))
    name = f"{config['NAME']}{xdist_suffix()}_quickstart"
    admin = {k: v for k, v in (("user", config.get("USER")), ("password", config.get("PASSWORD"))) if v}
    dsn = {"host": config.get("HOST") or "127.0.0.1", "port": config.get("PORT") or 5432, "dbname": "postgres"}
    with psycopg.connect(**dsn, **admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield {
        "ENGINE": "django.db.backends.postgresql",
        **{k: v for k, v in config.items() if k != "ENGINE"},
        "NAME": name,
    }
    with psycopg.connect(**dsn, **admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def project_env(database: dict[str, object] | None) -> dict[str, str]:
    """The environment of the quick start's project: this test's Redis database, and its PostgreSQL
    ``database`` (None: the project's own SQLite file)."""
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    env.update(PYTHONPATH=str(ROOT), QUICKSTART_REDIS_URL=settings.REDIS_URL)
    if database is not None:
        env["QUICKSTART_POSTGRES"] = json.dumps(database)
    return env


def write_project(root: Path, env: dict[str, str]) -> list[list[str]]:
    """The quick start's project in ``root``, as the page makes it: its files written, its commands run
    (startproject, makemigrations, migrate). Returns the commands of its "Run it" block (not run)."""
    background: list[list[str]] = []
    for block in blocks():
        if block.mark == "run":
            for argv in commands(block):
                run(argv, root, env)
        elif block.mark == "run: background":
            background = commands(block)
        elif block.mark.startswith("file: "):
            target, _, how = block.mark.removeprefix("file: ").partition(" ")
            path = root / target
            path.parent.mkdir(parents=True, exist_ok=True)
            if how == "(append)":
                with path.open("a") as file:
                    file.write("\n" + block.body)
                    if target.endswith("settings.py"):
                        file.write(SETTINGS_FOR_THE_TEST)
            else:
                path.write_text(block.body)
    return background


def test_the_quickstart_runs_as_written(tmp_path, database, redis):
    env = project_env(database)
    background = write_project(tmp_path, env)

    (tmp_path / "pending.py").write_text(SETUP + PENDING)
    pending = run([sys.executable, "pending.py"], tmp_path, env, check=False)
    assert pending.returncode == 0 and "pending shown" in pending.stdout, f"{pending.stdout}\n{pending.stderr}"

    worker_argv = next(argv for argv in background if "rqworker" in argv)
    assert "--with-scheduler" in worker_argv
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            worker_argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        (tmp_path / "drive.py").write_text(SETUP + DRIVE)
        driven = run([sys.executable, "drive.py"], tmp_path, env, check=False)
        assert driven.returncode == 0, f"{driven.stdout}\n{driven.stderr}\nworker:\n{log.read_text()}"
        assert "quickstart driven" in driven.stdout
    finally:
        worker.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(10)  # RQ's warm shutdown
        kill_tree(worker.pid, signal.SIGKILL)
        worker.wait()
    assert "database is locked" not in log.read_text()

    # The relay of the same block, one pass (its --interval would keep it running).
    relay = next(argv for argv in background if "safeupdates_relay" in argv)
    relay = relay[: relay.index("--interval")] if "--interval" in relay else relay
    run(relay, tmp_path, env)
    run([sys.executable, "manage.py", "check"], tmp_path, env)


def run(argv: list[str], cwd: Path, env: dict[str, str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    if check:
        assert done.returncode == 0, f"{shlex.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def test_the_readmes_quick_start_is_taken_from_the_tested_guide():
    """Every Python block of README.md's quick start stands, whole, in docs/quickstart.md, whose blocks
    the tests above run: the README cannot drift from working code."""
    readme = (ROOT / "README.md").read_text()
    guide = (ROOT / "docs" / "quickstart.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README.md's quick start has no Python block"
    for block in blocks:
        assert block in guide, f"README.md's quick start block is not in docs/quickstart.md:\n{block}"
