from __future__ import annotations

from django.apps import AppConfig


class TogglesConfig(AppConfig):
    """The toggle page, its ``Profile`` model and the ``race_demo`` command."""

    name = "demo_project.toggles"
    label = "toggles"
    verbose_name = "Toggles (demo)"
    default_auto_field = "django.db.models.BigAutoField"
