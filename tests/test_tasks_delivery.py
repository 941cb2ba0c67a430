"""SAFEUPDATES_DELIVERY = "tasks": the apply job as a task of Django's Tasks framework (issue 23).

In this process: the immediate backend (the task runs at commit), django-tasks-db's database backend
(rows in its task table, coalescing) and django-tasks-rq's (jobs in Redis). With real ``db_worker``
processes: the convergence of a burst through kills, duplicates and lost enqueues.
"""

from __future__ import annotations

import ast
import re
import shlex
import uuid
from datetime import timedelta
from typing import Any

import django_rq
import psycopg
import pytest
from django.contrib.contenttypes.models import ContentType
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone
from django_tasks_db.models import DBTaskResult
from rq import Worker

from demo_project.processes import TaskWorkers
from safeupdates import checks, delivery, enqueue_update
from safeupdates.contrib import check_tools_need_rq
from safeupdates.contrib.idempotent.decorators import idempotent
from safeupdates.delivery import tasks as taskqueue
from safeupdates.exceptions import InvalidUpdate
from safeupdates.jobs import relay
from safeupdates.models import ProcessedRequest
from tests.factories import ProfileFactory
from tests.faults.harness import AUDIT_SQL, Burst, verify
from tests.testapp import tasks as test_tasks
from tests.testapp.models import Profile
from tests.workers import ROOT, RowLock, lock_waiters, wait_until, worker_db_url

IMMEDIATE = override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="default")
DATABASE = override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="db")


def apply_tasks() -> list[DBTaskResult]:
    return list(DBTaskResult.objects.filter(task_path=taskqueue.APPLY_TASK).order_by("enqueued_at"))


@IMMEDIATE
def test_a_request_is_applied_by_a_django_task_after_commit(db, django_capture_on_commit_callbacks):
    profile = ProfileFactory(active=False)
    with django_capture_on_commit_callbacks(execute=True):
        request = enqueue_update(profile, active=True)
        assert not Profile.objects.get(pk=profile.pk).active  # not before the commit
    profile.refresh_from_db()
    request.refresh_from_db()
    assert profile.active and request.status == "applied"


@DATABASE
def test_the_task_carries_ids_never_the_changes(db, django_capture_on_commit_callbacks):
    profile = ProfileFactory()
    with django_capture_on_commit_callbacks(execute=True):
        request = enqueue_update(profile, name="secret value")
    [task] = apply_tasks()
    content_type = ContentType.objects.get_for_model(Profile)
    # With a tracer provider set (tests/test_tracing.py sets one for the session), also the trace context.
    task.args_kwargs["kwargs"].pop("trace", None)
    assert task.args_kwargs == {
        "args": [str(request.request_id)],
        "kwargs": {"record": f"{content_type.pk}:{profile.pk}", "attempt": 0, "using": "default"},
    }
    assert (task.status, task.backend_name, task.queue_name) == ("READY", "db", "default")
    assert "secret value" not in str(task.args_kwargs)


@DATABASE
def test_a_burst_of_one_record_costs_one_task_while_it_waits(db, django_capture_on_commit_callbacks):
    first, second = ProfileFactory(), ProfileFactory()
    for value in (True, False, True, False):
        with django_capture_on_commit_callbacks(execute=True):
            enqueue_update(first, active=value)
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_update(second, active=True)
    assert len(apply_tasks()) == 2
    # Claimed by a worker (RUNNING), it may have read the requests already: the next one gets a task.
    DBTaskResult.objects.filter(args_kwargs__kwargs__record__endswith=f":{first.pk}").update(status="RUNNING")
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_update(first, active=True)
    assert len(apply_tasks()) == 3


@DATABASE
def test_a_queue_the_backend_does_not_serve_is_refused(db):
    with pytest.raises(InvalidUpdate, match=r"queue 'nope' is not in the QUEUES of TASKS\['db'\]; pass one of: "):
        enqueue_update(ProfileFactory(), queue="nope", active=True)
    assert not ProcessedRequest.objects.exists()


@DATABASE
def test_an_enqueue_lost_after_commit_is_delivered_by_the_relay(db, django_capture_on_commit_callbacks):
    profile = ProfileFactory()
    with django_capture_on_commit_callbacks(execute=False):  # committed; its task never enqueued
        request = enqueue_update(profile, active=True)
    assert apply_tasks() == []
    report = relay(0)
    assert (report.due, report.enqueued, report.waiting) == (1, 1, 0)
    [task] = apply_tasks()
    assert task.args_kwargs["args"] == [str(request.request_id)]
    report = relay(0)  # the task waits: nothing more
    assert (report.due, report.enqueued, report.waiting) == (1, 0, 1)
    assert len(apply_tasks()) == 1


@IMMEDIATE
def test_the_relay_applies_through_the_immediate_backend(db, django_capture_on_commit_callbacks):
    profile = ProfileFactory(active=False)
    with django_capture_on_commit_callbacks(execute=False):
        enqueue_update(profile, active=True)
    assert relay(0).enqueued == 1
    profile.refresh_from_db()
    assert profile.active


@IMMEDIATE
@pytest.mark.django_db(transaction=True, databases=["default", "tenant"])
def test_a_tenants_request_is_applied_on_its_database_by_its_task():
    """A request of another database than ``default``: its task carries the alias, as an RQ job does, and
    applies it there; the same key in ``default`` is untouched. The relay redelivers it the same way."""
    home = Profile.objects.using("default").create(name="home", active=False)
    away = Profile.objects.using("tenant").create(pk=home.pk, name="away", active=False)
    request = enqueue_update(Profile, away.pk, using="tenant", active=True)  # autocommit: the task ran
    assert ProcessedRequest.objects.using("tenant").get(pk=request.pk).status == "applied"
    assert Profile.objects.using("tenant").get(pk=away.pk).active
    assert not Profile.objects.using("default").get(pk=home.pk).active
    assert not ProcessedRequest.objects.using("default").exists()
    with override_settings(SAFEUPDATES_TASK_BACKEND="db"):
        lost = enqueue_update(Profile, away.pk, using="tenant", active=False)
    DBTaskResult.objects.all().delete()  # its task is lost
    report = relay(0, using="tenant")
    assert (report.due, report.enqueued) == (1, 1)
    assert ProcessedRequest.objects.using("tenant").get(pk=lost.pk).status == "applied"
    assert not Profile.objects.using("tenant").get(pk=away.pk).active


def run_task(task: DBTaskResult) -> None:
    """Run one task row as a ``db_worker`` does (claim, run, record the result), in this process."""
    from django_tasks_db.management.commands.db_worker import Worker

    worker = Worker(
        queue_names=["*"],
        interval=0,
        batch=True,
        backend_name="db",
        startup_delay=False,
        max_tasks=None,
        worker_id="test",
        excluded_queue_names=[],
    )
    task.claim(worker.worker_id)
    worker.run_task(task)
    task.refresh_from_db()
    assert task.status == "SUCCESSFUL", task.traceback


@DATABASE
@pytest.mark.django_db(databases=["default", "tenant"])
@pytest.mark.parametrize("first", ["tenant", "default"])
def test_a_waiting_task_of_one_database_holds_no_request_of_another(django_capture_on_commit_callbacks, first):
    """The record's key (content type id and primary key) is the same in both databases: a task waiting
    for one database's record is not the task of the other's. Each request gets a task of its own, which
    applies it on its own database; a second request of either database then finds its own task waiting."""
    other = "default" if first == "tenant" else "tenant"
    home = Profile.objects.using("default").create(name="home", active=False)
    Profile.objects.using("tenant").create(pk=home.pk, name="away", active=False)
    types = {alias: ContentType.objects.db_manager(alias).get_for_model(Profile).pk for alias in (first, other)}
    assert types[first] == types[other]  # one key in both: the case where they could be confused

    def enqueue(using: str, **changes: Any) -> ProcessedRequest:
        with django_capture_on_commit_callbacks(using=using, execute=True):
            return enqueue_update(Profile, home.pk, using=using, **changes)

    waiting = enqueue(first, active=True)
    assert len(apply_tasks()) == 1
    request = enqueue(other, newsletter=True)
    tasks = {task.args_kwargs["kwargs"]["using"]: task for task in apply_tasks()}
    assert tasks.keys() == {first, other}, "the request of the other database got no task"
    assert tasks[first].args_kwargs["args"] == [str(waiting.request_id)]
    assert tasks[other].args_kwargs["args"] == [str(request.request_id)]
    assert {task.args_kwargs["kwargs"]["record"] for task in tasks.values()} == {f"{types[first]}:{home.pk}"}
    enqueue(first, name=f"{first} again")  # each finds its own task waiting
    enqueue(other, name=f"{other} again")
    assert len(apply_tasks()) == 2
    for task in tasks.values():
        run_task(task)
    fields = ("name", "active", "newsletter")
    assert Profile.objects.using(first).values(*fields).get(pk=home.pk) == dict(
        zip(fields, (f"{first} again", True, False), strict=True)
    )
    assert Profile.objects.using(other).values(*fields).get(pk=home.pk) == dict(
        zip(fields, (f"{other} again", False, True), strict=True)
    )
    assert set(ProcessedRequest.objects.using(first).values_list("status", flat=True)) == {"applied"}
    assert set(ProcessedRequest.objects.using(other).values_list("status", flat=True)) == {"applied"}


def _attempt(request: ProcessedRequest, number: int) -> taskqueue.Attempt:
    record = f"{request.content_type_id}:{request.object_id}"
    return taskqueue.Attempt(str(request.request_id), record, number, "t", "default")


@DATABASE
def test_a_transient_failure_is_retried_by_a_deferred_task(db, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        request = enqueue_update(ProfileFactory(), active=True)
    before = timezone.now()
    with taskqueue.running(_attempt(request, 0)):
        assert delivery.will_retry(request.request_id)
    [retry] = apply_tasks()
    assert retry.args_kwargs["kwargs"]["attempt"] == 1
    assert retry.run_after >= before  # SAFEUPDATES_RETRY's first interval, 0 s in the tests
    with taskqueue.running(_attempt(request, 1)):
        assert delivery.will_retry(request.request_id)
    assert apply_tasks()[-1].run_after >= before + timedelta(seconds=1)  # the second interval
    with taskqueue.running(_attempt(request, 2)):  # SAFEUPDATES_RETRY["max"] = 2: spent
        assert not delivery.will_retry(request.request_id)
    assert len(apply_tasks()) == 2


@IMMEDIATE
def test_without_deferred_runs_the_relay_retries_until_the_attempts_are_spent(db, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        request = enqueue_update(ProfileFactory(), active=True)
    log = ProcessedRequest.objects.filter(pk=request.pk)
    with taskqueue.running(_attempt(request, 0)):
        assert delivery.will_retry(request.request_id)
        log.update(attempts=2)
        assert not delivery.will_retry(request.request_id)


@IMMEDIATE
@pytest.mark.django_db(transaction=True)
def test_without_deferred_runs_a_request_failing_every_try_is_failed_once_its_retries_are_spent(refusing_trigger):
    """Each try fails on a transient error (the task runs at commit, then as the relay delivers it again):
    the request stays pending while its own attempts leave SAFEUPDATES_RETRY's 2 retries, then fails."""
    refusing_trigger("40001")  # a serialization failure: transient
    request = enqueue_update(ProfileFactory(), name="forbidden")  # autocommit: its task ran at once
    log = ProcessedRequest.objects.filter(pk=request.pk)
    assert log.values_list("status", "attempts").get() == ("pending", 1)
    relay(0)
    assert log.values_list("status", "attempts").get() == ("pending", 2)
    relay(0)
    assert log.values_list("status", "attempts").get() == ("failed", 3)


@IMMEDIATE
def test_signals_name_the_task_result_as_the_job(db, django_capture_on_commit_callbacks):
    from safeupdates.signals import request_applied

    seen = []

    def receiver(**kwargs):
        seen.append(kwargs["job_id"])

    request_applied.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            enqueue_update(ProfileFactory(), active=True)
    finally:
        request_applied.disconnect(receiver)
    assert len(seen) == 1 and seen[0]


# -- @idempotent on Django task functions -------------------------------------------------------------


@pytest.mark.parametrize("job", [test_tasks.refund, test_tasks.credit], ids=["below-task", "above-task"])
def test_idempotent_task_runs_its_body_once_per_key(db, job):
    profile = ProfileFactory(name="order-1", score=0)
    immediate = job.using(backend="default")
    first, second = immediate.enqueue("order-1"), immediate.enqueue("order-1")
    assert first.return_value.endswith("order-1")
    assert second.return_value == "duplicate"
    profile.refresh_from_db()
    assert profile.score == 1
    assert ProcessedRequest.objects.filter(kind="task", status="applied").count() == 1


# -- system checks --------------------------------------------------------------------------------------


def test_no_delivery_messages_with_rq():
    assert checks.check_delivery() == []
    assert check_tools_need_rq() == []


@DATABASE
def test_e021_tasks_framework_missing(uninstalled):
    uninstalled("safeupdates.delivery.tasks", "django.tasks", "django_tasks")
    assert checks.check_delivery() == [
        Error(
            'SAFEUPDATES_DELIVERY is "tasks", but Django\'s Tasks framework cannot be imported.',
            hint="Use Django 6.0 or later (django.tasks), or install the django-tasks backport on Django 5.2 "
            "(the [tasks] extra of django-safeupdates, or pip install django-tasks).",
            id="safeupdates.E021",
        )
    ]


@override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="missing")
def test_e022_backend_not_in_tasks():
    assert checks.check_delivery() == [
        Error(
            "SAFEUPDATES_TASK_BACKEND is 'missing', which is not a backend in TASKS.",
            hint="Add 'missing' to TASKS or set SAFEUPDATES_TASK_BACKEND to one of: db, default, rq.",
            id="safeupdates.E022",
        )
    ]


W021 = Warning(
    'SAFEUPDATES_DELIVERY is "tasks", but enqueue() with unique/serial/throttle and fan_out() deliver their jobs '
    "through RQ only.",
    hint="Keep django_rq, RQ_QUEUES and rqworker processes for them, or remove their apps from INSTALLED_APPS. "
    "@idempotent works on Django task functions.",
    id="safeupdates.W021",
)


@IMMEDIATE
def test_w020_backend_without_deferred_runs_and_w021_tools_that_need_rq():
    assert checks.check_delivery() == [
        Warning(
            "The task backend 'default' (ImmediateBackend) cannot defer a task (run_after): an apply task that "
            "fails on a transient database error is not retried with back-off.",
            hint="The relay (safeupdates_relay) delivers the request again, up to SAFEUPDATES_RETRY['max'] failed "
            "attempts (counted in the request's attempts); run it, or use a backend with deferred runs "
            "(django-tasks-db, django-tasks-rq, django-tasks-celery).",
            id="safeupdates.W020",
        )
    ]
    assert check_tools_need_rq() == [W021]


@override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="db", SAFEUPDATES_QUEUE="elsewhere")
def test_e023_queue_not_served_by_the_backend():
    assert checks.check_delivery() == [
        Error(
            "SAFEUPDATES_QUEUE is 'elsewhere', which is not in the QUEUES of TASKS['db'].",
            hint="Add 'elsewhere' to its QUEUES or set SAFEUPDATES_QUEUE to one of: default, fast, slow.",
            id="safeupdates.E023",
        )
    ]


@DATABASE
def test_only_w021_with_the_database_backend_and_no_rq_checks():
    assert checks.check_delivery() == []
    assert check_tools_need_rq() == [W021]
    with override_settings(SAFEUPDATES_QUEUE="missing"):  # E002 is about RQ_QUEUES: not with tasks
        assert [message.id for message in checks.check_delivery()] == ["safeupdates.E023"]


# -- real db_worker processes: the convergence property -------------------------------------------------

AUDIT_DROP = (
    "DROP TRIGGER IF EXISTS fault_audit ON testapp_profile; DROP FUNCTION IF EXISTS fault_audit(); "
    "DROP TABLE IF EXISTS fault_writes;"
)


@pytest.fixture
def audited(transactional_db, postgres_only):
    """The fault harness's audit trigger on the test database: every write to a profile row, recorded."""
    with connection.cursor() as cursor:
        cursor.execute(AUDIT_DROP)
        cursor.execute(AUDIT_SQL)
    yield
    with connection.cursor() as cursor:
        cursor.execute(AUDIT_DROP)


@pytest.fixture
def db_workers(tmp_path):
    pool = TaskWorkers(tmp_path, backend="db", name="tasks-test")
    yield pool
    pool.stop()


def _enqueue_task(request: ProcessedRequest, backend: str = "db") -> None:
    """A task of its own for ``request``, past the coalescing: a redelivery, a duplicate."""
    record = f"{request.content_type_id}:{request.object_id}"
    taskqueue.apply_update.using(backend=backend).enqueue(str(request.request_id), record=record, attempt=0)


@pytest.mark.workers
@DATABASE
def test_a_burst_converges_on_db_workers_through_kills_duplicates_and_lost_enqueues(audited, db_workers, caplog):
    """600 toggles of 8 records by 2 db_workers: a worker SIGKILLed in the middle of a task then replaced,
    enqueues lost after commit for 100 toggles (the task table locked), their tasks delivered again in
    reverse order, 60 duplicate tasks, and the relay. Last requested wins per field, nothing is lost,
    nothing is applied twice (the audit trigger's evidence: tests/faults/harness.py's verify)."""
    pks = [ProfileFactory().pk for _ in range(8)]
    content_type = ContentType.objects.get_for_model(Profile)
    db_workers.start(2)
    burst = Burst(pks, seed=23)
    tasks_table = DBTaskResult._meta.db_table
    locker: list[psycopg.Connection] = []
    window: dict[str, set[uuid.UUID]] = {}
    killed: list[str] = []

    def kill_mid_task() -> None:
        target, key = pks[0], f"{content_type.pk}:{pks[0]}"
        rid = uuid.uuid4()
        with RowLock(Profile, target):  # the task blocks in its UPDATE of the row
            with transaction.atomic():
                enqueue_update(Profile, target, request_id=rid, newsletter=True)
            burst.committed[rid] = (target, "newsletter", True)
            running = DBTaskResult.objects.filter(status="RUNNING", args_kwargs__kwargs__record=key)
            assert wait_until(running.exists, 30), db_workers.logs()
            worker_id = running.first().worker_ids[-1]
            index = next(i for i in db_workers.running() if db_workers.worker_id(i) == worker_id)
            db_workers.kill(index)
            killed.append(worker_id)
        db_workers.start(1)

    def lose_enqueues() -> None:
        conn = psycopg.connect(worker_db_url())
        conn.execute(f"LOCK TABLE {tasks_table} IN ACCESS EXCLUSIVE MODE")  # type: ignore[arg-type]
        locker.append(conn)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '50ms'")  # the enqueue after commit fails at once
        window["before"] = set(burst.committed)

    def deliver_lost_in_reverse() -> None:
        locker.pop().close()  # releases the table
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
        lost = set(burst.committed) - window["before"]
        for request in ProcessedRequest.objects.filter(request_id__in=lost).order_by("-version"):
            _enqueue_task(request)

    def duplicates() -> None:
        for rid in sorted(burst.committed)[:60]:
            _enqueue_task(ProcessedRequest.objects.get(request_id=rid))

    burst.run(600, {100: kill_mid_task, 200: lose_enqueues, 300: deliver_lost_in_reverse, 400: duplicates})

    def settled() -> bool:
        relay(0)
        pending = ProcessedRequest.objects.filter(kind="update", status="pending").exists()
        return not pending and not DBTaskResult.objects.filter(status="READY").exists()

    assert wait_until(settled, 120, interval=0.5), db_workers.logs()
    outcome = verify(burst)
    assert outcome.violations() == {}, (outcome, db_workers.logs())
    assert outcome.requests == 601 and outcome.writes > 0
    # The kill landed in the middle of a task: claimed by the killed worker, it never finished.
    assert DBTaskResult.objects.filter(status="RUNNING", worker_ids__contains=killed).count() == 1
    lost = [r for r in caplog.records if "could not take its task" in r.getMessage()]
    assert lost, "no enqueue was lost"


@DATABASE
def test_status_does_not_ask_redis_with_tasks_delivery(db):
    """A Redis-less project on Django tasks: safeupdates_status must not report Redis as a failure."""
    from safeupdates.status import collect

    status = collect()
    assert status.backend_error == "" and status.problems() == []
    # What the database backend can tell: the tasks waiting per queue, from its table; no workers.
    assert [(q.name, q.queued, q.workers) for q in status.queues] == [
        ("default", 0, None),
        ("fast", 0, None),
        ("slow", 0, None),
    ]


@pytest.mark.workers
# The tenant test database too: rqworker runs the system checks, which on Django 6.1 connect to every
# database of DATABASES (db_workers are started with --skip-checks).
@pytest.mark.django_db(transaction=True, databases=["default", "tenant"])
@override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="rq")
def test_a_burst_converges_on_django_tasks_rq_workers_through_kills_and_duplicates(audited, workers):
    """django-tasks-rq (no coalescing: a task per request) with real rqworkers: 300 toggles, a worker
    SIGKILLed in the middle of a task, tasks redelivered newest first, duplicates, and the relay."""
    pks = [ProfileFactory().pk for _ in range(6)]
    env = {"SAFEUPDATES_DELIVERY": "tasks", "SAFEUPDATES_TASK_BACKEND": "rq"}
    workers.start(2, env=env)
    burst = Burst(pks, seed=29)
    hit: list[bool] = []

    def kill_mid_task() -> None:
        # The tasks of the burst so far done first, so that the worker killed below is one whose task waits
        # on the row lock, not one finishing another record's task (which the kill would then miss).
        so_far = ProcessedRequest.objects.filter(request_id__in=list(burst.committed), status="pending")
        assert wait_until(lambda: not so_far.exists(), 120), workers.logs()
        assert wait_until(lambda: not any(workers.busy(i) for i in workers.running()), 30), workers.logs()
        rid = uuid.uuid4()
        with RowLock(Profile, pks[0]):
            with transaction.atomic():
                enqueue_update(Profile, pks[0], request_id=rid, newsletter=True)
            burst.committed[rid] = (pks[0], "newsletter", True)

            key = taskqueue.record_key(ContentType.objects.get_for_model(Profile).pk, str(pks[0]))

            def running_it() -> int | None:
                """The worker whose current job (RQ's own record of it) is a task of the locked record: this
                request's own, or an earlier task of the record still queued (a task per request, and each
                applies whatever of its record is pending when it starts), which takes this request and
                waits on the row lock just the same."""
                for worker in Worker.all(connection=django_rq.get_connection("default")):
                    job = worker.get_current_job()
                    if job is not None and (job.kwargs or {}).get("record") == key:
                        return next((i for i in workers.running() if workers.procs[i].pid == worker.pid), None)
                return None

            assert wait_until(lambda: bool(lock_waiters()) and running_it() is not None, 30), workers.logs()
            index = running_it()
            assert index is not None
            hit.append(workers.kill(index))
        workers.start(1, env=env)

    def reverse_and_duplicates() -> None:
        for request in ProcessedRequest.objects.filter(request_id__in=list(burst.committed)).order_by("-version")[:60]:
            _enqueue_task(request, backend="rq")

    burst.run(300, {80: kill_mid_task, 200: reverse_and_duplicates})

    def settled() -> bool:
        relay(0)
        return not ProcessedRequest.objects.filter(kind="update", status="pending").exists()

    assert wait_until(settled, 120, interval=0.5), workers.logs()
    outcome = verify(burst)
    assert outcome.violations() == {}, (outcome, workers.logs())
    assert outcome.requests == 301 and hit == [True]


def test_idempotent_above_a_task_decorated_at_run_time_is_the_same_task(db):
    """``@idempotent`` above ``@task`` returns a task of the same backend, whose function is guarded (the
    tasks of ``tests/testapp`` are decorated at import, where a mutation run's per-test tracing does not
    look)."""
    plain = test_tasks.task(backend="default")(test_tasks.debit)
    guarded = idempotent(key="inline-debit:{order}")(plain)
    assert type(guarded) is type(plain)
    assert (guarded.backend, guarded.name) == ("default", plain.name)
    profile = ProfileFactory(name="order-2", score=0)
    assert guarded.enqueue("order-2").return_value == "debited order-2"
    assert guarded.enqueue("order-2").return_value == "duplicate"
    profile.refresh_from_db()
    assert profile.score == 1


# -- docs/delivery.md ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_prune_example_of_the_docs_runs_as_written():
    """The docs' ``prune_db_task_results`` line, on the docs' TASKS: finished rows past their age go, on
    every queue; newer ones, failed ones younger than 30 days and rows left RUNNING stay."""
    docs = (ROOT / "docs" / "delivery.md").read_text()
    tasks = re.search(r"^TASKS = (\{.*\})$", docs, re.M)
    prune = re.search(r"```console\n(python manage.py prune_db_task_results .*)\n```", docs)
    assert tasks and prune
    command = shlex.split(prune[1])
    docs_settings = {"TASKS": ast.literal_eval(tasks[1]), "SAFEUPDATES_DELIVERY": "tasks"}
    with override_settings(**docs_settings, SAFEUPDATES_TASK_BACKEND="default"):
        now = timezone.now()
        rows = {
            "done 8 days ago": ("SUCCESSFUL", 8),
            "done yesterday": ("SUCCESSFUL", 1),
            "failed 10 days ago": ("FAILED", 10),
            "failed 31 days ago": ("FAILED", 31),
            "left running": ("RUNNING", 60),
        }
        for name, (status, days) in rows.items():
            result = taskqueue.apply_update.using(backend="default").enqueue(name)
            DBTaskResult.objects.filter(pk=result.id).update(
                status=status,
                started_at=now - timedelta(days=days),
                finished_at=None if status == "RUNNING" else now - timedelta(days=days),
            )
        on_another_queue = taskqueue.apply_update.using(backend="default").enqueue("another queue")
        DBTaskResult.objects.filter(pk=on_another_queue.id).update(
            status="SUCCESSFUL", queue_name="elsewhere", finished_at=now - timedelta(days=8)
        )
        assert command[:3] == ["python", "manage.py", "prune_db_task_results"]
        call_command(*command[2:])
    left = set(DBTaskResult.objects.values_list("args_kwargs__args__0", flat=True))
    assert left == {"done yesterday", "failed 10 days ago", "left running"}
