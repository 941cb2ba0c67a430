"""The RQ worker class of docs/deployment.md (``safeupdates.delivery.rq_worker.Worker``): what every apply
job needs once per process is loaded in the worker's own process before it forks a work horse."""

from __future__ import annotations

import logging
from typing import Any

import django_rq
import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.utils import OperationalError
from django.test.utils import override_settings
from rq import Worker as RQWorker

from safeupdates.database.registry import model_of
from safeupdates.delivery import rq_worker
from safeupdates.jobs import enqueue_update
from safeupdates.models import ProcessedRequest, RequestStatus
from tests.testapp.models import Profile

# transaction=True: the warm-up closes the connections it opened, and the work horse reads what the test wrote.
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def test_warm_up_loads_the_content_types_and_closes_the_connection(
    django_assert_num_queries: Any,
) -> None:
    ContentType.objects.clear_cache()
    assert rq_worker.warm_up() == []
    assert all(connections[alias].connection is None for alias in connections)  # none crosses the fork
    with django_assert_num_queries(0):
        content_type = ContentType.objects.get_for_model(Profile)
        assert model_of(content_type.pk, DEFAULT_DB_ALIAS) is Profile


def test_warm_up_never_raises(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def unreachable(using: str) -> int:
        raise OperationalError("connection refused")

    monkeypatch.setattr(rq_worker, "load_content_types", unreachable)
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        assert rq_worker.warm_up([DEFAULT_DB_ALIAS]) == [DEFAULT_DB_ALIAS]
    assert "could not load the content types of database 'default' before its fork" in caplog.text


def test_the_worker_loads_before_its_first_fork_and_applies(redis: Any, django_assert_num_queries: Any) -> None:
    queue = django_rq.get_queue("default")
    profile = Profile.objects.create(name="warm")
    request = enqueue_update(Profile, profile.pk, active=True)
    ContentType.objects.clear_cache()
    worker = rq_worker.Worker([queue], connection=queue.connection)
    assert worker.work(burst=True)  # a real fork: the job runs in a work horse
    assert worker._safeupdates_unloaded == []  # every database loaded
    profile.refresh_from_db()
    assert profile.active
    assert ProcessedRequest.objects.get(pk=request.pk).status == RequestStatus.APPLIED
    # This process is the worker's: it holds the content types its horses inherited.
    with django_assert_num_queries(0):
        ContentType.objects.get_for_model(Profile)


def test_the_worker_tries_again_before_a_job_what_it_could_not_load(
    redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = django_rq.get_queue("default")
    for name in ("one", "two"):
        enqueue_update(Profile, Profile.objects.create(name=name).pk, active=True)
    asked: list[Any] = []

    def warm_up(aliases: Any = None) -> list[str]:
        asked.append(aliases)
        connections.close_all()  # as warm_up() does: no connection of this process crosses the fork
        return [] if asked[1:] else ["tenant"]

    monkeypatch.setattr(rq_worker, "warm_up", warm_up)
    monkeypatch.setattr(rq_worker, "RETRY_EVERY", 0.0)
    worker = rq_worker.Worker([queue], connection=queue.connection)
    with override_settings(SAFEUPDATES_SWEEP_RECORDS=0):  # two jobs, not one that sweeps the other record
        assert worker.work(burst=True)
    # At start every database; before the first job the one that failed; then nothing is left to load.
    assert asked == [None, ["tenant"]]
    assert Profile.objects.filter(active=True).count() == 2


def test_django_rq_picks_it_from_the_settings(settings: Any) -> None:
    from django_rq.workers import get_worker

    settings.RQ = {"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"}
    assert isinstance(get_worker("default"), rq_worker.Worker)


class HerokuLike(rq_worker.WarmUpMixin, RQWorker):
    pass


@pytest.mark.parametrize(
    ("worker_class", "reported"),
    [
        (None, "rq.Worker"),  # no RQ["WORKER_CLASS"]: RQ's Worker
        ("rq.Worker", "rq.Worker"),  # as the settings name it
        ("rq.worker.HerokuWorker", "rq.worker.HerokuWorker"),
        ("safeupdates.delivery.rq_worker.Worker", None),
        (HerokuLike, None),
        ("rq.SimpleWorker", None),  # no fork: what one job loads, the next finds
        ("rq.SpawnWorker", None),  # each horse starts afresh: nothing loaded before reaches it
        ("no.such.Worker", None),  # django-rq's to report
    ],
)
def test_the_check_names_a_worker_class_that_forks_without_loading_first(
    settings: Any, worker_class: Any, reported: str | None
) -> None:
    settings.RQ = {} if worker_class is None else {"WORKER_CLASS": worker_class}
    problem = rq_worker.worker_class_problem()
    if reported is None:
        assert problem is None
        return
    assert problem == (
        f"RQ's worker class {reported} forks a work horse per job, and every apply job reads again what a worker "
        "could have loaded once before its fork (the content types of the models it writes).",
        'Set RQ = {"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"} in the settings, or add '
        "safeupdates.delivery.rq_worker.WarmUpMixin to your worker class (docs/deployment.md, Running workers).",
        "safeupdates.W008",
    )
