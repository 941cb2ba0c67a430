"""The RQ worker class for projects that use safeupdates: RQ's own ``Worker``, made ready before it forks.

``rqworker`` forks a work horse per job, and the horse dies with the job: whatever a job loads on first
use (the content types of the models it writes, read from ``django_content_type``) is loaded again in
every horse, and the worker's own process, which never runs a job, never keeps it. This worker loads it
once, in its own process, before its first fork, so every horse inherits it. Select it in the settings::

    RQ = {"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"}

and run ``python manage.py rqworker default --with-scheduler`` as before (django-rq reads the setting;
``rqworker --worker-class`` overrides it). A worker class of your own gets the same from
:class:`WarmUpMixin`. Nothing is read at import or in ``AppConfig.ready()`` (Django advises against
touching the database there); a database that cannot be read when the worker starts is tried again
before a job, at most every :data:`RETRY_EVERY` seconds, and the jobs meanwhile read what they need
themselves, as they would without it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connections, router
from rq import SpawnWorker
from rq import Worker as RQWorker
from rq.job import Job
from rq.queue import Queue
from rq.utils import import_attribute

from safeupdates.database.registry import load_content_types, request_log

__all__ = ["WarmUpMixin", "Worker", "databases", "warm_up", "worker_class_problem"]

logger = logging.getLogger("safeupdates")


#: How long a worker waits before it tries again to load what failed to load (a database down).
RETRY_EVERY = 30.0


def databases() -> list[str]:
    """The databases that hold a request log, whose jobs this worker may run."""
    return [alias for alias in connections if router.allow_migrate_model(alias, request_log())]


def warm_up(aliases: Sequence[str] | None = None) -> list[str]:
    """Load what every apply job needs once per process, in this process: the content types of the
    models that hold versions, on each of ``aliases`` (by default :func:`databases`). Closes the
    connections it opened (a connection must never cross a fork). Never raises: returns the databases
    it could not read."""
    started = time.monotonic()
    counts: dict[str, int] = {}
    failed = []
    try:
        for alias in databases() if aliases is None else aliases:
            try:
                counts[alias] = load_content_types(alias)
            except Exception:  # down, or not migrated yet: its jobs load them themselves meanwhile
                logger.warning(
                    "safeupdates: the worker could not load the content types of database %r before its fork",
                    alias,
                    exc_info=True,
                )
                failed.append(alias)
    finally:
        connections.close_all()
    logger.debug(
        "safeupdates: the worker loaded the content types of %s before its fork in %.1f ms",
        ", ".join(f"{count} model(s) on {alias!r}" for alias, count in counts.items()) or "nothing",
        (time.monotonic() - started) * 1000,
    )
    return failed


class WarmUpMixin:
    """Mix into an RQ worker class that forks (``rq.Worker`` and its subclasses): runs :func:`warm_up`
    when the worker starts and, for a database it could not read, again before a job, at most every
    :data:`RETRY_EVERY` seconds."""

    _safeupdates_unloaded: Sequence[str] | None = None  # None: not tried yet
    _safeupdates_tried = 0.0

    def _safeupdates_warm_up(self) -> None:
        self._safeupdates_tried = time.monotonic()
        self._safeupdates_unloaded = warm_up(self._safeupdates_unloaded)

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)  # type: ignore[misc]
        self._safeupdates_warm_up()

    def execute_job(self, job: Job, queue: Queue) -> None:
        if self._safeupdates_unloaded is None or (
            self._safeupdates_unloaded and time.monotonic() - self._safeupdates_tried >= RETRY_EVERY
        ):
            self._safeupdates_warm_up()
        super().execute_job(job, queue)  # type: ignore[misc]


class Worker(WarmUpMixin, RQWorker):
    """RQ's ``Worker`` (a work horse forked per job) with :class:`WarmUpMixin`."""


def worker_class_problem() -> tuple[str, str, str] | None:
    """``(message, hint, check id)`` of a system check when django-rq's worker class (``RQ["WORKER_CLASS"]``,
    RQ's ``Worker`` by default) forks a work horse per job without :class:`WarmUpMixin`; None otherwise. A
    class that does not fork (``SimpleWorker``), one that starts each horse afresh (``SpawnWorker``: nothing
    it loads would reach the horse) and one that cannot be imported (django-rq says so) are not reported."""
    path = getattr(settings, "RQ", {}).get("WORKER_CLASS", RQWorker)
    try:
        worker_class = import_attribute(path) if isinstance(path, str) else path
    except Exception:  # a path that does not import: django-rq reports it when a worker starts
        return None
    if not isinstance(worker_class, type) or not issubclass(worker_class, RQWorker):
        return None
    if issubclass(worker_class, WarmUpMixin | SpawnWorker):
        return None
    # As the settings name it (RQ's classes live in modules other than those they are imported from).
    name = path if isinstance(path, str) else "rq.Worker" if path is RQWorker else worker_class.__qualname__
    return (
        f"RQ's worker class {name} forks a work horse per job, and every apply job reads again what a worker "
        "could have loaded once before its fork (the content types of the models it writes).",
        'Set RQ = {"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"} in the settings, or add '
        "safeupdates.delivery.rq_worker.WarmUpMixin to your worker class (docs/deployment.md, Running workers).",
        "safeupdates.W008",
    )
