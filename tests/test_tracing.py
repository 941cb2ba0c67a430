"""The request id from enqueue_update() into its job: every log record of the job carries it, and with
OpenTelemetry the job's span continues the trace of the enqueue (its context rides in the RQ job's meta, or
in the apply task's ``trace`` argument with SAFEUPDATES_DELIVERY = "tasks")."""

from __future__ import annotations

import logging

import django_rq
import pytest
from django.test import override_settings
from django_tasks_db.management.commands.db_worker import Worker as DBWorker
from django_tasks_db.models import DBTaskResult
from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rq import SimpleWorker

from safeupdates import enqueue_update, signals, tracing
from safeupdates.delivery import tasks as taskqueue
from tests.factories import ProfileFactory

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans():
    """Finished spans, through an in-memory exporter on the global tracer provider (set once)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


class Records(logging.Handler):
    """A handler that keeps what passes its filters."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.addFilter(tracing.RequestIdFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def run_queued_jobs() -> None:
    """Run what the queue holds with a real RQ worker in this process (it fetches the jobs from Redis)."""
    queue = django_rq.get_queue("default")
    assert SimpleWorker([queue], connection=queue.connection).work(burst=True)


def enqueue_and_apply_spans(spans):
    """The enqueue span and the apply span of the one request traced; the apply span a child of the
    enqueue span, in its trace."""
    by_name = {span.name: span for span in spans.get_finished_spans()}
    enqueue, apply = by_name["safeupdates.enqueue_update"], by_name["safeupdates.apply_update"]
    assert apply.context.trace_id == enqueue.context.trace_id
    assert apply.parent is not None and apply.parent.span_id == enqueue.context.span_id
    return enqueue, apply


@pytest.mark.django_db(transaction=True)
def test_the_job_continues_the_trace_of_its_enqueue(redis, spans):
    profile = ProfileFactory()
    request = enqueue_update(profile, active=True)
    [job] = django_rq.get_queue("default").jobs
    carrier = job.meta[tracing.TRACE_META_KEY]
    assert set(carrier) == {"traceparent"}  # the context, never the changes
    run_queued_jobs()
    request.refresh_from_db()
    assert request.status == "applied"
    enqueue, apply = enqueue_and_apply_spans(spans)
    assert enqueue.attributes["safeupdates.request_id"] == str(request.request_id)
    assert enqueue.attributes["safeupdates.model"] == "testapp.Profile"
    assert enqueue.attributes["safeupdates.pk"] == str(profile.pk)
    assert apply.attributes["safeupdates.request_id"] == str(request.request_id)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("incoming", [True, False])
def test_without_a_tracer_provider_the_job_carries_the_incoming_context_and_no_span_is_made(
    redis, spans, monkeypatch, incoming
):
    """With the OpenTelemetry API and no provider set (the API's proxy), no span is made; the job carries
    the context the enqueue ran in (a web request's, propagated from its caller), as a span of the proxy
    would have, and nothing when there is none."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    parent = trace.SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=trace.TraceFlags(1))
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(parent))) if incoming else None
    try:
        enqueue_update(ProfileFactory(), active=True)
    finally:
        if token is not None:
            context.detach(token)
    [job] = django_rq.get_queue("default").jobs
    if incoming:
        assert job.meta[tracing.TRACE_META_KEY] == {"traceparent": f"00-{0x1234:032x}-{0x5678:016x}-01"}
    else:
        assert tracing.TRACE_META_KEY not in job.meta  # no context: the job's meta carries none
    assert spans.get_finished_spans() == ()


def run_db_tasks() -> None:
    """Run the ready tasks of the "db" backend with django-tasks-db's db_worker, in this process."""
    worker = DBWorker(
        queue_names=["default"],
        interval=0,
        batch=True,
        backend_name="db",
        startup_delay=False,
        max_tasks=None,
        worker_id="tracing-test",
        excluded_queue_names=[],
    )
    worker.run()


@pytest.mark.django_db(transaction=True)
@override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="db")
def test_the_task_continues_the_trace_of_its_enqueue(spans):
    """With tasks delivery the trace context rides in the task's arguments, beside the ids (the Tasks
    API has no job meta): the task's span continues the trace of the enqueue, as an RQ job's does."""
    profile = ProfileFactory()
    request = enqueue_update(profile, name="secret value")
    [task] = DBTaskResult.objects.filter(task_path=taskqueue.APPLY_TASK)
    kwargs = task.args_kwargs["kwargs"]
    assert set(kwargs) == {"record", "attempt", "using", "trace"}
    assert set(kwargs["trace"]) == {"traceparent"}  # the context, never the changes
    assert "secret value" not in str(task.args_kwargs)
    run_db_tasks()
    request.refresh_from_db()
    assert request.status == "applied"
    _enqueue, apply = enqueue_and_apply_spans(spans)
    assert apply.attributes["safeupdates.request_id"] == str(request.request_id)


@pytest.mark.django_db(transaction=True)
@override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="default")
def test_the_immediate_task_continues_the_trace_of_its_enqueue(spans):
    """On the immediate backend the task runs at commit, after the enqueue's span has ended: it is
    still that span's child, through the carrier."""
    profile = ProfileFactory()
    request = enqueue_update(profile, active=True)  # autocommit: the task ran
    request.refresh_from_db()
    assert request.status == "applied"
    enqueue_and_apply_spans(spans)


@pytest.mark.django_db(transaction=True)
@override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="db")
def test_a_task_without_a_trace_starts_its_own(spans):
    """A task enqueued without a carrier (by the relay, or by a web process of an earlier release) runs
    and opens a root span."""
    profile = ProfileFactory()
    request = enqueue_update(profile, active=True)
    DBTaskResult.objects.all().delete()
    taskqueue.deliver(request.request_id, request.content_type_id, request.object_id, "default")
    [task] = DBTaskResult.objects.filter(task_path=taskqueue.APPLY_TASK)
    assert "trace" not in task.args_kwargs["kwargs"]
    run_db_tasks()
    request.refresh_from_db()
    assert request.status == "applied"
    [apply] = [span for span in spans.get_finished_spans() if span.name == "safeupdates.apply_update"]
    assert apply.parent is None


@pytest.mark.django_db(transaction=True)
def test_every_log_record_of_the_job_carries_its_request_id(redis):
    """The outcome lines name their own request; anything else logged during the job (here a receiver's
    line) gets the job's request id from the filter; outside a job, "-"."""
    profile = ProfileFactory()
    first = enqueue_update(profile, active=True)
    second = enqueue_update(profile, newsletter=True)  # the same job applies it

    def receiver(sender, request_id, **kwargs):
        logging.getLogger("myapp").info("cache invalidated for %s", request_id)

    handler = Records()
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    signals.request_applied.connect(receiver, weak=False, dispatch_uid="tests.tracing")
    try:
        run_queued_jobs()
        logging.getLogger("myapp").info("outside a job")
    finally:
        signals.request_applied.disconnect(dispatch_uid="tests.tracing")
        root.removeHandler(handler)
        root.setLevel(level)
    outcome_lines = [r for r in handler.records if r.name == "safeupdates.lifecycle"]
    assert [(r.request_id, r.outcome, r.model, r.pk, r.version) for r in outcome_lines] == [
        (str(first.request_id), "applied", "testapp.Profile", profile.pk, first.version),
        (str(second.request_id), "applied", "testapp.Profile", profile.pk, second.version),
    ]
    assert outcome_lines[0].getMessage() == (
        f"safeupdates: request {first.request_id} applied: testapp.Profile pk={profile.pk} "
        f"version={first.version} fields=active"
    )
    mine = [r.request_id for r in handler.records if r.name == "myapp"]
    assert mine == [str(first.request_id), str(first.request_id), "-"]


@pytest.mark.django_db(transaction=True)
def test_update_if_newer_logs_its_outcome(caplog):
    """One line per outcome of ``update_if_newer(request_id=...)`` too (one statement on PostgreSQL)."""
    import uuid

    from safeupdates.versions import next_version
    from tests.testapp.models import Profile

    profile, rid = ProfileFactory(), uuid.uuid4()
    version = next_version()
    with caplog.at_level(logging.INFO, logger="safeupdates.lifecycle"):
        Profile.objects.update_if_newer(profile.pk, version=version, request_id=rid, active=True)
        Profile.objects.update_if_newer(profile.pk, version=version, request_id=rid, active=True)
    assert [r.getMessage() for r in caplog.records if r.name == "safeupdates.lifecycle"] == [
        f"safeupdates: request {rid} applied: testapp.Profile pk={profile.pk} version={version} fields=active",
        f"safeupdates: request {rid} duplicate: testapp.Profile pk={profile.pk} version={version}",
    ]
