from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SafeUpdatesConfig(AppConfig):
    name = "safeupdates"
    verbose_name = _("Safe updates")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from safeupdates import checks  # noqa: F401  (registers the system checks)
