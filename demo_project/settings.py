"""Settings of the demo project, configured from the environment with django-environ.

``DATABASE_URL`` (default: a SQLite file ``demo.sqlite3``) and ``REDIS_URL`` (default
``redis://127.0.0.1:6379/0``); ``DELIVERY`` (``rq``, the default, ``tasks`` or ``celery``) and, with
``celery``, ``CELERY_BROKER_URL`` (default: ``REDIS_URL``).
"""

from __future__ import annotations

from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = env("SECRET_KEY", default="safeupdates-demo-not-secret")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "demo_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "toggles:home"
LOGOUT_REDIRECT_URL = "login"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_rq",
    "safeupdates",
    "safeupdates.contrib.batches",
    "safeupdates.contrib.controls",
    "safeupdates.contrib.idempotent",
    "safeupdates.contrib.prometheus",  # /metrics/ (docs/observability.md)
    "demo_project.toggles",
]

# `DELIVERY=tasks make demo`: apply jobs as Django tasks on django-tasks-db's database backend, run by
# `manage.py db_worker`; no Redis (docs/delivery.md). The job tools that need RQ stay installed for the
# other pages of the demo: their warning (W021) is silenced, with Celery too.
SAFEUPDATES_DELIVERY = env("DELIVERY", default="rq")
INSTALLED_APPS += ["django_tasks_db"] + (["django_tasks"] if django.VERSION < (6, 0) else [])
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "race_demo"]}}
SILENCED_SYSTEM_CHECKS = ["safeupdates.W021"] if SAFEUPDATES_DELIVERY != "rq" else []

# `DELIVERY=celery make demo`: apply jobs as tasks of the demo's Celery app (demo_project/celery.py, whose
# configuration is these CELERY_* settings), run by `celery -A demo_project worker` processes. Its broker is
# the demo's Redis unless CELERY_BROKER_URL names another (amqp://guest:guest@127.0.0.1:5672// for RabbitMQ).
# The app is named by its path: nothing here imports Celery, which the other deliveries do not need.
SAFEUPDATES_CELERY_APP = "demo_project.celery.app"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'demo.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Take the write lock at BEGIN: concurrent workers then wait (timeout) instead of failing to upgrade.
    DATABASES["default"].setdefault("OPTIONS", {}).update({"transaction_mode": "IMMEDIATE", "timeout": 20})

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
RQ_QUEUES = {
    "default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 60},
    "slow": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 600},  # reports, exports: enqueue(..., queue="slow")
    # Only `manage.py race_demo` uses this queue, with workers it starts itself: it empties it freely.
    "race_demo": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 60},
}
# Loads what every apply job needs once, before a work horse is forked (docs/deployment.md; check W008).
RQ = {"WORKER_CLASS": "safeupdates.delivery.rq_worker.Worker"}
SAFEUPDATES_QUEUE = "default"  # toggles: milliseconds
SAFEUPDATES_FAST_QUEUE = "default"  # enqueue() without queue=
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # with acks_late: a worker holds no more than it runs
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# The relay of `make serve` re-delivers requests still pending after this many seconds.
SAFEUPDATES_RELAY_AFTER = env.int("SAFEUPDATES_RELAY_AFTER", default=10)

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
    "filters": {
        # The toggle page polls its state every second or so: keep runserver's log for the clicks.
        "no_state_polls": {
            "()": "django.utils.log.CallbackFilter",
            "callback": lambda record: (
                "/state/ " not in record.getMessage() or getattr(record, "status_code", 0) >= 400
            ),
        }
    },
    "formatters": {
        "server": {"()": "django.utils.log.ServerFormatter", "format": "[{server_time}] {message}", "style": "{"}
    },
    "handlers": {"server": {"class": "logging.StreamHandler", "formatter": "server", "filters": ["no_state_polls"]}},
    "loggers": {"django.server": {"handlers": ["server"], "level": "INFO", "propagate": False}},
}
