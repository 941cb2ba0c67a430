"""``docs/testing-your-project.md`` runs as written, and the pytest plugin it describes
(``safeupdates.testing``) works as it says.

The page's blocks are written into the quick start's project (made once, as ``tests/test_quickstart.py``
makes it), which pytest's own ``pytester`` then tests in a pytest of its own (a subprocess): with RQ
delivery (``ASYNC: False``) and with ``SAFEUPDATES_DELIVERY = "tasks"`` on django-tasks-db's backend,
on SQLite and on PostgreSQL, with the plugin loaded by its entry point or named in ``pytest_plugins``.
What ``run_pending`` does in a corner (a row locked elsewhere, requests that keep coming, another kind of
request) is tested here, in this process.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import django
import environ
import pytest
from django.db import connection

from safeupdates import enqueue_update
from safeupdates.models import ProcessedRequest
from safeupdates.signals import request_applied
from safeupdates.testing import MAX_ROUNDS, RequestsStillPending, run_pending
from tests.docs_blocks import blocks, file_blocks
from tests.factories import ProfileFactory
from tests.test_quickstart import project_env, write_project, xdist_suffix
from tests.testapp.models import Profile
from tests.workers import RowLock

pytest_plugins = ["pytester"]

PAGE = "docs/testing-your-project.md"

# The page's tests need the tasks' apps and backend when the project delivers by tasks (docs/delivery.md).
TASKS_SETTINGS = f"""

# --- added by tests/test_testing_plugin.py: SAFEUPDATES_DELIVERY = "tasks" (docs/delivery.md) ---
INSTALLED_APPS += {["django_tasks"] if django.VERSION < (6, 0) else []!r} + ["django_tasks_db"]
TASKS = {{"default": {{"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}}}
SAFEUPDATES_DELIVERY = "tasks"
"""

# The project on Celery, as docs/delivery.md makes it: its broker is a real one, which the page's test settings
# must replace (a publish there would fail: the vhost does not exist).
CELERY_SETTINGS = """

# --- added by tests/test_testing_plugin.py: SAFEUPDATES_DELIVERY = "celery" (docs/delivery.md) ---
SAFEUPDATES_DELIVERY = "celery"
CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672/safeupdates_no_such_vhost"
CELERY_BROKER_CONNECTION_MAX_RETRIES = 0
"""

# Not the page's: a transactional test, whose commit delivers the request as the settings say.
COMMITTED = """
import pytest
from django.conf import settings

from safeupdates import enqueue_update

from .models import Profile


@pytest.mark.django_db(transaction=True)
def test_a_committed_request_is_delivered_as_the_settings_say(django_user_model, safeupdates_run_pending):
    profile = Profile.objects.create(user=django_user_model.objects.create_user("ada"))
    request = enqueue_update(profile, active=True)  # committed at once: its delivery runs
    if getattr(settings, "SAFEUPDATES_DELIVERY", "rq") == "tasks":
        from django_tasks_db.models import DBTaskResult

        assert DBTaskResult.objects.count() == 1  # queued for a db_worker, which the test does not run
        assert [r.request_id for r in safeupdates_run_pending()] == [request.request_id]
    elif getattr(settings, "SAFEUPDATES_DELIVERY", "rq") == "celery":
        assert settings.CELERY_BROKER_URL == "memory://"  # published into this process: nothing consumes it
        assert [r.request_id for r in safeupdates_run_pending()] == [request.request_id]
    else:
        assert safeupdates_run_pending() == []  # RQ ran the job at the commit (ASYNC: False)
    profile.refresh_from_db()
    assert profile.active is True
"""


@pytest.fixture(scope="module")
def quickstart_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick start's project, made once (on its SQLite file: the tests' databases are pytest-django's)."""
    root = tmp_path_factory.mktemp("quickstart")
    write_project(root, project_env(None))
    return root


def test_every_block_of_the_page_is_a_file_of_the_project():
    assert [(block.lang, block.file) for block in blocks(PAGE)] == [
        ("python", "mysite/test_settings.py"),
        ("ini", "pytest.ini"),
        ("python", "toggles/tests.py"),
        ("python", "toggles/test_pending.py"),
    ]


def inner_postgres() -> dict[str, Any]:
    """The PostgreSQL settings of the project under test: pytest-django there makes its test database,
    ``test_<the database of DATABASE_URL>[_gwN]_plugin`` (one per xdist worker), on the suite's server,
    and drops it at the end."""
    config = environ.Env.db_url_config(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/x"))
    return {"ENGINE": "django.db.backends.postgresql", **{k: v for k, v in config.items() if k != "ENGINE"}} | {
        "NAME": f"{config['NAME']}{xdist_suffix()}_plugin"
    }


def run_the_pages_tests(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    project: Path,
    *,
    delivery: str,
    database: str,
    conftest: str | None = None,
    autoload: bool = True,
    args: tuple[str, ...] = (),
) -> pytest.RunResult:
    """The page's files written into a copy of the quick start's project, and pytest run there."""
    shutil.copytree(project, pytester.path, dirs_exist_ok=True)
    for target, text in file_blocks(PAGE).items():
        (pytester.path / target).write_text(text)
    (pytester.path / "toggles" / "test_committed.py").write_text(COMMITTED)
    # The delivery is the project's (mysite/settings.py): the page's test settings read it.
    if delivery == "tasks":
        with (pytester.path / "mysite" / "settings.py").open("a") as file:
            file.write(TASKS_SETTINGS)
    if delivery == "celery":
        with (pytester.path / "mysite" / "settings.py").open("a") as file:
            file.write(CELERY_SETTINGS)
        celery_files = file_blocks("docs/delivery.md")
        for name in ("celery.py", "__init__.py"):
            text = celery_files[f"proj/{name}"].replace("proj", "mysite")
            (pytester.path / "mysite" / name).write_text(text)
    if conftest is not None:
        (pytester.path / "conftest.py").write_text(conftest)
    env = project_env(inner_postgres() if database == "postgresql" else None)
    for name in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    for name in ("PYTHONPATH", "QUICKSTART_REDIS_URL", "QUICKSTART_POSTGRES"):
        if name in env:
            monkeypatch.setenv(name, env[name])
    if not autoload:
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=300)


def needs(database: str) -> None:
    if database == "postgresql" and connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL)")


@pytest.mark.once
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_the_pages_tests_pass_with_rq_delivery(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, quickstart_project: Path, redis: Any, database: str
) -> None:
    needs(database)
    result = run_the_pages_tests(pytester, monkeypatch, quickstart_project, delivery="rq", database=database)
    result.assert_outcomes(passed=4)
    assert "django-safeupdates" in result.stdout.str()  # pytest's list of the plugins it loaded


@pytest.mark.once
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.parametrize("delivery", ["tasks", "celery"])
def test_the_pages_tests_pass_with_tasks_and_celery_delivery(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, quickstart_project: Path, database: str, delivery: str
) -> None:
    """Tasks and Celery delivery: the page's test settings, TestCase and fixture as written; a commit
    enqueues a task that nothing runs in the test (on Celery: into kombu's in-memory transport, never the
    project's broker), and the fixture applies the request all the same."""
    needs(database)
    result = run_the_pages_tests(pytester, monkeypatch, quickstart_project, delivery=delivery, database=database)
    result.assert_outcomes(passed=4)


@pytest.mark.once
@pytest.mark.parametrize(
    "conftest, args",
    [
        # Loaded by its entry point and named again: pytest finds it loaded, and loads it once.
        ('pytest_plugins = ["safeupdates.testing"]\n', ()),
        # Plugins not loaded by themselves: named in the root conftest.py, it is there.
        ('pytest_plugins = ["safeupdates.testing"]\n', ("-p", "pytest_django.plugin")),
    ],
    ids=["named-and-autoloaded", "named-only"],
)
def test_the_plugin_can_be_named_in_pytest_plugins(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, quickstart_project: Path, conftest: str, args: Any
) -> None:
    result = run_the_pages_tests(
        pytester,
        monkeypatch,
        quickstart_project,
        delivery="rq",
        database="sqlite",
        conftest=conftest,
        autoload=not args,
        args=(*args, "toggles/test_pending.py"),
    )
    result.assert_outcomes(passed=2)


@pytest.mark.once
def test_without_the_plugin_there_is_no_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, quickstart_project: Path
) -> None:
    """The control of the tests above: the page's tests pass because of the plugin."""
    result = run_the_pages_tests(
        pytester,
        monkeypatch,
        quickstart_project,
        delivery="rq",
        database="sqlite",
        args=("-p", "no:safeupdates.testing", "toggles/test_pending.py"),
    )
    result.assert_outcomes(errors=2)
    assert "fixture 'safeupdates_run_pending' not found" in result.stdout.str()


def test_the_entry_point_names_the_module():
    """``pytest_plugins = ["safeupdates.testing"]`` finds the plugin loaded only if the entry point has
    the module's name (under another name pluggy refuses to register the module twice)."""
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="pytest11") if e.value.startswith("safeupdates")]
    assert (entry.name, entry.value) == ("safeupdates.testing", "safeupdates.testing")


# -- run_pending in this process: what the page promises in its corners ---------------------------------


@pytest.mark.django_db
def test_run_pending_applies_every_record_and_sends_the_outcome_signals_in_a_test_that_never_commits() -> None:
    """In a test's transaction the jobs' on-commit callbacks would never run: run_pending runs them, so
    a receiver of request_applied sees each outcome, as it would beside a worker."""
    heard: list[Any] = []

    def receiver(sender: Any, pk: Any, fields: Any, **kwargs: Any) -> None:
        heard.append((pk, tuple(fields)))

    first, second = ProfileFactory(), ProfileFactory()
    older = enqueue_update(first, active=True)
    newer = enqueue_update(first, active=False)
    other = enqueue_update(second, newsletter=True)
    request_applied.connect(receiver, sender=Profile)
    try:
        settled = run_pending()
    finally:
        request_applied.disconnect(receiver, sender=Profile)

    assert [(r.request_id, r.status) for r in settled] == [
        (older.request_id, "stale"),
        (newer.request_id, "applied"),
        (other.request_id, "applied"),
    ]
    assert sorted(heard) == sorted([(first.pk, ("active",)), (second.pk, ("newsletter",))])
    assert run_pending() == []


@pytest.mark.django_db
def test_run_pending_goes_on_while_receivers_make_new_requests() -> None:
    profile = ProfileFactory()
    made: list[Any] = []

    def follow_up(sender: Any, pk: Any, fields: Any, **kwargs: Any) -> None:
        if "active" in fields:  # once: the follow-up changes the newsletter only
            made.append(enqueue_update(Profile, pk, newsletter=True))

    first = enqueue_update(profile, active=True)
    request_applied.connect(follow_up, sender=Profile)
    try:
        settled = run_pending()
    finally:
        request_applied.disconnect(follow_up, sender=Profile)
    assert [r.request_id for r in settled] == [first.request_id, made[0].request_id]
    profile.refresh_from_db()
    assert (profile.active, profile.newsletter) == (True, True)


@pytest.mark.django_db
def test_run_pending_stops_when_requests_keep_coming() -> None:
    profile = ProfileFactory()

    def again(sender: Any, pk: Any, fields: Any, **kwargs: Any) -> None:
        enqueue_update(Profile, pk, active=not Profile.objects.get(pk=pk).active)

    enqueue_update(profile, active=True)
    request_applied.connect(again, sender=Profile)
    try:
        with pytest.raises(RequestsStillPending, match=f"still pending after {MAX_ROUNDS} rounds"):
            run_pending()
    finally:
        request_applied.disconnect(again, sender=Profile)


@pytest.mark.django_db(transaction=True)
def test_run_pending_says_so_when_a_request_is_held_by_another_connection(postgres_only: None) -> None:
    request = enqueue_update(ProfileFactory(), active=True)
    lock = RowLock(ProcessedRequest, request.pk).start()  # as a worker that took it holds it
    try:
        with pytest.raises(RequestsStillPending, match="1 update request"):
            run_pending()
    finally:
        lock.release()
    assert [r.status for r in run_pending()] == ["applied"]


@pytest.mark.django_db
def test_run_pending_leaves_the_requests_of_the_job_tools_alone() -> None:
    task = ProcessedRequest.objects.create(kind=ProcessedRequest.Kind.TASK, key="refund:7")
    update = enqueue_update(ProfileFactory(), active=True)
    assert [r.request_id for r in run_pending()] == [update.request_id]
    task.refresh_from_db()
    assert task.status == "pending"


@pytest.mark.django_db(databases=["default", "tenant"])
def test_run_pending_applies_the_requests_of_the_database_it_is_given() -> None:
    here = enqueue_update(ProfileFactory(), active=True)
    there = enqueue_update(Profile.objects.db_manager("tenant").create(name="t"), using="tenant", active=True)
    assert [r.request_id for r in run_pending("tenant")] == [there.request_id]
    assert [r.request_id for r in run_pending()] == [here.request_id]
