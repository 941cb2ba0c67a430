"""Settings of the test suite: real PostgreSQL and Redis by default (``DATABASE_URL``, ``REDIS_URL``)."""

from __future__ import annotations

import os
from pathlib import Path

import django
import environ
from django.core.exceptions import ImproperlyConfigured

from tests.pooler import TOPOLOGIES

env = environ.Env()

SECRET_KEY = "safeupdates-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_rq",
    "safeupdates",
    "safeupdates.contrib.batches",
    "safeupdates.contrib.controls",
    "safeupdates.contrib.idempotent",
    "safeupdates.contrib.prometheus",
    "tests.testapp",
    "tests.django_contract",
    "demo_project.toggles",
    # SAFEUPDATES_DELIVERY = "tasks" (tests/test_tasks_delivery.py): django-tasks-db's task table.
    "django_tasks_db",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")  # the backport of django.tasks

DATABASES = {"default": env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/safeupdates")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's, but a flush between transactional tests DELETEs instead of TRUNCATE (tests/backends/postgresql).
    DATABASES["default"]["ENGINE"] = "tests.backends.postgresql"
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The quick start's options, and WAL (docs/quickstart.md): in SQLite's default rollback journal a
    # writer's COMMIT waits until every reader is done, and a waiting connection's busy handler sleeps up
    # to 100 ms at a time; with WAL readers never hold up the writer, and synchronous=NORMAL (WAL's usual
    # companion: no fsync per commit) shortens each hold of the write lock. The stress test alone, on a
    # loaded machine: 60 to 73 s without either, 46 to 51 s with WAL, 27 to 30 s with both. The workers
    # the tests start read these settings (synchronous is per connection; WAL stays with the file).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
        }
    )
    DATABASES["default"].setdefault("TEST", {})["NAME"] = env("SQLITE_TEST_NAME", default="test_safeupdates.sqlite3")

# How the suite reaches PostgreSQL (tests/pooler.py; docs/testing.md): ``direct`` (the default),
# ``pgbouncer-transaction``, ``pgbouncer-session`` and ``pgbouncer-prepared`` (through the PgBouncer on port
# SAFEUPDATES_TEST_POOLER_PORT, which ``python -m tests.pooler TOPOLOGY -- COMMAND`` starts), ``django-pool``
# (Django's psycopg_pool, max_size 2) and ``persistent`` (CONN_MAX_AGE with CONN_HEALTH_CHECKS).
SAFEUPDATES_TEST_TOPOLOGY = env("SAFEUPDATES_TEST_TOPOLOGY", default="direct")
_TOPOLOGIES = set(TOPOLOGIES)
if SAFEUPDATES_TEST_TOPOLOGY not in _TOPOLOGIES:
    raise ImproperlyConfigured(f"SAFEUPDATES_TEST_TOPOLOGY={SAFEUPDATES_TEST_TOPOLOGY!r}")
if SAFEUPDATES_TEST_TOPOLOGY != "direct" and DATABASES["default"]["ENGINE"] == "tests.backends.postgresql":
    if SAFEUPDATES_TEST_TOPOLOGY.startswith("pgbouncer-"):
        DATABASES["default"]["HOST"] = "127.0.0.1"
        DATABASES["default"]["PORT"] = env("SAFEUPDATES_TEST_POOLER_PORT")
    if SAFEUPDATES_TEST_TOPOLOGY == "pgbouncer-transaction":
        # What Django asks for behind a transaction pooler, and what safeupdates' docs ask for behind
        # PgBouncer < 1.22 (no max_prepared_statements): system checks W004 and E029.
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
        SAFEUPDATES_PREPARED_STATEMENTS = False
    elif SAFEUPDATES_TEST_TOPOLOGY == "pgbouncer-prepared":
        # PgBouncer 1.22+ in transaction mode with max_prepared_statements: what docs/deployment.md asks for.
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
        SAFEUPDATES_PREPARED_STATEMENTS = True
    elif SAFEUPDATES_TEST_TOPOLOGY == "django-pool":
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 0, "max_size": 2, "timeout": 30}
    elif SAFEUPDATES_TEST_TOPOLOGY == "persistent":
        DATABASES["default"]["CONN_MAX_AGE"] = 600
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

# A second database on the same server, for the database-per-tenant tests (tests/test_routing.py);
# pytest-django creates its test database only when one of them runs.
# On SQLite its test database sits beside the default one (SQLITE_TEST_NAME may be a path).
_default_test_name = DATABASES["default"].get("TEST", {}).get("NAME")
DATABASES["tenant"] = {
    **DATABASES["default"],
    # A process a test starts is given the test database's name in DATABASE_URL; under xdist the tenant's
    # test database is not that name + "_tenant" (see below), so its name comes in the environment.
    "NAME": env("SAFEUPDATES_TEST_TENANT_NAME", default=f"{DATABASES['default']['NAME']}_tenant"),
    "TEST": {
        "NAME": str(Path(_default_test_name).with_name(f"tenant_{Path(_default_test_name).name}"))
        if _default_test_name
        else None
    },
}

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/15")
# Under pytest-xdist (make test runs two workers) each worker has a test database of its own (pytest-django
# names it ..._gw0, ..._gw1) and a Redis database of its own: worker gwN uses the one N below REDIS_URL's.
# The worker puts it in its environment, marked as chosen: its rqworkers and commands inherit both and
# keep it, where they would otherwise move N below again.
_XDIST_WORKER = env("PYTEST_XDIST_WORKER", default="")
if _XDIST_WORKER[2:].isdigit() and not env.bool("SAFEUPDATES_TEST_REDIS_CHOSEN", default=False):
    _base, _, _db = REDIS_URL.rpartition("/")
    if _db.isdigit():
        REDIS_URL = f"{_base}/{(int(_db) - int(_XDIST_WORKER[2:])) % 16}"
    os.environ.update(REDIS_URL=REDIS_URL, SAFEUPDATES_TEST_REDIS_CHOSEN="1")
    if not DATABASES["tenant"]["TEST"]["NAME"]:
        # pytest-django names the tenant's test database test_<NAME>_tenant_gwN; the worker's processes
        # (whose start-up checks connect to every database on Django 6.1) must find it by that name.
        os.environ["SAFEUPDATES_TEST_TENANT_NAME"] = f"test_{DATABASES['tenant']['NAME']}_{_XDIST_WORKER}"
RQ_QUEUES = {
    "default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 60},
    "fast": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 60},
    "slow": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 600},
}
SAFEUPDATES_RETRY = {"max": 2, "interval": [0, 1]}

# Django's Tasks framework, for SAFEUPDATES_DELIVERY = "tasks" (the suite runs on "rq"; tests and their
# db_worker processes switch through the environment or override_settings).
_TASKS_PACKAGE = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
TASKS = {
    "default": {"BACKEND": f"{_TASKS_PACKAGE}.backends.immediate.ImmediateBackend", "QUEUES": []},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "fast", "slow"]},
    # Without QUEUES: those of RQ_QUEUES (settings based on these, the benchmark's, have other queues).
    "rq": {"BACKEND": "django_tasks_rq.RQBackend"},
}
SAFEUPDATES_DELIVERY = env("SAFEUPDATES_DELIVERY", default="rq")
SAFEUPDATES_TASK_BACKEND = env("SAFEUPDATES_TASK_BACKEND", default="db")
# The worker class docs/deployment.md tells projects to use (system check W008): the suite's rqworkers run it.
RQ = {"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"}
if SAFEUPDATES_DELIVERY == "tasks" and SAFEUPDATES_TASK_BACKEND == "rq":
    # rqworkers of django-tasks-rq's backend run its jobs with its job class (it calls the task).
    RQ["JOB_CLASS"] = "django_tasks_rq.Job"
SAFEUPDATES_RELAY_AFTER = 0

# SAFEUPDATES_DELIVERY = "celery" (tests/test_celery_delivery.py): the configuration of tests.celery_app, whose
# broker a test names through the environment (its own RabbitMQ vhost or redis-server).
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="memory://")
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=None)  # a worker test keeps its connection
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # with acks_late: a worker holds no more than it runs
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# Django's advice for tests ("Speeding up the tests"): the default PBKDF2 takes 0.43 s a password here,
# and every admin_user, create_user() and login() of the suite hashes one. No test is about the hash.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"rq.worker": {"handlers": ["console"], "level": "WARNING"}},
}
