"""``path("metrics/", include("safeupdates.contrib.prometheus.urls"))`` mounts the metrics view."""

from __future__ import annotations

from django.urls import path

from safeupdates.contrib.prometheus.views import metrics

urlpatterns = [path("", metrics, name="safeupdates_metrics")]
