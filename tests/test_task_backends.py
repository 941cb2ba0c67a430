"""SAFEUPDATES_DELIVERY = "tasks" on every kind of backend Django's Tasks framework can be configured
with (issue 47): it works, or ``manage.py check`` refuses it.

- Django's default ``ImmediateBackend`` runs the task at commit, in the process that committed: it works
  in a project without django-tasks-db (the delivery asked django-tasks-db's models before it looked at
  which backend runs, and every request stayed pending);
- ``DummyBackend`` never runs a task: refused (E024);
- django-tasks-db's backend without its app in ``INSTALLED_APPS``: refused (by its own check);
- the same delivery suite (a burst with duplicates and lost enqueues, the relay, the convergence check of
  tests/faults/harness.py) on the immediate backend, on django-tasks-db's with real ``db_worker``
  processes, on django-tasks-rq's with real ``rqworker`` processes and on django-tasks-celery's with real
  prefork ``celery worker`` processes on a RabbitMQ vhost of the test's own (django-tasks-celery needs
  Django 6.0+ and Python 3.12+: it runs in the tox envs of Django 6.0 and 6.1, and is skipped elsewhere).
"""

from __future__ import annotations

import importlib.util
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import django
import pytest
from django.core.checks import Error
from django.db import connection, transaction
from django.test import override_settings

from demo_project.processes import TaskWorkers
from safeupdates import checks, delivery, enqueue_update
from safeupdates.delivery import tasks as taskqueue
from safeupdates.jobs import relay
from safeupdates.models import ProcessedRequest
from tests import celery_harness
from tests.celery_harness import CeleryWorkers, RabbitVhost, rabbitmq_missing, web_app, worker_log_dir
from tests.factories import ProfileFactory
from tests.faults.harness import AUDIT_SQL, Burst, verify
from tests.projects import CORE_APPS, Project
from tests.testapp.models import Profile
from tests.workers import Workers, wait_until

_TASKS = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
#: The backport is an app on Django 5.2 (its own checks); on 6.x the framework is Django's.
_TASKS_APPS = [] if django.VERSION >= (6, 0) else ["django_tasks"]

PROJECT_MODELS = """
from django.db import models

from safeupdates.models import SafeUpdateModel


class Switch(SafeUpdateModel):
    active = models.BooleanField(default=False)
    safe_update_fields = ("active",)
"""

FIRST_TOGGLE = """
import django
django.setup()
from django.core.management import call_command
from django.db import transaction

call_command("migrate", verbosity=0)
from switches.models import Switch
from safeupdates import enqueue_update
from safeupdates.models import ProcessedRequest

switch = Switch.objects.create()
with transaction.atomic():
    request = enqueue_update(switch, active=True)
switch.refresh_from_db()
print("active", switch.active, ProcessedRequest.objects.get(pk=request.pk).status)
"""


def _project(tmp_path, settings_tail: str) -> Project:
    project = Project(tmp_path, [*CORE_APPS, *_TASKS_APPS, "switches"])
    project.app("switches", migrations=True, models=PROJECT_MODELS)
    with open(project.root / "project_settings.py", "a") as settings_file:
        settings_file.write('SAFEUPDATES_DELIVERY = "tasks"\n' + settings_tail)
    made = project.manage("makemigrations", "switches", "-v", "0", "--skip-checks")
    assert made.returncode == 0, made.stderr
    return project


@pytest.mark.once
def test_the_first_toggle_of_a_new_project_on_the_default_backend_is_applied(tmp_path):
    """A new project: ``SAFEUPDATES_DELIVERY = "tasks"``, no ``TASKS`` (Django's default backend, the
    immediate one), no django-tasks-db. Its first toggle is applied when the transaction commits, and
    ``manage.py check`` is clean."""
    project = _project(tmp_path, "")
    checked = project.manage("check")
    assert checked.returncode == 0, checked.stderr
    ran = project.python("-c", FIRST_TOGGLE)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["active", "True", "applied"], ran.stdout + ran.stderr


@pytest.mark.once
def test_a_project_on_the_database_backend_without_its_app_is_refused_at_check(tmp_path):
    """django-tasks-db's backend checks for its own app (its error, which safeupdates does not repeat);
    without the app no task row could be written, and nothing runs before the check passes."""
    project = _project(tmp_path, 'TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}\n')
    checked = project.manage("check")
    assert checked.returncode != 0
    assert "DatabaseBackend configured as django_tasks_db backend, but database app not installed" in checked.stderr
    assert "Insert 'django_tasks_db' in INSTALLED_APPS" in checked.stderr


DUMMY = {"BACKEND": f"{_TASKS}.backends.dummy.DummyBackend", "QUEUES": []}


def test_the_dummy_backend_is_refused_it_never_runs_a_task():
    with override_settings(
        SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="dummy", TASKS={**_tasks(), "dummy": DUMMY}
    ):
        assert checks.check_delivery() == [
            Error(
                "SAFEUPDATES_TASK_BACKEND is 'dummy', a DummyBackend: it keeps every task and never runs one, so "
                "no request would ever be applied.",
                hint="Use the ImmediateBackend in development and tests (tasks run when the transaction commits), "
                "and a backend with workers in production (django-tasks-db's DatabaseBackend, django-tasks-rq's "
                "RQBackend, django-tasks-celery's CeleryBackend).",
                id="safeupdates.E024",
            )
        ]


def _tasks() -> dict[str, dict[str, object]]:
    from django.conf import settings

    return dict(settings.TASKS)


def celery_tasks_missing() -> str | None:
    """Why django-tasks-celery's backend cannot be tried here (before RabbitMQ is asked), or None."""
    if importlib.util.find_spec("django_tasks_celery") is None:
        return (
            "django-tasks-celery is not installed: it needs Django 6.0+ and Python 3.12+ "
            "(tox -e py312-django60-postgres or py313-django61-postgres installs it)"
        )
    return None


def _with_celery_backend(app_path: str = "tests.celery_app.app") -> dict[str, dict[str, object]]:
    """``TASKS`` with django-tasks-celery's backend as ``"celery"`` (as tests/tasks_celery_settings.py has
    it), on the Celery app at ``app_path``."""
    from tests.tasks_celery_settings import TASKS_CELERY

    return {**_tasks(), "celery": {**TASKS_CELERY, "OPTIONS": {"CELERY_APP": app_path}}}


@pytest.mark.parametrize(
    ("alias", "lists_queued", "heartbeats"),
    [("default", False, False), ("db", True, False), ("rq", False, True), ("celery", False, False)],
)
def test_each_backend_says_what_it_can_tell(alias, lists_queued, heartbeats):
    """The capabilities the relay and the status page read, per backend, never its models: whether it can
    tell that a record's task waits, and whether its workers can be seen."""
    configured = {}
    if alias == "celery":
        missing = celery_tasks_missing()
        if missing:
            pytest.skip(missing)
        configured["TASKS"] = _with_celery_backend()
    with override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND=alias, **configured):
        chosen = delivery.backend()
        assert (chosen.can_list_queued, chosen.has_worker_heartbeats) == (lists_queued, heartbeats)


def test_the_celery_backend_defers_retries_and_is_told_how_its_workers_start():
    """django-tasks-celery's backend defers a task (Celery's ``eta``): a transient failure is retried by a
    deferred task, so no W020; the status page's advice is a ``celery worker`` that imports the apply task."""
    missing = celery_tasks_missing()
    if missing:
        pytest.skip(missing)
    with override_settings(
        SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="celery", TASKS=_with_celery_backend()
    ):
        assert checks.check_delivery() == []
        assert taskqueue.backend().supports_defer
        assert delivery.backend().worker_hint("default") == (
            "celery -A <your project> worker --include safeupdates.delivery.tasks -Q default "
            "(django-tasks-celery sends the queue named default to the Celery app's default queue)"
        )


# -- the same delivery suite on each backend ---------------------------------------------------------------

AUDIT_DROP = (
    "DROP TRIGGER IF EXISTS fault_audit ON testapp_profile; DROP FUNCTION IF EXISTS fault_audit(); "
    "DROP TABLE IF EXISTS fault_writes;"
)


@pytest.fixture
def audited(transactional_db, postgres_only):
    """The fault harness's audit trigger: every write to a profile row, recorded (at-most-once evidence)."""
    with connection.cursor() as cursor:
        cursor.execute(AUDIT_DROP)
        cursor.execute(AUDIT_SQL)
    yield
    with connection.cursor() as cursor:
        cursor.execute(AUDIT_DROP)


@contextmanager
def _celery_tasks(tmp_path: Path) -> Iterator[Workers]:
    """Deliver on django-tasks-celery's backend (``TASKS["celery"]``) in the block: this process publishes
    on a RabbitMQ vhost of its own through a Celery app of its own, and two real prefork workers
    (``celery -A tests.celery_app worker --pool prefork -c 2 -Q default``, settings
    tests/tasks_celery_settings.py) consume it. The vhost is deleted afterwards."""
    missing = rabbitmq_missing()
    if missing:
        pytest.skip(missing)
    vhost = RabbitVhost().create()
    app = web_app(vhost.url())
    celery_harness.WEB_APP = app
    workers = CeleryWorkers(worker_log_dir(tmp_path), name="tasks-celery")
    try:
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.tasks_celery_settings",
            "CELERY_BROKER_URL": vhost.url(),
            "SAFEUPDATES_DELIVERY": "tasks",
            "SAFEUPDATES_TASK_BACKEND": "celery",
        }
        workers.start(2, env=env)
        assert workers.wait_ready(), workers.logs()
        with override_settings(TASKS=_with_celery_backend("tests.celery_harness.WEB_APP")):
            yield workers
    finally:
        workers.stop()
        celery_harness.WEB_APP = None
        app.close()
        vhost.delete()


@contextmanager
def _delivering(alias: str, tmp_path: Path) -> Iterator[Workers | None]:
    """Deliver on backend ``alias`` in the block, with its real workers running: none for the immediate
    backend (the task runs at commit)."""
    with override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND=alias):
        if alias == "celery":
            with _celery_tasks(tmp_path) as celery_workers:
                yield celery_workers
            return
        pool: Workers | None = None
        if alias == "db":
            pool = TaskWorkers(tmp_path, backend="db", name="suite")
            pool.start(2)
        elif alias == "rq":
            pool = Workers(tmp_path, name="suite")
            pool.start(2, env={"SAFEUPDATES_DELIVERY": "tasks", "SAFEUPDATES_TASK_BACKEND": "rq"})
        try:
            yield pool
        finally:
            if pool is not None:
                pool.stop()


@pytest.mark.workers
@pytest.mark.parametrize(
    "alias",
    ["default", "db", "rq", "celery"],
    ids=["immediate", "django-tasks-db", "django-tasks-rq", "django-tasks-celery"],
)
def test_the_delivery_suite_converges_on_each_backend(alias, audited, redis, tmp_path, caplog):
    """240 toggles of 6 records; enqueues lost after commit for 40 of them, duplicate tasks for 40, the
    relay: last requested wins per field, nothing is lost, nothing is applied twice."""
    if alias == "celery" and (missing := celery_tasks_missing()):
        pytest.skip(missing)
    pks = [ProfileFactory().pk for _ in range(6)]
    burst = Burst(pks, seed=47)
    lost: list[uuid.UUID] = []
    with _delivering(alias, tmp_path) as workers:

        def lose_enqueues() -> None:
            # Committed, their tasks never enqueued (a crash between the commit and the enqueue).
            for _ in range(40):
                rid, pk = uuid.uuid4(), pks[len(lost) % len(pks)]
                with transaction.atomic():
                    enqueue_update(Profile, pk, request_id=rid, newsletter=bool(len(lost) % 2))
                    # What a process that dies between its commit and its on-commit work loses.
                    transaction.get_connection().run_on_commit.clear()
                burst.committed[rid] = (pk, "newsletter", bool(len(lost) % 2))
                lost.append(rid)

        def duplicates() -> None:
            for rid in sorted(burst.committed)[:40]:
                request = ProcessedRequest.objects.get(request_id=rid)
                record = f"{request.content_type_id}:{request.object_id}"
                task = taskqueue.apply_update.using(backend=alias)
                task.enqueue(str(request.request_id), record=record, attempt=0)

        burst.run(200, {60: lose_enqueues, 120: duplicates})

        def settled() -> bool:
            relay(0)
            return not ProcessedRequest.objects.filter(kind="update", status="pending").exists()

        assert wait_until(settled, 120, interval=0.5), workers.logs() if workers else ""
    outcome = verify(burst)
    assert outcome.violations() == {}, outcome
    assert outcome.requests == 240 and outcome.writes > 0
    # The lost ones reached their outcome through the relay alone (applied, or stale behind a newer one).
    statuses = set(ProcessedRequest.objects.filter(request_id__in=lost).values_list("status", flat=True))
    assert len(lost) == 40 and statuses <= {"applied", "stale"}, statuses


@pytest.mark.workers
def test_on_celery_a_transient_failure_is_retried_by_deferred_tasks_until_the_retries_are_spent(
    transactional_db, refusing_trigger, tmp_path
):
    """django-tasks-celery's backend defers a task (``run_after``, Celery's ``eta``): a serialization failure
    on every try is retried by a deferred task that the worker publishes, SAFEUPDATES_RETRY["max"] (2)
    times, then the request is failed. Three tasks in all reach the workers, no more."""
    if missing := celery_tasks_missing():
        pytest.skip(missing)
    refusing_trigger("40001")  # transient
    with _delivering("celery", tmp_path) as workers:
        assert workers is not None
        request = enqueue_update(ProfileFactory(), name="forbidden")  # autocommit: published at once
        log = ProcessedRequest.objects.filter(pk=request.pk)
        assert wait_until(lambda: log.get().status != "pending", 60), workers.logs()
        time.sleep(1.5)  # a retry that should not come would be received meanwhile
        logs = workers.logs()
    assert log.values_list("status", "attempts").get() == ("failed", 3)
    assert logs.count("Task safeupdates.delivery.tasks.apply_update[") >= 3
    assert logs.count(" received") == 3, logs


def test_a_backend_that_cannot_list_queued_work_is_redelivered_from_the_log_alone(
    db, redis, django_capture_on_commit_callbacks
):
    """django-tasks-rq's backend cannot say a record's task waits: the relay delivers every overdue record
    again (its report counts them enqueued, none "already queued"), and its summary says why."""
    profile = ProfileFactory()
    with override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="rq"):
        with django_capture_on_commit_callbacks(execute=True):
            enqueue_update(profile, active=True)
        first, second = relay(0), relay(0)
    assert (first.due, first.enqueued, first.waiting) == (1, 1, 0)
    assert (second.due, second.enqueued, second.waiting) == (1, 1, 0)
    assert first.summary().endswith(
        "; the delivery backend cannot tell which jobs are queued: every overdue record was delivered again "
        "(a duplicate job changes nothing)"
    ), first.summary()
