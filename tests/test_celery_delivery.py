"""SAFEUPDATES_DELIVERY = "celery": the apply job as a task of the project's Celery app (issue 43).

On real brokers only: a RabbitMQ vhost of the test's own, or a redis-server the test starts. In this
process: what a message carries, publishing after commit, an unreachable broker, the relay, the checks.
With real prefork workers (``celery -A tests.celery_app worker``): the apply, its retries, and the
convergence of bursts through kills, duplicates and broker faults (counted as the fault scenarios count:
:func:`tests.faults.harness.verify`).
"""

from __future__ import annotations

import datetime
import html as html_text
import json
import logging
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from django.contrib.contenttypes.models import ContentType
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.urls import reverse

from safeupdates import checks, delivery, enqueue_update
from safeupdates.contrib import check_tools_need_rq
from safeupdates.delivery import Delivery, QueueHealth
from safeupdates.delivery import celery as celery_backend_module
from safeupdates.exceptions import BackendUnavailable, InvalidUpdate
from safeupdates.jobs import relay
from safeupdates.models import ProcessedRequest, WaitingMessage
from safeupdates.status import collect
from tests.celery_harness import (
    CeleryWorkers,
    RabbitVhost,
    SupervisedCeleryWorkers,
    celery_delivery,
    own_vhost,
    queued,
    rabbitmq_missing,
    take_messages,
    worker_log_dir,
)
from tests.factories import ProfileFactory
from tests.faults.harness import AUDIT_SQL, Burst, join, run_in_thread, verify
from tests.servers import OwnRedis, TcpProxy, free_port
from tests.test_tracing import spans  # noqa: F401  (the tracing tests' fixture)
from tests.testapp.models import Profile
from tests.workers import ROOT, RowLock, subprocess_env, wait_until

APPLY = "safeupdates.jobs.apply_update"


# -- fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vhost() -> Iterator[RabbitVhost]:
    """A RabbitMQ vhost of this module's own (its queues are emptied between tests by taking messages)."""
    with own_vhost() as own:
        yield own


@pytest.fixture
def rabbit(vhost: RabbitVhost) -> Iterator[Celery]:
    """This process delivers through Celery on the module's vhost; the queue starts and ends empty."""
    with celery_delivery(vhost.url()) as app:
        take_messages(app)
        yield app
        take_messages(app)


AUDIT_DROP = (
    "DROP TRIGGER IF EXISTS fault_audit ON testapp_profile; DROP FUNCTION IF EXISTS fault_audit(); "
    "DROP TABLE IF EXISTS fault_writes;"
)


@pytest.fixture
def audited(transactional_db: None, postgres_only: None) -> Iterator[None]:
    """The fault harness's audit trigger on the test database: every write to a profile row, recorded."""
    with connection.cursor() as cursor:
        cursor.execute(AUDIT_DROP)
        cursor.execute(AUDIT_SQL)
    yield
    with connection.cursor() as cursor:
        cursor.execute(AUDIT_DROP)


@pytest.fixture
def celery_workers(tmp_path: Path) -> Iterator[CeleryWorkers]:
    pool = CeleryWorkers(worker_log_dir(tmp_path), name="celery-test")
    yield pool
    pool.stop()


def content_type_id() -> int:
    return int(ContentType.objects.get_for_model(Profile).pk)


# -- the message ----------------------------------------------------------------------------------------


def test_the_message_carries_ids_never_the_changes(db, rabbit, django_capture_on_commit_callbacks):
    profile = ProfileFactory()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        request = enqueue_update(profile, name="secret value")
    assert queued(rabbit) == 0  # nothing before the commit
    for callback in callbacks:
        callback()
    [message] = take_messages(rabbit)
    args, kwargs, _embed = message.decode()
    kwargs.pop("trace", None)  # with a tracer provider set (tests/test_tracing.py), the trace context too
    assert args == [str(request.request_id)]
    assert kwargs == {"content_type_id": content_type_id(), "object_id": str(profile.pk), "using": "default"}
    assert message.content_type == "application/json"
    assert message.headers["task"] == APPLY
    assert message.headers["retries"] == 0
    assert message.headers["timelimit"] == [60, None]  # SAFEUPDATES_JOB_TIMEOUT, Celery's hard limit
    assert message.delivery_info["routing_key"] == "default"
    assert "secret value" not in message.body if isinstance(message.body, str) else b"secret" not in message.body
    assert request.queue == "default"


def test_deliver_returns_the_id_of_the_task_it_published(db, rabbit):
    """As RQ's delivery returns its job's id: the task id is what Celery's tools (inspect, revoke, the
    worker's log) name the message by."""
    profile = ProfileFactory()
    request = ProcessedRequest.objects.create(
        content_type_id=content_type_id(), object_id=str(profile.pk), version=1, changes={"active": True}
    )
    found = delivery.backend().deliver(
        delivery.Delivery(str(request.request_id), content_type_id(), str(profile.pk), "default")
    )
    [message] = take_messages(rabbit)
    assert isinstance(found, str) and found == message.headers["id"]


def run_here(message: Any) -> str:
    """Run an apply message taken off the broker in this process, as a worker would (eagerly)."""
    args, kwargs, _embed = message.decode()
    return str(celery_backend_module.apply_update.apply(args=args, kwargs=kwargs, task_id=message.headers["id"]).get())


def waiting_notes() -> list[tuple[str, str]]:
    return list(WaitingMessage.objects.values_list("object_id", "task_id"))


def test_a_burst_of_one_record_costs_one_message(db, rabbit, django_capture_on_commit_callbacks):
    """A request whose record has an apply message waiting (published, not started) publishes nothing:
    that message reads it. Another record gets its own."""
    profile, other = ProfileFactory(), ProfileFactory()
    requests = []
    for value in (True, False, True):
        with django_capture_on_commit_callbacks(execute=True):
            requests.append(enqueue_update(profile, active=value))
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_update(other, active=True)
    messages = take_messages(rabbit)
    assert [message.decode()[1]["object_id"] for message in messages] == [str(profile.pk), str(other.pk)]
    assert sorted(waiting_notes()) == sorted((m.decode()[1]["object_id"], m.headers["id"]) for m in messages)
    assert run_here(messages[0]) == "1 applied, 2 stale"
    assert [ProcessedRequest.objects.get(pk=r.pk).status for r in requests] == ["stale", "stale", "applied"]
    assert waiting_notes() == [(str(other.pk), messages[1].headers["id"])]  # the started one's note is gone


def test_the_note_and_its_delete_are_one_statement_each_in_autocommit(transactional_db):
    """The note of a waiting message costs the delivery one round trip after the caller's commit, and its
    delete one at the start of the task: no BEGIN and COMMIT around them, no conflict to roll back."""
    profile = ProfileFactory()
    record = Delivery(str(uuid.uuid4()), content_type_id(), str(profile.pk), "default")
    seen: list[tuple[str, bool]] = []

    def note(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((sql.split()[0].upper(), connection.get_autocommit()))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(note):
        assert celery_backend_module._claim(record, "first") is True
        assert celery_backend_module._claim(record, "second") is False  # one waits already
        celery_backend_module._started("default", record.content_type_id, record.object_id)
        assert celery_backend_module._claim(record, "third") is True
    assert seen == [("INSERT", True), ("INSERT", True), ("DELETE", True), ("INSERT", True)]
    assert list(WaitingMessage.objects.values_list("task_id", flat=True)) == ["third"]
    with transaction.atomic():  # inside a caller's transaction: a savepoint, and the transaction stays usable
        assert celery_backend_module._claim(record, "fourth") is False
        assert WaitingMessage.objects.count() == 1


def test_a_note_that_fails_in_a_transaction_begun_by_hand_leaves_it_usable(transactional_db, postgres_only, caplog):
    """With autocommit turned off by hand (no ``atomic()`` block), a note the database refuses is published
    all the same, and the caller's transaction goes on: the statement ran in a savepoint."""
    profile = ProfileFactory()
    record = Delivery(str(uuid.uuid4()), content_type_id(), str(profile.pk), "default")
    table = WaitingMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION safeupdates_test_refuse_note() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'no note'; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER safeupdates_test_refuse_note BEFORE INSERT ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION safeupdates_test_refuse_note()"
        )
    try:
        transaction.set_autocommit(False)
        try:
            with caplog.at_level(logging.WARNING, logger="safeupdates"):
                assert celery_backend_module._claim(record, "first") is True  # published all the same
            assert "could not be noted" in caplog.text
            assert Profile.objects.filter(pk=profile.pk).exists()  # the transaction is usable
        finally:
            transaction.rollback()
            transaction.set_autocommit(True)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER safeupdates_test_refuse_note ON {table}")
            cursor.execute("DROP FUNCTION safeupdates_test_refuse_note()")


def test_an_eager_apply_leaves_the_callers_transaction_alone(db, rabbit, django_capture_on_commit_callbacks):
    """Run eagerly (``task.apply()``, ``task_always_eager``), the apply task runs inside the caller's
    transaction: it must not tidy that transaction's connection away as it tidies a worker's."""
    profile = ProfileFactory(active=False)
    with django_capture_on_commit_callbacks(execute=False):
        request = enqueue_update(profile, active=True)
    kwargs = {"content_type_id": content_type_id(), "object_id": str(profile.pk)}
    result = celery_backend_module.apply_update.apply(args=(str(request.request_id),), kwargs=kwargs)
    assert result.get() == "1 applied"
    profile.refresh_from_db()  # the same transaction, still usable
    assert profile.active and connection.in_atomic_block


def test_a_request_after_its_records_message_started_gets_a_follow_up(db, rabbit, django_capture_on_commit_callbacks):
    """A message that started may have read the pending requests already: the next request of its record
    publishes a message of its own, which again takes the requests after it."""
    profile = ProfileFactory()
    with django_capture_on_commit_callbacks(execute=True):
        first = enqueue_update(profile, active=True)
    [message] = take_messages(rabbit)
    run_here(message)
    with django_capture_on_commit_callbacks(execute=True):
        second = enqueue_update(profile, active=False)
    with django_capture_on_commit_callbacks(execute=True):
        third = enqueue_update(profile, newsletter=True)
    [follow_up] = take_messages(rabbit)
    assert follow_up.decode()[0] == [str(second.request_id)]
    run_here(follow_up)
    statuses = [ProcessedRequest.objects.get(pk=r.pk).status for r in (first, second, third)]
    assert statuses == ["applied", "applied", "applied"] and waiting_notes() == []


def test_the_relay_delivers_what_a_lost_message_left(db, rabbit, django_capture_on_commit_callbacks):
    """The broker lost the record's message (a Redis broker restarted empty): its note stays, so the next
    request publishes nothing, and the relay, which trusts the request log alone, delivers both."""
    profile = ProfileFactory()
    with django_capture_on_commit_callbacks(execute=True):
        first = enqueue_update(profile, active=True)
    take_messages(rabbit)  # lost
    with django_capture_on_commit_callbacks(execute=True):
        second = enqueue_update(profile, active=False)
    assert queued(rabbit) == 0 and len(waiting_notes()) == 1
    relay(0)
    [relayed] = take_messages(rabbit)
    run_here(relayed)
    assert [ProcessedRequest.objects.get(pk=r.pk).status for r in (first, second)] == ["stale", "applied"]
    assert waiting_notes() == []


def test_a_publish_that_failed_leaves_no_note(db, vhost, caplog):
    """The broker unreachable: the request is left for the relay, and its record has no message waiting,
    so its next request publishes again."""
    profile = ProfileFactory()
    with celery_delivery(vhost.url(free_port())):
        delivery.deliver_or_leave_for_relay(uuid.uuid4(), content_type_id(), str(profile.pk), "default", what="x")
    assert "the relay will deliver it" in caplog.text
    assert waiting_notes() == []


@override_settings(SAFEUPDATES_CELERY_QUEUE="fast")
def test_the_queue_setting_and_enqueue_update_queue_route_the_task(db, rabbit, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        first = enqueue_update(ProfileFactory(), active=True)
        second = enqueue_update(ProfileFactory(), active=True, queue="slow")
    assert (first.queue, second.queue) == ("fast", "slow")
    assert (queued(rabbit, "fast"), queued(rabbit, "slow"), queued(rabbit, "default")) == (1, 1, 0)
    take_messages(rabbit, "fast")
    take_messages(rabbit, "slow")


def test_a_queue_the_app_does_not_serve_is_refused(db, vhost):
    with celery_delivery(vhost.url(), task_create_missing_queues=False, task_queues=None) as app:
        app.conf.task_queues = []  # only the default queue ("default", CELERY_TASK_DEFAULT_QUEUE)
        with pytest.raises(
            InvalidUpdate,
            match=r"queue 'nope' is not in the task_queues of the Celery app, which creates no missing queues "
            r"\(task_create_missing_queues = False\); pass one of: default\.",
        ):
            enqueue_update(ProfileFactory(), queue="nope", active=True)
    assert not ProcessedRequest.objects.exists()


# -- the broker unreachable, and the relay ------------------------------------------------------------------


def test_an_unreachable_broker_leaves_the_request_to_the_relay(db, vhost, caplog, django_capture_on_commit_callbacks):
    """Published after commit to a broker that is down: one warning, no exception into the caller, no
    wait; the request stays pending. The relay then raises BackendUnavailable until the broker is back,
    and delivers it once it is."""
    proxy = TcpProxy("127.0.0.1", 5672)  # never started: nothing listens on its port
    with celery_delivery(vhost.url(proxy.port)) as app:
        profile = ProfileFactory()
        started = time.monotonic()
        with django_capture_on_commit_callbacks(execute=True):
            request = enqueue_update(profile, active=True)
        took = time.monotonic() - started
        [line] = [r.getMessage() for r in caplog.records if "relay will deliver it" in r.getMessage()]
        assert (
            f"request {request.request_id} (testapp.Profile pk={profile.pk}) is saved, but the Celery broker at "
            in line
        )
        assert f"amqp://guest:**@127.0.0.1:{proxy.port}/{vhost.name} is unreachable (OperationalError: " in line
        assert ProcessedRequest.objects.get(pk=request.pk).status == "pending"
        with pytest.raises(BackendUnavailable, match=r"^Celery broker unreachable at amqp://guest:\*\*@"):
            relay(0)
        proxy.start()
        try:
            report = relay(0)
            assert (report.due, report.enqueued, report.waiting) == (1, 1, 0)
            [message] = take_messages(app)
            assert message.decode()[0] == [str(request.request_id)]
        finally:
            proxy.stop()
    print(f"\nenqueue_update() with the broker down took {took * 1000:.0f} ms")


def test_the_relay_delivers_one_message_per_overdue_record(db, rabbit, django_capture_on_commit_callbacks):
    first, second = ProfileFactory(), ProfileFactory()
    with django_capture_on_commit_callbacks(execute=False):  # committed; their messages never published
        for value in (True, False):
            enqueue_update(first, active=value)
        enqueue_update(second, active=True)
    report = relay(0)
    assert (report.due, report.enqueued, report.waiting) == (2, 2, 0)
    assert queued(rabbit) == 2
    assert relay(0).enqueued == 2  # Celery cannot say they wait: the relay delivers from the log alone
    assert queued(rabbit) == 4


# -- the running task -------------------------------------------------------------------------------------


def _running(retries: int) -> celery_backend_module._Running:
    return celery_backend_module._Running(celery_backend_module.RunningJob("t1", "default"), retries)


def _transient() -> Exception:
    from django.db import OperationalError

    return OperationalError("the connection was lost")


@pytest.mark.parametrize(("retries", "expected"), [(0, True), (1, True), (2, False)])
@override_settings(SAFEUPDATES_DELIVERY="celery")
def test_will_retry_while_transient_errors_have_retries_left(retries, expected):
    """SAFEUPDATES_RETRY["max"] = 2 in the tests: the first run and its first retry will run again."""
    from safeupdates.delivery import current_job_id

    assert current_job_id() is None
    with celery_backend_module._running(_running(retries)):
        assert current_job_id() == "t1"  # what outcome signals carry as job_id
        try:
            raise _transient()
        except Exception:
            assert delivery.will_retry(uuid.uuid4()) is expected


def run_as_a_worker(app: Celery, message: Any) -> None:
    """Run a message taken off the broker as a Celery worker runs it (its ``Request``, traced), in this
    process: a retry the task asks for is published to the broker as a worker's would be."""
    from celery.worker.request import Request

    Request(message, app=app, task=app.tasks[APPLY], hostname="retry-timing@test").execute()


def _eta(message: Any) -> datetime.datetime | None:
    eta = message.headers.get("eta")
    return None if eta is None else datetime.datetime.fromisoformat(eta)


@pytest.mark.django_db(transaction=True)
@override_settings(SAFEUPDATES_RETRY={"max": 3, "interval": [5, 30, 120]})
def test_each_retry_is_published_with_the_back_off_of_its_number(refusing_trigger, rabbit):
    """A serialization failure (transient) on every try: the retry Celery publishes carries an ETA of the
    back-off of its number (SAFEUPDATES_RETRY's interval: 5 s, 30 s, then 120 s) after the try that failed,
    read off the broker; a retry published with no back-off (or the same one every time) is not."""
    refusing_trigger("40001")
    request = enqueue_update(ProfileFactory(), name="forbidden")  # autocommit: published at once
    [message] = take_messages(rabbit)
    assert message.headers["retries"] == 0 and _eta(message) is None
    for number, back_off in enumerate([5, 30, 120]):
        before = datetime.datetime.now(datetime.UTC)
        run_as_a_worker(rabbit, message)
        after = datetime.datetime.now(datetime.UTC)
        [message] = take_messages(rabbit)  # the retry, as the broker holds it
        assert message.headers["retries"] == number + 1
        eta = _eta(message)
        assert eta is not None, f"retry {number + 1} was published with no back-off"
        delay = datetime.timedelta(seconds=back_off)
        assert before + delay <= eta <= after + delay, (number, eta - before)
    log = ProcessedRequest.objects.filter(pk=request.pk)
    assert log.values_list("status", "attempts").get() == ("pending", 3)
    run_as_a_worker(rabbit, message)  # the last try: no retry left
    assert take_messages(rabbit) == []
    assert log.values_list("status", "attempts").get() == ("failed", 4)


@override_settings(SAFEUPDATES_DELIVERY="celery")
def test_bad_data_and_a_failed_argument_are_never_retried():
    from django.db import IntegrityError

    with celery_backend_module._running(_running(0)):
        try:
            raise IntegrityError("a constraint")
        except Exception:
            assert not delivery.will_retry(uuid.uuid4())
        delivery.fail_without_retry()
        try:
            raise _transient()
        except Exception:
            assert not delivery.will_retry(uuid.uuid4())
    assert not delivery.will_retry(uuid.uuid4())  # outside a task


# -- system checks --------------------------------------------------------------------------------------


def test_e020_names_the_three_deliveries():
    with override_settings(SAFEUPDATES_DELIVERY="sqs"):
        assert checks.check_delivery() == [
            Error(
                "SAFEUPDATES_DELIVERY = 'sqs' is not valid. It sets how apply jobs are delivered.",
                hint='Set it to "rq" (the default: RQ through django-rq), "tasks" (Django\'s Tasks framework, on the '
                'TASKS backend named by SAFEUPDATES_TASK_BACKEND) or "celery" (the project\'s Celery app, '
                "SAFEUPDATES_CELERY_APP).",
                id="safeupdates.E020",
            )
        ]


CELERY = override_settings(SAFEUPDATES_DELIVERY="celery")


@CELERY
def test_the_suites_celery_app_passes_the_checks_and_rq_checks_are_silent():
    """tests.celery_app, made current by tests/__init__.py as a Django project does (the default
    SAFEUPDATES_CELERY_APP): it registers the apply task; the RQ checks have nothing to say."""
    assert checks.check_delivery() == []
    with override_settings(SAFEUPDATES_QUEUE="missing"):  # E002 is about RQ_QUEUES: not with Celery
        assert "safeupdates.E002" not in {message.id for message in checks.check_delivery()}


@CELERY
def test_e025_celery_not_installed(uninstalled):
    uninstalled("safeupdates.delivery.celery", "celery")
    assert checks.check_delivery() == [
        Error(
            'SAFEUPDATES_DELIVERY is "celery", but Celery cannot be imported.',
            hint="Install it with its Redis support (the [celery] extra of django-safeupdates, or pip install "
            '"celery[redis]"), or set '
            'SAFEUPDATES_DELIVERY to "rq" or "tasks".',
            id="safeupdates.E025",
        )
    ]


E026_HINT = (
    "Name your project's Celery app (SAFEUPDATES_CELERY_APP = 'proj.celery.app'), or import it in your project "
    "package's __init__.py, as Celery's Django guide does, so that it is Celery's current app (the default, "
    "'celery.current_app')."
)

#: Celery's fallback app, which celery.current_app gives when no app was created: built here as Celery does.
FALLBACK = Celery("default", fixups=[], set_as_current=False)
NOT_AN_APP = object()


@pytest.mark.parametrize(
    ("path", "found"),
    [
        ("tests.nowhere.app", "cannot be imported (No module named 'tests.nowhere')"),
        ("tests.test_celery_delivery.NOT_AN_APP", "is object, not a Celery app"),
        (
            "tests.test_celery_delivery.FALLBACK",
            "is Celery's fallback app: no Celery app of the project was created before it was asked for",
        ),
    ],
)
def test_e025_no_celery_app(path, found):
    with override_settings(SAFEUPDATES_DELIVERY="celery", SAFEUPDATES_CELERY_APP=path):
        assert checks.check_delivery() == [
            Error(f"SAFEUPDATES_CELERY_APP is {path!r}, which {found}.", hint=E026_HINT, id="safeupdates.E026")
        ]


#: An app on which another task took the apply task's name before safeupdates' registered.
CLASHING = Celery("clashing", set_as_current=False)
CLASHING.conf.task_default_queue = "default"


@CLASHING.task(name=APPLY, shared=False)
def _not_ours(request_id: str) -> None:
    """Someone's own task under safeupdates' name."""


@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")  # what E027 is about
def test_e026_another_task_under_the_apply_tasks_name():
    with override_settings(SAFEUPDATES_DELIVERY="celery", SAFEUPDATES_CELERY_APP="tests.test_celery_delivery.CLASHING"):
        assert checks.check_delivery() == [
            Error(
                "The Celery app 'clashing' has another task (tests.test_celery_delivery._not_ours) under the name "
                "'safeupdates.jobs.apply_update', which safeupdates' apply task must have.",
                hint="Let safeupdates register it: keep 'safeupdates' in INSTALLED_APPS (its app config imports "
                "safeupdates.delivery.celery with celery delivery), and rename any task of yours with that name.",
                id="safeupdates.E027",
            )
        ]


def _app_with(**config) -> Celery:
    app = Celery("configured", set_as_current=False)
    app.conf.update({"task_default_queue": "default", **config})  # as tests.settings configures it
    return app


CONFIGURED: Celery | None = None


@pytest.fixture
def configured() -> Iterator[Callable[..., list]]:
    """Run the checks on a Celery app with the given configuration."""
    global CONFIGURED

    def check(**config) -> list:
        global CONFIGURED
        CONFIGURED = _app_with(**config)
        path = "tests.test_celery_delivery.CONFIGURED"
        with override_settings(SAFEUPDATES_DELIVERY="celery", SAFEUPDATES_CELERY_APP=path):
            return checks.check_delivery()

    yield check
    CONFIGURED = None


def test_e027_json_not_accepted_and_w022_pickle(configured):
    assert configured(accept_content=["pickle"], task_serializer="pickle") == [
        Error(
            "The Celery app 'configured' accepts ['pickle'] (accept_content), not JSON: its workers would refuse "
            "every apply task, whose messages are JSON.",
            hint="Add 'json' to accept_content (CELERY_ACCEPT_CONTENT with the CELERY settings namespace).",
            id="safeupdates.E028",
        ),
        Warning(
            "The Celery app 'configured' allows pickle (accept_content and task_serializer): anyone who can publish "
            "to its broker can run code in its workers.",
            hint="Use JSON: accept_content = ['json'], task_serializer = 'json' (Celery's defaults). safeupdates' "
            "tasks are JSON whatever these say.",
            id="safeupdates.W022",
        ),
    ]
    assert configured(accept_content=["json"], task_serializer="pickle")[0].msg.endswith(
        "allows pickle (task_serializer): anyone who can publish to its broker can run code in its workers."
    )
    assert configured(accept_content=["json", "application/x-python-serialize"]) != []
    assert configured(accept_content=["application/json"]) == []


W023_HINT = "(CELERY_BROKER_TRANSPORT_OPTIONS with the CELERY settings namespace), or lower SAFEUPDATES_JOB_TIMEOUT."


def test_w023_a_redis_visibility_timeout_shorter_than_the_longest_apply(configured):
    """The longest apply: SAFEUPDATES_JOB_TIMEOUT (60 s by default) after the longest retry back-off (1 s in
    the tests' SAFEUPDATES_RETRY)."""
    redis = "redis://127.0.0.1:1/0"
    assert configured(broker_url=redis, broker_transport_options={"visibility_timeout": 30}) == [
        Warning(
            "The Celery broker is Redis with a visibility_timeout of 30 s, not more than the longest apply task "
            "(61 s: SAFEUPDATES_JOB_TIMEOUT 60 s, after a retry's back-off of up to 1 s): Redis would deliver its "
            "message again while the first delivery still runs.",
            hint="Set broker_transport_options = {'visibility_timeout': 122} or more " + W023_HINT,
            id="safeupdates.W023",
        )
    ]
    assert configured(broker_url=redis, broker_transport_options={"visibility_timeout": 62}) == []
    assert configured(broker_url=redis) == []  # kombu's default, an hour
    with override_settings(SAFEUPDATES_JOB_TIMEOUT=3600):
        assert [m.id for m in configured(broker_url=redis)] == ["safeupdates.W023"]
    amqp = "amqp://guest@127.0.0.1:1//"
    assert configured(broker_url=amqp, broker_transport_options={"visibility_timeout": 1}) == []


def test_w024_a_queue_no_default_worker_consumes(configured):
    """Without SAFEUPDATES_CELERY_QUEUE or SAFEUPDATES_QUEUE, apply tasks go to the app's own default queue,
    which every worker consumes; a queue set to another one is a queue a worker started without -Q misses."""
    assert configured(task_default_queue="celery") == []
    with override_settings(SAFEUPDATES_QUEUE="default"):
        assert configured(task_default_queue="celery") == [
            Warning(
                "Apply tasks go to the Celery queue 'default' (SAFEUPDATES_CELERY_QUEUE, else SAFEUPDATES_QUEUE), "
                "which the Celery app 'configured' neither uses by default (task_default_queue 'celery') nor "
                "declares in task_queues: a worker started without -Q never consumes it.",
                hint="Start the workers with -Q default (or -Q default,celery), or set SAFEUPDATES_CELERY_QUEUE = "
                "'celery'.",
                id="safeupdates.W024",
            )
        ]
        with override_settings(SAFEUPDATES_CELERY_QUEUE="celery"):
            assert configured(task_default_queue="celery") == []
        from kombu import Queue

        assert configured(task_default_queue="celery", task_queues=[Queue("celery"), Queue("default")]) == []


@CELERY
def test_w021_tools_that_need_rq():
    assert check_tools_need_rq() == [
        Warning(
            'SAFEUPDATES_DELIVERY is "celery", but enqueue() with unique/serial/throttle and fan_out() deliver their '
            "jobs through RQ only.",
            hint="Keep django_rq, RQ_QUEUES and rqworker processes for them, or remove their apps from "
            "INSTALLED_APPS. @idempotent works on Celery task functions.",
            id="safeupdates.W021",
        )
    ]


#: What the admin's status page shows where the backend cannot tell.
NOT_TOLD = "\u2014"


# -- safeupdates_status ---------------------------------------------------------------------------------


def test_status_shows_the_celery_queue(db, rabbit, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_update(ProfileFactory(), active=True)
    status = collect()
    assert [(h.name, h.queued, h.workers) for h in status.queues] == [("default", 1, 0)]
    assert status.backend_error == ""
    # The record waits for the relay once its request has been pending for SAFEUPDATES_RELAY_AFTER.
    assert status.relay_due == 1 and status.relay_after == 0
    with override_settings(SAFEUPDATES_RELAY_AFTER=60):
        assert collect().relay_due == 0
    # RabbitMQ counts the queue's consumers: none, with a request pending on it, is a problem.
    assert status.problems() == [
        "queue 'default': 1 request(s) pending, and no worker is registered on it (no worker consumes it: none "
        "runs, or none was started with -Q for it): start or restart one: celery -A tests.celery_harness worker -Q "
        "default."
    ]


def test_a_request_pending_on_a_queue_no_worker_consumes_is_a_problem_at_once(
    db, rabbit, django_capture_on_commit_callbacks
):
    """Not only the apply tasks' default queue: every queue with pending requests is asked for its
    consumers, so a request routed to a queue that no worker was started with -Q for is flagged at once,
    not after SAFEUPDATES_STUCK_AFTER."""
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_update(ProfileFactory(), active=True, queue="toggles")
    snapshot = collect()
    assert [(h.name, h.queued, h.workers) for h in snapshot.queues] == [("default", 0, 0), ("toggles", 1, 0)]
    assert snapshot.problems() == [
        "queue 'toggles': 1 request(s) pending, and no worker is registered on it (no worker consumes it: none "
        "runs, or none was started with -Q for it): start or restart one: celery -A tests.celery_harness worker -Q "
        "toggles."
    ]
    take_messages(rabbit, "toggles")


def test_the_status_text_counts_consumers_without_a_busy_count(db, rabbit):
    """Celery tells how many consume a queue, not how many are busy: no "None busy"."""
    from safeupdates.management.commands.safeupdates_status import render

    snapshot = collect()
    snapshot.queues = [QueueHealth(name="default", queued=3, workers=2)]
    assert "Queue default: 3 queued; 2 worker(s)" in render(snapshot, [])
    assert not [line for line in render(snapshot, []) if "None" in line]


def test_the_admin_status_page_shows_the_celery_queue(db, rabbit, admin_client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_update(ProfileFactory(), active=True)
    html = admin_client.get(reverse("admin:safeupdates_processedrequest_status")).content.decode()
    assert "<strong>Unhealthy</strong>" in html and "no worker consumes it" in html
    # Its depth and its consumers; what Celery cannot tell is shown as such, never as "None" or "none".
    [row] = re.findall(r'<table id="safeupdates-queues">.*?<tbody>\s*(<tr>.*?</tr>)', html, re.S)
    cells = [html_text.unescape(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
    assert cells == ["default", "1", NOT_TOLD, NOT_TOLD, "0", NOT_TOLD, NOT_TOLD], row


def test_status_says_when_the_broker_cannot_be_asked(db, vhost):
    with celery_delivery(vhost.url(free_port())):
        status = collect()
    assert status.queues == []
    assert status.backend_error.startswith("Celery broker unreachable at amqp://guest:**@127.0.0.1:")
    assert status.problems() == [f"the Celery broker cannot be asked: {status.backend_error}"]


# -- real prefork workers -------------------------------------------------------------------------------

#: The brokers of the worker tests: a RabbitMQ vhost of the test's own, or a redis-server it starts.
BROKERS = ["rabbitmq", "redis"]


@pytest.fixture
def broker(request, tmp_path) -> Iterator[Broker]:
    """The broker a worker test runs on (parametrize ``broker`` with :data:`BROKERS`)."""
    kind = request.param
    if kind == "rabbitmq":
        missing = rabbitmq_missing()
        if missing:
            pytest.skip(missing)
        own = RabbitVhost().create()
        try:
            yield Broker(kind, own.url(), vhost=own)
        finally:
            own.delete()
    else:
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not on PATH (install Redis)")
        server = OwnRedis().start()
        try:
            yield Broker(kind, server.url, redis=server)
        finally:
            server.destroy()


class Broker:
    """A test's own broker: a RabbitMQ vhost or a redis-server; ``url`` is the direct address."""

    def __init__(self, kind: str, url: str, *, vhost: RabbitVhost | None = None, redis: OwnRedis | None = None):
        self.kind, self.url, self.vhost, self.redis = kind, url, vhost, redis
        self.proxy: TcpProxy | None = None

    def through_proxy(self) -> str:
        """Start a TCP proxy in front of the broker (the test cuts it off with ``proxy.stop()``); the URL
        through it."""
        port = 5672 if self.vhost is not None else self.redis.port  # type: ignore[union-attr]
        self.proxy = TcpProxy("127.0.0.1", port).start()
        if self.vhost is not None:
            return self.vhost.url(self.proxy.port)
        return f"redis://127.0.0.1:{self.proxy.port}/0"


def worker_env(broker_url: str, name: str = "celery", **extra: str) -> dict[str, str]:
    """The environment of a worker (or relay, or beat) on ``broker_url``; its database connections are
    named ``name`` in pg_stat_activity."""
    from tests.workers import worker_db_url

    url = worker_db_url()
    if connection.vendor == "postgresql":
        url = f"{url}?application_name={name}"
    return {"CELERY_BROKER_URL": broker_url, "DATABASE_URL": url, **extra}


@pytest.mark.workers
@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_a_request_is_applied_by_a_prefork_worker(transactional_db, broker, celery_workers):
    celery_workers.start(1, env=worker_env(broker.url))
    assert celery_workers.wait_ready(), celery_workers.logs()
    profile = ProfileFactory(active=False)
    with celery_delivery(broker.url):
        request = enqueue_update(profile, active=True)  # autocommit: published at once
    log = ProcessedRequest.objects.filter(pk=request.pk)
    assert wait_until(lambda: log.get().status == "applied", 60), celery_workers.logs()
    profile.refresh_from_db()
    assert profile.active
    assert f"Task {APPLY}[" in celery_workers.logs()


@pytest.mark.workers
def test_a_kept_connection_that_died_between_tasks_is_replaced(transactional_db, postgres_only, vhost, celery_workers):
    """With Celery told to keep connections (``CELERY_DB_REUSE_MAX``: its Django fix-up otherwise closes
    them around every task) and ``CONN_MAX_AGE`` with ``CONN_HEALTH_CHECKS``, the apply task keeps its
    connection between tasks as Django keeps a request's, and one that died between two tasks (a restart,
    a failover) is replaced before the next apply: no request waits for the relay."""
    name = "celery-kept"
    env = worker_env(vhost.url(), name, SAFEUPDATES_TEST_TOPOLOGY="persistent", CELERY_DB_REUSE_MAX="1000")
    celery_workers.start(1, env=env)
    assert celery_workers.wait_ready(), celery_workers.logs()

    def backends() -> set[int]:
        with connection.cursor() as cursor:
            # This database's: a pool process may hold one to the tenant database too (same name).
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
                [name],
            )
            return {pid for (pid,) in cursor.fetchall()}

    def apply(count: int) -> list[ProcessedRequest]:
        requests = [enqueue_update(ProfileFactory(active=False), active=True) for _ in range(count)]
        log = ProcessedRequest.objects.filter(pk__in=[request.pk for request in requests])
        assert wait_until(lambda: not log.filter(status="pending").exists(), 30), celery_workers.logs()
        return list(log)

    with celery_delivery(vhost.url()):
        assert {request.status for request in apply(4)} == {"applied"}
        kept = backends()
        assert 1 <= len(kept) <= 2, kept  # a connection per pool process (-c 2), kept between tasks
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", [name])
        assert wait_until(lambda: not backends(), 10)
        after = apply(4)
    assert {(request.status, request.attempts) for request in after} == {("applied", 1)}, celery_workers.logs()


@pytest.mark.workers
@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_on_a_redis_broker_the_workers_answer_for_their_queues(transactional_db, broker, celery_workers, admin_client):
    """kombu's Redis transport counts no consumers (its queue_declare answers 0 whoever consumes): the
    workers are asked which queues they consume (Celery's inspect().active_queues()). With none, a pending
    request is a problem at once; with one live on the queue, the system is healthy and the count is 1.
    RabbitMQ's count is tested above (test_status_shows_the_celery_queue)."""
    profile = ProfileFactory(active=False)
    with celery_delivery(broker.url):
        with transaction.atomic():  # the request pending, its message published at the commit
            enqueue_update(profile, active=True)
            alone = collect()
        assert [(h.name, h.workers) for h in alone.queues] == [("default", 0)]
        assert [problem.split(" (")[0] for problem in alone.problems()] == [
            "queue 'default': 1 request(s) pending, and no worker is registered on it"
        ]
        celery_workers.start(1, env=worker_env(broker.url))
        assert celery_workers.wait_ready(), celery_workers.logs()
        with transaction.atomic():
            request = enqueue_update(profile, active=True)
            snapshot = collect()
            as_json, as_text = StringIO(), StringIO()
            call_command("safeupdates_status", "--json", stdout=as_json)  # SystemExit(1) if unhealthy
            call_command("safeupdates_status", stdout=as_text)
            page = admin_client.get(reverse("admin:safeupdates_processedrequest_status")).content.decode()
        assert snapshot.backend_error == ""
        assert [(h.name, h.workers, h.busy_workers) for h in snapshot.queues] == [("default", 1, None)]
        assert snapshot.problems() == []
        shown = json.loads(as_json.getvalue())
        assert shown["healthy"] is True and shown["problems"] == []
        assert [(q["name"], q["workers"]) for q in shown["queues"]] == [("default", 1)]
        assert "worker(s)" in as_text.getvalue() and "None" not in as_text.getvalue()
        assert "<strong>Unhealthy</strong>" not in page
        log = ProcessedRequest.objects.filter(pk=request.pk)
        assert wait_until(lambda: log.get().status == "applied", 60), celery_workers.logs()


@pytest.mark.workers
@pytest.mark.parametrize(
    ("sqlstate", "status", "attempts", "runs"), [("40001", "failed", 3, 3), ("P0001", "rejected", 1, 1)]
)
def test_transient_errors_are_retried_by_celery_and_bad_data_never(
    transactional_db, refusing_trigger, vhost, celery_workers, sqlstate, status, attempts, runs
):
    """A serialization failure (transient) on every try: Celery retries the task SAFEUPDATES_RETRY["max"]
    (2) times with its back-off, then the request is failed. A trigger's refusal (the value's fault): the
    request is rejected at once, the task never retried."""
    refusing_trigger(sqlstate)
    celery_workers.start(1, env=worker_env(vhost.url()))
    assert celery_workers.wait_ready(), celery_workers.logs()
    with celery_delivery(vhost.url()):
        request = enqueue_update(ProfileFactory(), name="forbidden")
    log = ProcessedRequest.objects.filter(pk=request.pk)
    assert wait_until(lambda: log.get().status != "pending", 60), celery_workers.logs()
    assert log.values_list("status", "attempts").get() == (status, attempts)
    time.sleep(1)  # a retry that should not come would be received meanwhile
    received = celery_workers.logs().count(f"Task {APPLY}[")
    assert received >= runs  # "received" and "retry"/"succeeded" lines name the task
    assert celery_workers.logs().count(" received") == runs, celery_workers.logs()


# -- chaos: bursts through kills, duplicates and broker faults -------------------------------------------


class TimedBurst(Burst):
    """A :class:`~tests.faults.harness.Burst` that also keeps the longest commit (its publish included)."""

    longest_commit: float = 0.0

    def _commit(self, toggles, deadline):  # type: ignore[no-untyped-def]
        began = time.monotonic()
        super()._commit(toggles, deadline)
        self.longest_commit = max(self.longest_commit, time.monotonic() - began)


class Lost(logging.Handler):
    """Counts the web process's publishes after commit that failed (left to the relay)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "the relay will deliver it" in record.getMessage()


def start_relay(tmp_path: Path, broker_url: str) -> subprocess.Popen[bytes]:
    """``manage.py safeupdates_relay --interval 1 --older-than 2``, as docs/delivery.md runs it for Celery."""
    out = (tmp_path / "relay.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "safeupdates_relay", "--interval", "1", "--older-than", "2"],
        cwd=ROOT,
        env=subprocess_env(**worker_env(broker_url, "relay", SAFEUPDATES_DELIVERY="celery")),
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    return proc


def waiting_for_a_lock() -> list[str]:
    """The application names of worker connections that wait for a row lock inside their transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'celery-%%' "
            "AND wait_event_type = 'Lock' AND xact_start IS NOT NULL"
        )
        return [row[0] for row in cursor.fetchall()]


def chaos(
    tmp_path: Path, broker: Broker, burst_size: int, faults: Callable[[Chaos], dict[int, Callable[[], None]]]
) -> Chaos:
    """A burst of ``burst_size`` toggles of 8 records from this process, 2 supervised prefork workers
    (-c 2), the relay command, the faults of ``faults`` (hooks of the burst), then: every request terminal,
    nothing lost, nothing applied twice (tests.faults.harness.verify). Every client of the broker goes
    through a TCP proxy (``chaos.broker.proxy``) that a fault may cut."""
    url = broker.through_proxy()
    run = Chaos(tmp_path, broker, url)
    try:
        run.go(burst_size, faults(run))
    finally:
        run.close()
    return run


class Chaos:
    """One chaos run's world (see :func:`chaos`)."""

    def __init__(self, tmp_path: Path, broker: Broker, url: str) -> None:
        self.tmp_path, self.broker, self.url = tmp_path, broker, url
        self.pks = [ProfileFactory().pk for _ in range(8)]
        self.workers = SupervisedCeleryWorkers(worker_log_dir(tmp_path))
        self.burst = TimedBurst(self.pks, seed=43)
        self.lost = Lost()
        self.killed: list[str] = []
        self.relay: subprocess.Popen[bytes] | None = None
        self.app: Celery | None = None
        self.threads: list[threading.Thread] = []  # faults that run while the burst goes on

    def start_worker(self, index: int) -> None:
        self.workers.start(1, env=worker_env(self.url, f"celery-{index}"))

    def go(self, size: int, hooks: dict[int, Callable[[], None]]) -> None:
        logging.getLogger("safeupdates").addHandler(self.lost)
        for index in range(2):
            self.start_worker(index)
        assert self.workers.wait_ready(), self.workers.logs()
        self.relay = start_relay(self.tmp_path, self.url)
        with celery_delivery(self.url) as app:
            self.app = app
            self.burst.run(size, hooks, pace=0.004)
            for thread in self.threads:
                join(thread)
            converged = wait_until(
                lambda: not ProcessedRequest.objects.filter(kind="update", status="pending").exists(),
                120,
                interval=0.5,
            )
        self.outcome = verify(self.burst)
        print(
            f"\n{self.broker.kind} chaos: {len(self.burst.committed)} toggles, {self.lost.count} publishes lost after "
            f"commit (longest commit {self.burst.longest_commit * 1000:.0f} ms), killed {self.killed}, "
            f"{self.workers.restarts} worker restart(s) by the supervisor; {self.outcome.requests} requests: "
            f"{self.outcome.statuses}, {self.outcome.writes} row writes; lost {self.outcome.lost}, double-applied "
            f"{self.outcome.double_applied}, non-terminal {self.outcome.non_terminal}; the relay enqueued "
            f"{self.relay_enqueued()} message(s)"
        )
        assert converged, self.logs()
        assert self.outcome.violations() == {}, (self.outcome, self.logs())

    def kill_mid_apply(self, how: str) -> None:
        """Block the apply of one new request on a row lock, then SIGKILL the worker running it (``how``:
        ``"pool"``, its pool processes only; ``"worker"``, the worker and its pool)."""
        target, rid = self.pks[0], uuid.uuid4()
        with RowLock(Profile, target):
            with transaction.atomic():
                enqueue_update(Profile, target, request_id=rid, newsletter=True)
            self.burst.committed[rid] = (target, "newsletter", True)
            assert wait_until(lambda: bool(waiting_for_a_lock()), 30, interval=0.05), self.logs()
            name = waiting_for_a_lock()[0]
            index = self._index_of(name)
            if how == "pool":
                assert self.workers.kill_pool(index) > 0
                # The kill hit a running task: the worker sees it lost (and gives its message back).
                lost = wait_until(lambda: "WorkerLostError" in self.workers.log_of(index), 30, interval=0.1)
                assert lost, self.logs()
            else:
                self.workers.kill(index)  # the supervisor starts it again
            self.killed.append(f"{how} of {name}")
        # A later toggle of the record would carry its stuck request along (a job applies every pending
        # request of its record): from now on only the broker's redelivery or the relay brings it.
        self.burst.targets = [pk for pk in self.burst.targets or self.pks if pk != target]

    def _index_of(self, name: str) -> int:
        """The index of the live worker whose database connections are named ``name``."""
        [index] = [
            index
            for index in self.workers.running()
            if self.workers.envs[self.workers.procs[index].pid]["DATABASE_URL"].endswith(f"application_name={name}")
        ]
        return index

    def duplicates(self, count: int = 60) -> None:
        """A second message for ``count`` committed requests, newest first."""
        assert self.app is not None
        rids = sorted(self.burst.committed, key=str)[:count]
        for request in ProcessedRequest.objects.filter(request_id__in=rids).order_by("-version"):
            self.app.send_task(
                APPLY,
                args=[str(request.request_id)],
                kwargs={"content_type_id": request.content_type_id, "object_id": request.object_id, "using": "default"},
                queue="default",
            )

    def relay_enqueued(self) -> int:
        """How many messages the relay's passes published, from its output lines."""
        path = self.tmp_path / "relay.log"
        return sum(
            int(n) for n in re.findall(r"enqueued (\d+) job", path.read_text(errors="replace") if path.exists() else "")
        )

    def logs(self) -> str:
        path = self.tmp_path / "relay.log"
        relay = path.read_text(errors="replace") if path.exists() else ""
        return f"--- workers:\n{self.workers.logs()[-8000:]}\n--- relay:\n{relay[-3000:]}"

    def close(self) -> None:
        logging.getLogger("safeupdates").removeHandler(self.lost)
        if self.relay is not None:
            self.relay.terminate()
            self.relay.wait(10)
        self.workers.stop()
        if self.broker.proxy is not None:
            self.broker.proxy.stop()


@pytest.mark.faults
@pytest.mark.workers
@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_chaos_on_rabbitmq_kills_duplicates_and_a_cut_off_broker(audited, broker, tmp_path):
    """RabbitMQ behind a TCP proxy that every client uses: a worker's pool processes SIGKILLed mid-apply
    (reject_on_worker_lost gives the message back), a whole worker SIGKILLed mid-apply (RabbitMQ requeues
    what it held), 60 duplicate messages newest first, and the proxy stopped for 3 s mid-burst (every
    connection dropped; publishes meanwhile fail at once and are left to the relay), then restored."""

    def faults(run: Chaos) -> dict[int, Callable[[], None]]:
        def cut() -> None:
            assert broker.proxy is not None
            # The records toggled while the broker is cut off must have no message waiting, else their
            # requests publish nothing (that message reads them) and no publish is lost: their messages
            # run first.
            # Nor any message at all that could still read them: the duplicates sent at 180 carry no note,
            # and one of those records' that ran after the cut applied its lost requests before the relay.
            records = [str(pk) for pk in run.pks[6:]]
            waiting = WaitingMessage.objects.filter(object_id__in=records)
            pending = ProcessedRequest.objects.filter(object_id__in=records, status="pending")
            assert run.app is not None

            def quiet() -> bool:
                return not waiting.exists() and not pending.exists() and queued(run.app) == 0

            assert wait_until(quiet, 60, interval=0.05), run.logs()
            time.sleep(2)  # a message taken off the queue just before: its task has run by now
            assert wait_until(quiet, 60, interval=0.05), run.logs()
            run.lost.count = 0
            broker.proxy.stop()
            # The toggles made while the broker is cut off go to two records that get none afterwards: a
            # later toggle's message would apply their lost requests, and only the relay may bring them.
            run.burst.targets = run.pks[6:]
            end = time.monotonic() + 3
            while time.monotonic() < end:  # the burst goes on while the broker is cut off
                run.burst.run(3)
            broker.proxy.start()
            run.burst.targets = run.pks[1:6]
            assert run.lost.count > 0, "no publish was lost while the broker was cut off"

        return {
            60: lambda: run.kill_mid_apply("pool"),
            120: lambda: run.kill_mid_apply("worker"),
            180: run.duplicates,
            240: cut,
        }

    run = chaos(tmp_path, broker, 360, faults)
    assert len(run.killed) == 2
    assert run.relay_enqueued() > 0, "the relay delivered nothing"


@pytest.mark.faults
@pytest.mark.workers
@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_chaos_on_redis_kills_duplicates_and_a_broker_restarted_empty(audited, broker, tmp_path):
    """A Redis broker of the test's own: pool processes SIGKILLed mid-apply, a whole worker SIGKILLed
    mid-apply (its messages stay in Redis' unacked hash until the visibility timeout: the relay delivers
    their requests), 60 duplicates, and Redis killed and started again empty mid-burst (every queued
    message gone; workers that exit of it are started again by the supervisor)."""

    def faults(run: Chaos) -> dict[int, Callable[[], None]]:
        def restart() -> None:
            assert broker.redis is not None
            broker.redis.restart(down_for=1)
            # Requests committed before the restart lost their messages with Redis: from now on the first
            # records get no toggles (that would publish them a message), so only the relay brings theirs.
            run.burst.targets = run.pks[3:]

        return {
            60: lambda: run.kill_mid_apply("pool"),
            120: lambda: run.kill_mid_apply("worker"),
            180: run.duplicates,
            240: lambda: run.threads.append(run_in_thread(restart)),
        }

    run = chaos(tmp_path, broker, 360, faults)
    assert len(run.killed) == 2
    assert run.relay_enqueued() > 0, "the relay delivered nothing"


@pytest.mark.workers
def test_the_celery_beat_entry_runs_the_relay(transactional_db, vhost, celery_workers, tmp_path):
    """docs/delivery.md's beat entry (tests/celery_app.py adds it with CELERY_RELAY_EVERY): ``celery beat``
    sends ``safeupdates.jobs.relay_pending`` every second, a worker runs it, and a request whose publish
    was lost after commit is applied without the relay command."""
    env = worker_env(vhost.url(), CELERY_RELAY_EVERY="1")
    celery_workers.start(1, env=env)
    assert celery_workers.wait_ready(), celery_workers.logs()
    with celery_delivery(vhost.url(free_port())):  # a broker that is down: the publish is lost
        request = enqueue_update(ProfileFactory(active=False), active=True)
    log = ProcessedRequest.objects.filter(pk=request.pk)
    assert log.get().status == "pending"
    beat_log = (tmp_path / "beat.log").open("wb")
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.celery_app", "beat", "-s", str(tmp_path / "schedule")],
        cwd=ROOT,
        env=subprocess_env(SAFEUPDATES_DELIVERY="celery", **env),
        stdout=beat_log,
        stderr=subprocess.STDOUT,
    )
    beat_log.close()
    try:
        applied = wait_until(lambda: log.get().status == "applied", 90, interval=0.2)
    finally:
        beat.terminate()
        beat.wait(10)
    assert applied, (tmp_path / "beat.log").read_text() + celery_workers.logs()
    assert "safeupdates.jobs.relay_pending" in celery_workers.logs()


@pytest.mark.workers
def test_idempotent_runs_a_celery_tasks_body_once_per_key(transactional_db, vhost, celery_workers):
    """``@idempotent`` below ``@shared_task`` (tests/testapp/celery_tasks.py): the same refund sent twice
    runs its body once; the second run returns "duplicate"."""
    celery_workers.start(1, env=worker_env(vhost.url()))
    assert celery_workers.wait_ready(), celery_workers.logs()
    profile = ProfileFactory(name="order-7", score=0)
    with celery_delivery(vhost.url()) as app:
        for _ in range(2):
            app.send_task("tests.refund_once", args=["order-7"], queue="default")
    assert wait_until(lambda: celery_workers.logs().count("tests.refund_once[") >= 4, 60), celery_workers.logs()
    profile.refresh_from_db()
    assert profile.score == 1
    assert ProcessedRequest.objects.filter(kind="task", key="celery-refund:order-7", status="applied").count() == 1
    assert "'refunded order-7'" in celery_workers.logs() and "'duplicate'" in celery_workers.logs()


def test_the_message_carries_the_trace_context_beside_the_ids(db, rabbit, spans, django_capture_on_commit_callbacks):  # noqa: F811  (the fixture imported)
    """With OpenTelemetry the enqueue's trace context rides in the message's arguments (the carrier
    only, never the changes)."""
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_update(ProfileFactory(), name="secret value")
    [message] = take_messages(rabbit)
    _args, kwargs, _embed = message.decode()
    assert set(kwargs) == {"content_type_id", "object_id", "using", "trace"}
    assert set(kwargs["trace"]) == {"traceparent"}
    assert "secret value" not in str(kwargs)


@pytest.mark.workers
def test_the_task_continues_the_trace_of_its_enqueue(transactional_db, vhost, celery_workers, spans, tmp_path):  # noqa: F811
    """The prefork worker's apply span (exported by the pool process to a file, tests/celery_app.py) is
    a child of the enqueue's span, in its trace."""
    exported = tmp_path / "spans.jsonl"
    celery_workers.start(1, env=worker_env(vhost.url(), SAFEUPDATES_TEST_SPANS=str(exported)))
    assert celery_workers.wait_ready(), celery_workers.logs()
    with celery_delivery(vhost.url()):
        request = enqueue_update(ProfileFactory(), active=True)  # autocommit: published at once
    log = ProcessedRequest.objects.filter(pk=request.pk)
    assert wait_until(lambda: log.get().status == "applied", 60), celery_workers.logs()

    def apply_spans() -> list[dict]:
        lines = exported.read_text().splitlines() if exported.exists() else []
        return [span for span in map(json.loads, lines) if span["name"] == "safeupdates.apply_update"]

    assert wait_until(lambda: bool(apply_spans()), 10), celery_workers.logs()
    [apply] = apply_spans()
    [enqueue] = [span for span in spans.get_finished_spans() if span.name == "safeupdates.enqueue_update"]
    assert apply["context"]["trace_id"] == f"0x{enqueue.context.trace_id:032x}"
    assert apply["parent_id"] == f"0x{enqueue.context.span_id:016x}"
    assert apply["attributes"]["safeupdates.request_id"] == str(request.request_id)
