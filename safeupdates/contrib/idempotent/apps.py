from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdempotentConfig(AppConfig):
    """``@idempotent`` side effects. Their rows are the request log's (``kind=task``): no tables of its own."""

    name = "safeupdates.contrib.idempotent"
    label = "safeupdates_idempotent"
    verbose_name = _("Safe updates: idempotent tasks")
