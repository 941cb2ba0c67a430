"""Which request a log line or a trace is about: the request id from ``enqueue_update()`` into its job.

The apply job runs inside :func:`job_context`: every log record emitted meanwhile, by safeupdates or by
your receivers, can carry the job's request id (:class:`RequestIdFilter`). Where OpenTelemetry is
installed (the ``[otel]`` extra, ``opentelemetry-api``), ``enqueue_update()`` opens a span
(:func:`enqueue_span`) whose context travels in the job's meta (never the changes), and the job continues
that trace. With ``SAFEUPDATES_DELIVERY = "tasks"`` the Tasks API has no job meta: the context travels in
the apply task's ``trace`` argument, beside the ids, and the task continues it (:func:`continue_trace`).
Without OpenTelemetry this module imports nothing of it and costs nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

__all__ = [
    "TRACE_META_KEY",
    "RequestIdFilter",
    "continue_trace",
    "enqueue_span",
    "job_context",
]

#: The key of an apply job's meta that carries the trace context of the ``enqueue_update()`` that queued it.
TRACE_META_KEY = "safeupdates_trace"

_TRACER = "safeupdates"
_request_id: ContextVar[str | None] = ContextVar("safeupdates_request_id", default=None)


class RequestIdFilter(logging.Filter):
    """A logging filter that gives every record a ``request_id`` attribute: the request id of the apply
    job that emits it, ``"-"`` outside one. A record that names its own request (safeupdates' outcome
    lines) keeps it. Add it to a handler and use ``%(request_id)s`` in its format."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get() or "-"
        return True


@lru_cache(maxsize=1)
def _opentelemetry() -> tuple[Any, Any] | None:
    """``(opentelemetry.trace, opentelemetry.propagate)``, or None if OpenTelemetry is not installed
    (looked up once: every ``enqueue_update()`` asks)."""
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    return trace, propagate


@contextmanager
def enqueue_span(model: str, pk: Any, request_id: str) -> Iterator[dict[str, str]]:
    """A span around an ``enqueue_update()`` (with OpenTelemetry); yields the carrier of its context to
    put in the job's meta (empty without OpenTelemetry, or without a trace to continue)."""
    otel = _opentelemetry()
    if otel is None:
        yield {}
        return
    trace, propagate = otel
    carrier: dict[str, str] = {}
    if not _recording(trace):
        # No tracer provider: the span would record nothing, and its context would be the current one.
        propagate.inject(carrier)
        yield carrier
        return
    attributes = {"safeupdates.model": model, "safeupdates.pk": str(pk), "safeupdates.request_id": request_id}
    with trace.get_tracer(_TRACER).start_as_current_span("safeupdates.enqueue_update", attributes=attributes):
        propagate.inject(carrier)
        yield carrier


def _recording(trace: Any) -> bool:
    """Whether a tracer provider is set (an SDK's, say): without one (the API's proxy, or its no-op
    provider) a span records nothing and carries its parent's context, at the cost of making one."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


@contextmanager
def continue_trace(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make the trace context of ``carrier`` (an apply task's ``trace`` argument) the current one inside
    the block, so that the apply span opened there (:func:`job_context`) continues the enqueue's trace.
    Nothing without OpenTelemetry or without a carrier."""
    otel = _opentelemetry() if carrier else None
    if otel is None:
        yield
        return
    from opentelemetry import context

    token = context.attach(otel[1].extract(dict(carrier or {})))
    try:
        yield
    finally:
        context.detach(token)


@contextmanager
def job_context(request_id: str, carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Run an apply job for ``request_id``: its log records carry the id (:class:`RequestIdFilter`), and
    with OpenTelemetry its span continues the trace of ``carrier`` (the job's meta)."""
    token = _request_id.set(request_id)
    try:
        otel = _opentelemetry()
        if otel is None:
            yield
            return
        trace, propagate = otel
        parent = propagate.extract(dict(carrier)) if carrier else None
        with trace.get_tracer(_TRACER).start_as_current_span(
            "safeupdates.apply_update", context=parent, attributes={"safeupdates.request_id": request_id}
        ):
            yield
    finally:
        _request_id.reset(token)
