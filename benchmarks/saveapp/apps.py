from __future__ import annotations

from django.apps import AppConfig


class SaveAppConfig(AppConfig):
    name = "benchmarks.saveapp"
    label = "bench_save"
    default_auto_field = "django.db.models.BigAutoField"
