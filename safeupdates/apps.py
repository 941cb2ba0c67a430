from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SafeUpdatesConfig(AppConfig):
    name = "safeupdates"
    verbose_name = _("Safe updates")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from safeupdates import checks, delivery, tracing  # noqa: F401 (checks: registers the system checks)
        from safeupdates.versions import floor_after_migrate

        # After every migrate: the source may have been dropped and created again at 1.
        post_migrate.connect(floor_after_migrate, sender=self, dispatch_uid="safeupdates.raise_floor")
        # OpenTelemetry's propagator (where it is installed), imported here once rather than by the first job:
        # rqworker forks a work horse per job, and what a horse imports dies with it (6.4 ms a job, issue 57).
        # No database is touched.
        tracing._opentelemetry()
        # The delivery backend's module (Celery's tasks register with the Celery apps as it is imported, in the
        # web process and in the worker alike) and its own start-up.
        delivery.ready()
