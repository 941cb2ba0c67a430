"""A Celery worker process trusts the request log, never a memory of its own (issue 54).

A worker process used to remember the ids of requests it saw finished and to answer a later message
naming one "nothing pending" without reading the database. That memory is gone (a burst of one record
now costs one message: safeupdates.models.WaitingMessage). A request id recorded again after
``safeupdates_purge`` deleted the finished one (or a request back to ``pending`` after the database lost
the apply's commit: a restore, a failover to an asynchronous replica) was then never applied by that
process, whatever the relay sent. Every message now reads the log.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from safeupdates import enqueue_update
from safeupdates.jobs import relay
from safeupdates.models import ProcessedRequest
from tests.celery_harness import (
    CeleryWorkers,
    RabbitVhost,
    celery_delivery,
    own_vhost,
    worker_log_dir,
)
from tests.factories import ProfileFactory
from tests.test_celery_delivery import worker_env
from tests.testapp.models import Profile
from tests.workers import wait_until

pytestmark = pytest.mark.workers


@pytest.fixture
def vhost() -> Iterator[RabbitVhost]:
    with own_vhost() as own:
        yield own


@pytest.fixture
def one_process(tmp_path: Path, vhost: RabbitVhost) -> Iterator[CeleryWorkers]:
    """One Celery worker with one pool process: every message runs in the same process."""
    pool = CeleryWorkers(worker_log_dir(tmp_path), name="celery-memory", concurrency=1)
    pool.start(1, env=worker_env(vhost.url()))
    assert pool.wait_ready(), pool.logs()
    yield pool
    pool.stop()


def test_a_request_id_recorded_again_after_a_purge_is_applied(transactional_db, vhost, one_process):
    """The process that applied the old request applies the new one: its own message, no relay needed."""
    profile = ProfileFactory(name="start")
    rid = uuid.uuid4()
    with celery_delivery(vhost.url()):
        enqueue_update(profile, name="first", request_id=rid)  # autocommit: published at once
        log = ProcessedRequest.objects.filter(request_id=rid)
        assert wait_until(lambda: log.get().status == "applied", 60), one_process.logs()
        call_command("safeupdates_purge", "--older-than", "0", verbosity=0)
        assert not log.exists()
        enqueue_update(profile, name="second", request_id=rid)  # the same id, a new request
        applied = wait_until(lambda: log.get().status == "applied", 60)
    assert applied, one_process.logs()
    assert Profile.objects.get(pk=profile.pk).name == "second"


def test_a_request_back_to_pending_after_the_database_lost_its_apply_is_applied(transactional_db, vhost, one_process):
    """A restore (or a failover to an asynchronous replica) takes the row and the request back to before
    the apply committed; the worker process saw it applied. The relay's message applies it again."""
    profile = ProfileFactory(name="start")
    with celery_delivery(vhost.url()):
        request = enqueue_update(profile, name="wanted")
        log = ProcessedRequest.objects.filter(pk=request.pk)
        assert wait_until(lambda: log.get().status == "applied", 60), one_process.logs()
        # The database as it was before the apply's commit: the row's old value, the request pending.
        Profile.objects.filter(pk=profile.pk).update(name="start", field_versions={"*": 0})
        log.update(status="pending", processed_at=None)
        relay(0)
        applied = wait_until(lambda: log.get().status == "applied", 60)
    assert applied, one_process.logs()
    assert Profile.objects.get(pk=profile.pk).name == "wanted"
