"""Settings of the benchmark: the test settings, on a database and an RQ queue of the benchmark's own.

``BENCH_DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/safeupdates_bench``) is read instead
of ``DATABASE_URL``, so that a ``DATABASE_URL`` exported for the test suite never sends the benchmark, which
empties its tables, to another database. ``BENCH_REDIS_URL`` falls back to ``REDIS_URL``; the benchmark
only touches the keys of its own queue (:data:`BENCH_QUEUE`) and of the jobs it enqueues there.
"""

from __future__ import annotations

import environ

from tests.settings import *  # noqa: F403

env = environ.Env()

BENCH_QUEUE = "safeupdates-bench"
#: The queue of the latency benchmark (benchmarks/latency.py): its own, so that it never meets bench.py's jobs.
LATENCY_QUEUE = "safeupdates-bench-latency"

# Section 5 ("save()"): the models it saves, and django-concurrency for one of them.
INSTALLED_APPS = [*INSTALLED_APPS, "concurrency", "benchmarks.saveapp"]  # noqa: F405
# The app as a project installs it: the Prometheus receivers of the outcome signals (the test suite's
# contrib app) cost what the project's metrics cost, not the write path. BENCH_PROMETHEUS=1 keeps them.
if not env.bool("BENCH_PROMETHEUS", default=False):
    INSTALLED_APPS.remove("safeupdates.contrib.prometheus")

DATABASES = {"default": env.db("BENCH_DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/safeupdates_bench")}
# benchmarks/latency.py sets it for all its processes (--conn-max-age); Django's default otherwise.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("BENCH_CONN_MAX_AGE", default=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
REDIS_URL = env("BENCH_REDIS_URL", default=env("REDIS_URL", default="redis://127.0.0.1:6379/0"))
RQ_QUEUES = {
    "default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 60},
    BENCH_QUEUE: {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 60},
    LATENCY_QUEUE: {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 60},
}
SAFEUPDATES_QUEUE = BENCH_QUEUE
# The library's defaults, not the test suite's fast retries.
SAFEUPDATES_RETRY = {"max": 3, "interval": [1, 5, 15]}
SAFEUPDATES_RELAY_AFTER = 30
# Sections 2 and 3 also measure SAFEUPDATES_DELIVERY = "tasks" on django-tasks-db's backend ("db").
TASKS = {**TASKS, "db": {**TASKS["db"], "QUEUES": [*TASKS["db"]["QUEUES"], BENCH_QUEUE]}}  # noqa: F405
