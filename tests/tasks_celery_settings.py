"""Settings of the Celery workers that run Django tasks for django-tasks-celery's backend
(tests/test_task_backends.py): the suite's own, with that backend in ``TASKS`` as ``"celery"``. A worker is
``celery -A tests.celery_app worker`` with ``DJANGO_SETTINGS_MODULE`` naming this module,
``SAFEUPDATES_DELIVERY=tasks`` and ``SAFEUPDATES_TASK_BACKEND=celery``; the test process adds the same
backend with ``override_settings``, on its own Celery app (:data:`TASKS_CELERY`)."""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import TASKS as SUITE_TASKS

#: django-tasks-celery's backend (Django 6.0+) on the suite's Celery app, whose broker a test names through
#: ``CELERY_BROKER_URL`` (its own RabbitMQ vhost). The backend publishes each task as a Celery message named
#: after the task's module path; a worker runs it once it has imported the task, so the workers import the
#: apply task's module at start (``CELERY_INCLUDE``, what ``celery worker --include`` sets).
TASKS_CELERY = {
    "BACKEND": "django_tasks_celery.CeleryBackend",
    "QUEUES": ["default"],
    "OPTIONS": {"CELERY_APP": "tests.celery_app.app"},
}
TASKS = {**SUITE_TASKS, "celery": TASKS_CELERY}
CELERY_INCLUDE = ["safeupdates.delivery.tasks"]
