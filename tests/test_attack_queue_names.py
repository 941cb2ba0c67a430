"""enqueue_update() refuses a queue name the request log cannot record (longer than its column, with a NUL
character or a lone surrogate, not text) with InvalidUpdate before anything is written, whatever the
delivery backend takes; the caller's transaction goes on (found by attacking ``queue=``: a backend that
lists no queues, such as Celery's default or a Tasks backend without QUEUES, takes any name)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from safeupdates import enqueue_update
from safeupdates.exceptions import InvalidUpdate
from safeupdates.models import ProcessedRequest
from tests.testapp.models import Profile
from tests.workers import still_usable

pytestmark = pytest.mark.django_db

#: The Tasks framework's immediate backend of the test settings: no QUEUES, so any name is served.
ANY_QUEUE = override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="default")


@pytest.mark.parametrize(
    ("queue", "why"),
    [
        ("q" * 101, r"has 101 characters, and the request log's column holds at most 100"),
        ("a\x00b", r"contains a NUL character"),
        ("\ud800", r"contains a lone surrogate"),
        (3, r"is not text"),
        (b"fast", r"is not text"),
    ],
)
@pytest.mark.parametrize("delivery", ["rq", "tasks"])
def test_a_queue_name_the_request_log_cannot_record_is_refused(queue: Any, why: str, delivery: str) -> None:
    profile = Profile.objects.create(name="queued")
    settings = ANY_QUEUE if delivery == "tasks" else override_settings()
    with settings, transaction.atomic():
        with pytest.raises(InvalidUpdate, match=rf"^queue .{{0,80}} {why}"):
            enqueue_update(Profile, profile.pk, queue=queue, active=True)
        still_usable()
    assert not ProcessedRequest.objects.exists()


def test_a_refused_queue_name_is_not_echoed_whole() -> None:
    with pytest.raises(InvalidUpdate) as excinfo:
        enqueue_update(Profile, 1, queue="q" * 100_000, active=True)
    assert len(str(excinfo.value)) < 300


@ANY_QUEUE
def test_a_queue_name_of_100_characters_is_recorded() -> None:
    profile = Profile.objects.create(name="queued")
    with transaction.atomic():
        request = enqueue_update(Profile, profile.pk, queue="q" * 100, active=True)
    assert ProcessedRequest.objects.get(pk=request.pk).queue == "q" * 100
