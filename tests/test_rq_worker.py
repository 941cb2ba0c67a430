"""The RQ worker class of docs/deployment.md (``safeupdates.delivery.rq_worker.Worker``): an apply job runs
in the worker's own process, on a connection kept between jobs as Django keeps a request's (``CONN_MAX_AGE``,
``CONN_HEALTH_CHECKS``); any other job runs in a work horse forked per job, as on RQ's ``Worker``, and no
database connection crosses that fork."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import django_rq
import psycopg
import pytest
from django.db import connection
from django.test.utils import override_settings
from rq import Worker as RQWorker

from safeupdates.delivery import rq_worker
from safeupdates.jobs import enqueue_update
from safeupdates.models import ProcessedRequest, RequestStatus
from safeupdates.signals import request_applied
from tests.testapp.models import Profile

# transaction=True: the jobs run on their own connections' view of what the test committed.
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def applied() -> Iterator[list[tuple[int, int]]]:
    """(process id, database backend pid) of each apply, as seen by the process that ran it."""
    seen: list[tuple[int, int]] = []

    def note(**kwargs: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT 0")
            seen.append((os.getpid(), cursor.fetchone()[0]))

    request_applied.connect(note, dispatch_uid="test_rq_worker")
    yield seen
    request_applied.disconnect(dispatch_uid="test_rq_worker")


@pytest.fixture
def max_age() -> Iterator[Any]:
    """Set the default database's CONN_MAX_AGE for what the worker (this process) runs."""
    saved = dict(connection.settings_dict)

    def set_to(seconds: int | None) -> None:
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = seconds

    yield set_to
    connection.close()
    connection.settings_dict.clear()
    connection.settings_dict.update(saved)


def burst(**settings: Any) -> None:
    queue = django_rq.get_queue("default")
    worker = rq_worker.Worker([queue], connection=queue.connection)
    with override_settings(SAFEUPDATES_SWEEP_RECORDS=0, **settings):  # a job per record
        assert worker.work(burst=True)


def test_apply_jobs_run_in_the_workers_process_on_a_kept_connection(
    redis: Any, applied: list[tuple[int, int]], max_age: Any
) -> None:
    profiles = [Profile.objects.create(name=name) for name in ("one", "two", "three")]
    requests = [enqueue_update(Profile, profile.pk, active=True) for profile in profiles]
    max_age(60)
    burst()
    assert {pid for pid, _ in applied} == {os.getpid()}  # no work horse
    assert len({backend for _, backend in applied}) == 1  # one connection for the three jobs
    assert len(applied) == 3
    assert all(p.active for p in Profile.objects.all())
    assert {r.status for r in ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests])} == {
        RequestStatus.APPLIED
    }


def test_conn_max_age_0_closes_the_connection_after_each_apply_job(
    postgres_only: None, redis: Any, applied: list[tuple[int, int]], max_age: Any
) -> None:
    for name in ("one", "two"):
        enqueue_update(Profile, Profile.objects.create(name=name).pk, active=True)
    max_age(0)  # Django's default: a connection per unit of work, as per request
    burst()
    assert [pid for pid, _ in applied] == [os.getpid()] * 2
    assert len({backend for _, backend in applied}) == 2
    assert connection.connection is None  # closed after the last job


def test_a_connection_that_died_between_jobs_is_replaced(
    postgres_only: None, redis: Any, applied: list[tuple[int, int]], max_age: Any
) -> None:
    """A backend terminated between two apply jobs (a restart, a failover): the next job reconnects."""
    first = Profile.objects.create(name="first")
    enqueue_update(Profile, first.pk, active=True)
    max_age(60)
    connection.settings_dict["CONN_HEALTH_CHECKS"] = True
    burst()
    [(_, backend)] = applied
    assert connection.connection is not None  # kept: this process is the worker
    params = connection.get_connection_params()
    with psycopg.connect(**{k: params[k] for k in ("host", "port", "user", "dbname")}, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [backend])
    second = Profile.objects.create(name="second")  # on a new connection: the old one is dead
    enqueue_update(Profile, second.pk, active=True)
    burst()
    assert len(applied) == 2 and applied[1][1] != backend
    second.refresh_from_db()
    assert second.active


def test_other_jobs_fork_and_no_connection_crosses_the_fork(
    redis: Any, applied: list[tuple[int, int]], max_age: Any
) -> None:
    queue = django_rq.get_queue("default")
    enqueue_update(Profile, Profile.objects.create(name="one").pk, active=True)
    job = queue.enqueue("tests.testapp.jobs.process_and_connection")
    max_age(60)
    burst()
    horse_pid, inherited = job.return_value()
    assert horse_pid != os.getpid()  # a work horse, as on RQ's Worker
    assert inherited is False  # the apply's kept connection was closed before the fork


def test_django_rq_picks_it_from_the_settings(settings: Any) -> None:
    from django_rq.workers import get_worker

    settings.RQ = {"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"}
    assert isinstance(get_worker("default"), rq_worker.Worker)


class HerokuLike(rq_worker.AppliesInProcessMixin, RQWorker):
    pass


@pytest.mark.parametrize(
    ("worker_class", "reported"),
    [
        (None, "rq.Worker"),  # no RQ["WORKER_CLASS"]: RQ's Worker
        ("rq.Worker", "rq.Worker"),  # as the settings name it
        ("rq.worker.HerokuWorker", "rq.worker.HerokuWorker"),
        ("rq.SpawnWorker", "rq.SpawnWorker"),  # a new process per job too
        ("safeupdates.delivery.rq_worker.Worker", None),
        (HerokuLike, None),
        ("rq.SimpleWorker", None),  # every job in the worker's process: its connection is kept
        ("no.such.Worker", None),  # django-rq's to report
    ],
)
def test_the_check_names_a_worker_class_that_runs_applies_in_a_new_process(
    settings: Any, worker_class: Any, reported: str | None
) -> None:
    settings.RQ = {} if worker_class is None else {"WORKER_CLASS": worker_class}
    problem = rq_worker.worker_class_problem()
    if reported is None:
        assert problem is None
        return
    assert problem == (
        f"RQ's worker class {reported} runs every apply job in a new work horse, which connects to the "
        "database afresh and loads again what the job needs.",
        'Set RQ = {"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"} in the settings, or add '
        "safeupdates.delivery.rq_worker.AppliesInProcessMixin to your worker class "
        "(docs/deployment.md, Running workers).",
        "safeupdates.W008",
    )


def test_an_apply_job_cut_off_mid_statement_leaves_no_connection_to_the_next(
    redis: Any, slow_trigger: None, applied: list[tuple[int, int]], max_age: Any, settings: Any
) -> None:
    """RQ's job timeout raises in the middle of the apply's statement (SIGALRM, in the worker's own process
    now): the connection it interrupted is not the next job's."""
    settings.SAFEUPDATES_JOB_TIMEOUT = 1
    slow = enqueue_update(Profile, Profile.objects.create(name="slow one").pk, name="slow")  # 3 s in a trigger
    after = enqueue_update(Profile, Profile.objects.create(name="after").pk, active=True)
    max_age(60)
    burst()
    statuses = dict(ProcessedRequest.objects.values_list("request_id", "status"))
    assert statuses[after.request_id] == RequestStatus.APPLIED
    assert statuses[slow.request_id] == RequestStatus.PENDING  # left to RQ's retry and the relay
