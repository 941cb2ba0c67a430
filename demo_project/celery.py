"""The demo project's Celery app, made the way Celery's "First steps with Django" makes a project's app:
configured from the Django settings whose names start with ``CELERY_`` (``CELERY_BROKER_URL`` ...).

``DELIVERY=celery make demo`` (and ``make serve``) run its workers as ``celery -A demo_project worker``:
Celery finds this module's ``app`` through the package. The package's ``__init__`` does not import it
(Celery is an optional extra, and the RQ demo runs without it): the web process and ``race_demo`` find it
through ``SAFEUPDATES_CELERY_APP = "demo_project.celery.app"`` (demo_project/settings.py).

``race_demo`` counts what the workers run (its table's "jobs run", "duplicates absorbed", and whether
the SIGKILL hit a running task) through Celery's task signals, in Redis: only in workers whose
environment names a key prefix in ``DEMO_CELERY_COUNTS`` (the workers ``race_demo`` starts).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")

app = Celery("demo_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The demo's own naive task (race_demo's comparison), imported by the worker once Django is set up.
# safeupdates registers its apply task itself (its app config imports it with celery delivery).
app.conf.imports = ("demo_project.toggles.celery_tasks",)


#: What ``race_demo`` reads of a round (:func:`counts_key`): per task id, what it returned; per worker
#: process id, how many tasks its pool runs now.
def counts_key(prefix: str, what: str) -> str:
    """The Redis key of the counts ``what`` (``done`` or ``running``) under ``prefix``."""
    return f"{prefix}:{what}"


if os.environ.get("DEMO_CELERY_COUNTS"):
    from celery.signals import task_postrun, task_prerun

    _prefix = os.environ["DEMO_CELERY_COUNTS"]

    @functools.cache
    def _redis() -> Any:
        """A client of the demo's Redis, one per pool process (made after the fork, by its first task)."""
        from django.conf import settings
        from redis import Redis

        return Redis.from_url(settings.REDIS_URL)

    #: The counts outlive a race_demo stopped midway by an hour at most.
    _KEEP = 3600

    @task_prerun.connect(weak=False)  # type: ignore[untyped-decorator,misc,unused-ignore]
    def _started(**kwargs: Any) -> None:
        # A pool process: its parent is the worker that race_demo started (and may kill).
        with _redis().pipeline() as pipe:
            pipe.hincrby(counts_key(_prefix, "running"), str(os.getppid()), 1)
            pipe.expire(counts_key(_prefix, "running"), _KEEP)
            pipe.execute()

    @task_postrun.connect(weak=False)  # type: ignore[untyped-decorator,misc,unused-ignore]
    def _finished(task_id: str = "", retval: Any = None, state: str = "", **kwargs: Any) -> None:
        with _redis().pipeline() as pipe:
            pipe.hincrby(counts_key(_prefix, "running"), str(os.getppid()), -1)
            if state != "RETRY":  # a retry is a new message under the same id: counted when it ends
                pipe.hset(counts_key(_prefix, "done"), task_id, json.dumps(retval, default=str))
                pipe.expire(counts_key(_prefix, "done"), _KEEP)
            pipe.execute()
