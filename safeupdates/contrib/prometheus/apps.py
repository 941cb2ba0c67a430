from __future__ import annotations

import importlib.util

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _


class PrometheusConfig(AppConfig):
    """Prometheus metrics: counters fed by safeupdates' signals, gauges read from the request log."""

    name = "safeupdates.contrib.prometheus"
    label = "safeupdates_prometheus"
    verbose_name = _("Safe updates: Prometheus metrics")

    def ready(self) -> None:
        if importlib.util.find_spec("prometheus_client") is None:
            raise ImproperlyConfigured(
                "safeupdates.contrib.prometheus needs prometheus-client: pip install "
                "'django-safeupdates[prometheus]', or remove the app from INSTALLED_APPS."
            )
        from safeupdates.contrib.prometheus import metrics

        metrics.connect()
