from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class BatchesConfig(AppConfig):
    """The batches of ``fan_out()``: their tables, their admin, and their step of the relay."""

    name = "safeupdates.contrib.batches"
    label = "safeupdates_batches"
    verbose_name = _("Safe updates: batches")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from safeupdates.contrib.batches.jobs import relay_batches
        from safeupdates.jobs import relay_steps

        if relay_batches not in relay_steps:
            relay_steps.append(relay_batches)
