from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ControlsConfig(AppConfig):
    """``enqueue()`` with job controls (unique, serial, throttle). It has no tables."""

    name = "safeupdates.contrib.controls"
    label = "safeupdates_controls"
    verbose_name = _("Safe updates: job controls")
