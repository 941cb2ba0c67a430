"""A retried ``enqueue_update()`` after an ambiguous commit: the client never learnt whether its first call
committed (the connection broke during COMMIT, a failover), so it calls again with the same request id.
If the first one did commit, its request is pending and may have no job (its on-commit delivery never
ran); the retry delivers it on commit, so it waits for no relay pass."""

from __future__ import annotations

import uuid

import django_rq
import pytest
from django.db import transaction
from django.test import override_settings
from django_tasks_db.models import DBTaskResult
from rq import SimpleWorker

from safeupdates import enqueue_update
from safeupdates.delivery import tasks as taskqueue
from safeupdates.models import ProcessedRequest
from tests.factories import ProfileFactory
from tests.testapp.models import Profile

pytestmark = pytest.mark.django_db(transaction=True)


def queue():
    return django_rq.get_queue("default")


def work() -> None:
    """Run the queued jobs here, with RQ's own SimpleWorker, until the queue is empty."""
    SimpleWorker([queue()], connection=queue().connection).work(burst=True)


def test_a_retried_enqueue_of_a_pending_request_delivers_it_on_commit(redis):
    profile = ProfileFactory(active=False)
    rid = uuid.uuid4()
    first = enqueue_update(profile, request_id=rid, active=True)
    redis.flushdb()  # the first call's commit landed, its delivery did not: no job anywhere

    with transaction.atomic():
        again = enqueue_update(profile, request_id=rid, active=True)
        assert queue().count == 0  # on commit, not before: a rolled-back retry delivers nothing
    assert again.pk == first.pk
    [job] = queue().jobs
    assert job.args == (str(rid),)
    work()
    assert ProcessedRequest.objects.get(pk=first.pk).status == "applied"
    assert Profile.objects.get(pk=profile.pk).active is True
    assert ProcessedRequest.objects.count() == 1


def test_a_retry_inside_a_rolled_back_transaction_delivers_nothing(redis):
    profile = ProfileFactory(active=False)
    rid = uuid.uuid4()
    enqueue_update(profile, request_id=rid, active=True)
    redis.flushdb()
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_update(profile, request_id=rid, active=True)
        raise RuntimeError("the caller's transaction rolls back")
    assert queue().count == 0
    assert ProcessedRequest.objects.get(request_id=rid).status == "pending"  # for the relay


def test_a_duplicate_job_of_a_retry_changes_nothing(redis):
    """The first call's job is still waiting when the retry delivers: at most a second job, which finds
    nothing pending; the request is applied once."""
    profile = ProfileFactory(active=False)
    rid = uuid.uuid4()
    enqueue_update(profile, request_id=rid, active=True)
    enqueue_update(profile, request_id=rid, active=True)
    assert 1 <= queue().count <= 2
    work()
    request = ProcessedRequest.objects.get(request_id=rid)
    assert (request.status, request.attempts) == ("applied", 1)
    assert Profile.objects.get(pk=profile.pk).active is True


def test_a_retry_of_a_terminal_request_delivers_nothing(redis):
    profile = ProfileFactory(active=False)
    rid = uuid.uuid4()
    enqueue_update(profile, request_id=rid, active=True)
    work()
    enqueue_update(profile, request_id=rid, active=True)
    assert queue().count == 0


@override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="db")
def test_with_the_tasks_backend_the_retry_delivers_a_task_on_commit():
    """django-tasks-db: every delivery is a task row; the retry of a pending request whose task was lost
    adds one, for the request's own id."""
    profile = ProfileFactory(active=False)
    rid = uuid.uuid4()
    enqueue_update(profile, request_id=rid, active=True)
    DBTaskResult.objects.all().delete()  # the first call's task never came to be
    enqueue_update(profile, request_id=rid, active=True)
    [task] = DBTaskResult.objects.filter(task_path=taskqueue.APPLY_TASK)
    assert task.args_kwargs["args"][0] == str(rid)
