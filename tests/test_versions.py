from __future__ import annotations

import threading

import pytest
from django.db import connection

from safeupdates.models import ProcessedRequest, VersionCounter
from safeupdates.versions import _next_from_counter, next_version
from tests.workers import run_threads


@pytest.mark.django_db
def test_strictly_increasing():
    values = [next_version() for _ in range(50)]
    assert values == sorted(set(values))


@pytest.mark.django_db
def test_counter_fallback_is_strictly_increasing_and_recreates_its_row():
    first = _next_from_counter("default")
    assert _next_from_counter("default") == first + 1
    from tests.factories import ProfileFactory

    profile = ProfileFactory()
    VersionCounter.objects.all().delete()
    # A lost counter row starts again above every version stored in a row, never at 1.
    again = _next_from_counter("default")
    assert again > profile.lock_version
    assert _next_from_counter("default") == again + 1


@pytest.mark.django_db
def test_purging_requests_does_not_move_versions_back(django_user_model):
    from tests.factories import ProfileFactory

    profile = ProfileFactory()
    from safeupdates import enqueue_update

    request = enqueue_update(profile, active=True)
    ProcessedRequest.objects.all().delete()
    assert next_version() > request.version


@pytest.mark.django_db(transaction=True)
def test_unique_across_threads():
    results: list[int] = []
    lock = threading.Lock()

    def allocate() -> None:
        got = [next_version() for _ in range(100)]
        with lock:
            results.extend(got)

    run_threads(allocate, 4)
    assert len(results) == 400
    if connection.vendor == "postgresql":
        assert len(set(results)) == 400
