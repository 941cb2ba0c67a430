"""The RQ worker class for projects that use safeupdates: RQ's own ``Worker``, with the apply jobs run in
the worker's own process.

``rqworker`` forks a work horse per job, and the horse dies with the job: every apply job would connect
to the database afresh (a new PostgreSQL backend, whose first statements read the catalog again) and load
again what it needs (the content types of the models it writes). This worker runs the apply jobs
(``safeupdates.jobs.apply_update``: short, and bounded by their statement and job timeouts) in its own
process, as RQ's ``SimpleWorker`` runs every job, on a connection kept between them as Django keeps a
request's: :func:`django.db.close_old_connections` before and after each, so ``CONN_MAX_AGE`` and
``CONN_HEALTH_CHECKS`` decide how long it lives (with the default ``CONN_MAX_AGE = 0``, each job connects
afresh). Every other job still runs in a work horse, and no connection of the worker crosses that fork.
Select it in the settings::

    RQ = {"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"}

and run ``python manage.py rqworker default --with-scheduler`` as before (django-rq reads the setting;
``rqworker --worker-class`` overrides it). A worker class of your own gets the same from
:class:`AppliesInProcessMixin`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections
from rq import SimpleWorker
from rq import Worker as RQWorker
from rq.job import Job
from rq.queue import Queue
from rq.utils import import_attribute
from rq.worker import WorkerStatus

from safeupdates.delivery import APPLY_UPDATE


class AppliesInProcessMixin:
    """Mix into an RQ worker class that forks (``rq.Worker`` and its subclasses): runs the apply jobs in
    the worker's own process, on a connection kept between jobs, and forks for every other job."""

    def execute_job(self, job: Job, queue: Queue) -> None:
        if job.func_name != APPLY_UPDATE:
            connections.close_all()  # a connection must never cross a fork: the horse would share its socket
            super().execute_job(job, queue)  # type: ignore[misc]
            return
        worker: Any = self
        execution = worker.prepare_execution(job)
        close_old_connections()
        try:
            worker.perform_job(job, queue, execution)
        finally:
            close_old_connections()
        worker.set_state(WorkerStatus.IDLE)

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        # A job in this process keeps the worker from its heartbeat until it ends: its TTL covers the job's.
        if job.func_name == APPLY_UPDATE:
            return SimpleWorker.get_heartbeat_ttl(self, job, working_time)  # type: ignore[arg-type]
        return super().get_heartbeat_ttl(job, working_time)  # type: ignore[misc,no-any-return]


class Worker(AppliesInProcessMixin, RQWorker):
    """RQ's ``Worker`` (a work horse forked per job) with :class:`AppliesInProcessMixin`."""


def worker_class_problem() -> tuple[str, str, str] | None:
    """``(message, hint, check id)`` of a system check when django-rq's worker class (``RQ["WORKER_CLASS"]``,
    RQ's ``Worker`` by default) runs each job in a new process (a fork, or a spawn) without
    :class:`AppliesInProcessMixin`; None otherwise. A class that does not fork (``SimpleWorker``) and one
    that cannot be imported (django-rq says so) are not reported."""
    path = getattr(settings, "RQ", {}).get("WORKER_CLASS", RQWorker)
    try:
        worker_class = import_attribute(path) if isinstance(path, str) else path
    except Exception:  # a path that does not import: django-rq reports it when a worker starts
        return None
    if not isinstance(worker_class, type) or not issubclass(worker_class, RQWorker):
        return None
    if issubclass(worker_class, AppliesInProcessMixin):
        return None
    # As the settings name it (RQ's classes live in modules other than those they are imported from).
    name = path if isinstance(path, str) else "rq.Worker" if path is RQWorker else worker_class.__qualname__
    return (
        f"RQ's worker class {name} runs every apply job in a new work horse, which connects to the database "
        "afresh and loads again what the job needs.",
        'Set RQ = {"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"} in the settings, or add '
        "safeupdates.delivery.rq_worker.AppliesInProcessMixin to your worker class "
        "(docs/deployment.md, Running workers).",
        "safeupdates.W008",
    )
