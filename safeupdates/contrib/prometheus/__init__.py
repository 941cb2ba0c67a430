"""Prometheus metrics of safeupdates (the ``[prometheus]`` extra): add ``safeupdates.contrib.prometheus`` to
``INSTALLED_APPS`` and mount its view. Nothing of ``prometheus_client`` is imported unless the app is
installed. See docs/observability.md."""
