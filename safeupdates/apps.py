from __future__ import annotations

import importlib
import importlib.util

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SafeUpdatesConfig(AppConfig):
    name = "safeupdates"
    verbose_name = _("Safe updates")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from safeupdates import checks, conf, tracing  # checks: registers the system checks
        from safeupdates.versions import floor_after_migrate

        # After every migrate: the source may have been dropped and created again at 1.
        post_migrate.connect(floor_after_migrate, sender=self, dispatch_uid="safeupdates.raise_floor")
        # OpenTelemetry's propagator (where it is installed), imported here once rather than by the first job:
        # rqworker forks a work horse per job, and what a horse imports dies with it (6.4 ms a job, issue 57).
        # No database is touched.
        tracing._opentelemetry()
        # With celery delivery the apply task registers with the Celery apps here, in the web process and in the
        # worker alike (Celery's Django fix-up sets Django up before the worker consumes).
        if conf.uses_celery() and importlib.util.find_spec("celery") is not None:
            importlib.import_module("safeupdates.delivery.celery")
        # With tasks delivery the apply task is declared here, and Django's Tasks framework imported with it:
        # Django 6 registers its task backends' own system checks (a backend's missing app ...) only when
        # django.tasks is imported, which nothing else does before `manage.py check` runs the checks.
        if conf.uses_tasks() and checks.tasks_available():
            importlib.import_module("safeupdates.delivery.tasks")
