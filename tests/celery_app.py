"""The test suite's Celery app, made the way a Django project makes its own (Celery's "First steps with
Django"): ``tests/__init__.py`` imports it, so that it is Celery's current app, and its configuration is
the ``CELERY_*`` settings of ``tests.settings``. Workers run it as ``celery -A tests.celery_app worker``.

``CELERY_BROKER_URL`` comes from the environment (a test's own RabbitMQ vhost or its own redis-server);
``CELERY_RELAY_EVERY`` (seconds) adds the relay's ``celery beat`` entry, as docs/delivery.md shows it;
``SAFEUPDATES_TEST_SPANS`` (a file) makes every pool process export its OpenTelemetry spans there, one
JSON object a line.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

app = Celery("tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.conf.imports = ("tests.testapp.celery_tasks",)  # imported by the worker once Django is set up

if os.environ.get("CELERY_RELAY_EVERY"):
    every = float(os.environ["CELERY_RELAY_EVERY"])
    app.conf.beat_schedule = {
        "safeupdates-relay": {
            "task": "safeupdates.jobs.relay_pending",
            "schedule": every,
            "options": {"expires": every},
        },
    }

if os.environ.get("SAFEUPDATES_TEST_SPANS"):
    from celery.signals import worker_process_init

    @worker_process_init.connect(weak=False)  # type: ignore[untyped-decorator,misc,unused-ignore]
    def _export_spans(**kwargs: object) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

        out = open(os.environ["SAFEUPDATES_TEST_SPANS"], "a")  # noqa: SIM115  (for the process's life)
        exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
