"""A pytest plugin for projects that use safeupdates: apply the pending update requests in the test.

pytest loads it by itself wherever django-safeupdates is installed (its ``pytest11`` entry point is
named ``safeupdates.testing``; ``-p no:safeupdates.testing`` leaves it out). Where plugins are not
loaded by themselves (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), name it in the root ``conftest.py``:
``pytest_plugins = ["safeupdates.testing"]``.

The fixture :func:`safeupdates_run_pending` gives a test :func:`run_pending`: it applies every pending
request of the request log in the test's own process, with the job function the workers run, and returns
what it settled. It needs no worker, no Redis and no task backend: the request log is the outbox, so
what a worker would find there is what gets applied, whatever ``SAFEUPDATES_DELIVERY`` says.

Importing this module imports no Django model: pytest loads plugins before Django is set up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from safeupdates.models import ProcessedRequest

__all__ = ["RequestsStillPending", "run_pending", "safeupdates_run_pending"]

#: How many rounds :func:`run_pending` makes at most (a round: one job per record with pending requests;
#: a new round while the jobs' receivers or side effects make new requests).
MAX_ROUNDS = 100


class RequestsStillPending(AssertionError):
    """:func:`run_pending` left requests pending: a round of jobs settled none of them (their rows are
    locked by another connection), or new requests kept coming for :data:`MAX_ROUNDS` rounds."""


def run_pending(using: str | None = None) -> list[ProcessedRequest]:
    """Apply every pending update request in database ``using`` (default: the one the request log is
    written to), as workers would, and return the requests it settled, reloaded and in version order:
    each one's ``status`` says how it ended (``applied``, ``stale``, ``rejected``).

    For each record with pending requests it calls :func:`safeupdates.jobs.apply_update` once, with the
    id of one of them: the job applies all of the record's pending requests. Then again, while update
    requests are pending: a receiver of ``request_applied`` may have made new ones. The callbacks the
    jobs leave for their transaction's commit (the outcome signals, the log lines) run too, also in a
    test whose transaction never commits (pytest-django's ``django_db``, Django's ``TestCase``).

    Requests of the optional job tools (``@idempotent`` tasks, batch items) are left as they are: no
    update job settles them. A transient database error of a job propagates, as it would fail the job.
    Raises :class:`RequestsStillPending` if requests stay pending.
    """
    from django.db import router
    from django.test import TestCase

    from safeupdates.jobs import apply_update
    from safeupdates.models import ProcessedRequest

    using = using or router.db_for_write(ProcessedRequest)
    pending = ProcessedRequest.objects.using(using).filter(
        status=ProcessedRequest.Status.PENDING, kind=ProcessedRequest.Kind.UPDATE
    )
    settled: list[int] = []
    for _ in range(MAX_ROUNDS):
        rows = list(pending.order_by("version").values_list("pk", "request_id", "content_type_id", "object_id"))
        if not rows:
            return sorted(ProcessedRequest.objects.using(using).filter(pk__in=settled), key=_by_version)
        one_per_record = {(content_type, object_id): request_id for _, request_id, content_type, object_id in rows}
        with TestCase.captureOnCommitCallbacks(using=using, execute=True):
            for request_id in one_per_record.values():
                apply_update(str(request_id), using=using)
        before = {pk for pk, *_ in rows}
        left = set(pending.filter(pk__in=before).values_list("pk", flat=True))
        if left == before:
            raise RequestsStillPending(
                f"{len(left)} update request(s) stayed pending after their records' jobs ran: another "
                "connection holds their rows locked (a worker, or a transaction of the test's own)."
            )
        settled += [pk for pk, *_ in rows if pk not in left]
    raise RequestsStillPending(
        f"update requests were still pending after {MAX_ROUNDS} rounds of jobs: something makes a new "
        "request for each one applied (a receiver of request_applied?)."
    )


def _by_version(request: ProcessedRequest) -> tuple[int, int]:
    return (request.version or 0, request.pk)


@pytest.fixture
def safeupdates_run_pending() -> Callable[..., list[ProcessedRequest]]:
    """:func:`run_pending`, to call in a test with database access (pytest-django's ``django_db``
    mark, any mode): ``applied = safeupdates_run_pending()``, or ``safeupdates_run_pending("other")``
    for another database."""
    return run_pending
