"""The metrics: counters and a histogram fed by safeupdates' signals, gauges read from the request log.

Counters live in the process that counts (a web process, an RQ work horse). With several processes,
prometheus-client's multiprocess mode sums them: set ``PROMETHEUS_MULTIPROC_DIR`` to a directory shared
by the web and worker processes of a host, the same for all of them, before they start. RQ forks a new
work horse per job; the horses of one worker run one after another, so they share one set of files
(named after the worker) instead of leaving one set per job. The gauges (pending requests, the oldest
pending age) are not counted by any process: :class:`RequestLogCollector` reads them from the request
log at scrape time, with one indexed query, reused for ``SAFEUPDATES_METRICS_CACHE`` seconds.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

from django.db import router
from prometheus_client import CollectorRegistry, Counter, Histogram, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from safeupdates import conf, signals, status
from safeupdates.models import ProcessedRequest

__all__ = [
    "FIELD_WRITES",
    "LATENCY",
    "LOCK_TIMEOUTS",
    "RELAY_DELIVERIES",
    "RELAY_REVIVALS",
    "REQUESTS",
    "STALE_SAVES",
    "RequestLogCollector",
    "connect",
    "registry",
]

# The process that imported this module (an RQ worker's main process, a web server's): a forked child
# with RQ_WORKER_ID set is one of the worker's work horses.
_STARTED_IN = os.getpid()


def _process_identifier() -> str:
    """The name of this process's metric files: the pid; for an RQ work horse, its worker's name (the
    horses of one worker never run at the same time, and a new horse reads what the last one wrote)."""
    worker = os.environ.get("RQ_WORKER_ID")
    if worker and os.getpid() != _STARTED_IN:
        return "rq-" + re.sub(r"[^A-Za-z0-9_.-]", "_", worker)
    return str(os.getpid())


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR``, if prometheus-client runs in multiprocess mode."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


if multiprocess_dir():
    # Before the first metric: prometheus-client picks its value class when a metric is created.
    values.ValueClass = values.MultiProcessValue(_process_identifier)  # type: ignore[no-untyped-call]

# Not in prometheus-client's default registry: registry() decides what a scrape shows.
REQUESTS = Counter(
    "safeupdates_requests",
    "Update requests by outcome (applied, stale, duplicate, rejected, failed).",
    ["model", "outcome"],
    registry=None,
)
FIELD_WRITES = Counter(
    "safeupdates_field_writes",
    "Fields of update requests: written (outcome applied) or held by a newer write (outcome stale).",
    ["model", "field", "outcome"],
    registry=None,
)
LATENCY = Histogram(
    "safeupdates_request_latency_seconds",
    "Seconds from a request's creation to its outcome (the database's clock).",
    ["model"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
    registry=None,
)
STALE_SAVES = Counter(
    "safeupdates_stale_saves",
    "Writes refused because the record moved on since it was loaded, by surface (save, admin, form, http ...).",
    ["model", "surface"],
    registry=None,
)
LOCK_TIMEOUTS = Counter(
    "safeupdates_lock_timeouts",
    "Row locks not had in time (with_lock, @idempotent, a job's lock timeout).",
    ["model", "surface"],
    registry=None,
)
RELAY_DELIVERIES = Counter(
    "safeupdates_relay_deliveries", "Jobs the relay put on a queue (lost ones, stuck ones).", registry=None
)
RELAY_REVIVALS = Counter(
    "safeupdates_relay_revivals", "Failed update requests made pending again (--retry-failed).", registry=None
)

_OWN = (REQUESTS, FIELD_WRITES, LATENCY, STALE_SAVES, LOCK_TIMEOUTS, RELAY_DELIVERIES, RELAY_REVIVALS)


def _label(sender: Any) -> str:
    return sender._meta.label if sender is not None else ""


def _outcome(outcome: str) -> Any:
    def count(sender: Any, fields: tuple[str, ...] = (), held: Any = None, latency: Any = None, **kwargs: Any) -> None:
        model = _label(sender)
        REQUESTS.labels(model, outcome).inc()
        for name in fields:
            FIELD_WRITES.labels(model, name, "applied").inc()
        for name in held or {}:
            FIELD_WRITES.labels(model, name, "stale").inc()
        if latency is not None:
            LATENCY.labels(model).observe(latency)

    count.__name__ = f"count_{outcome}"
    return count


_RECEIVERS = {name: _outcome(name) for name in signals.OUTCOME_SIGNALS}


def _stale_save(sender: Any, surface: str = "", **kwargs: Any) -> None:
    STALE_SAVES.labels(_label(sender), surface).inc()


def _lock_timeout(sender: Any, surface: str = "", **kwargs: Any) -> None:
    LOCK_TIMEOUTS.labels(_label(sender), surface).inc()


def _relay(sender: Any, report: Any, **kwargs: Any) -> None:
    if not report.dry_run:
        RELAY_DELIVERIES.inc(report.enqueued)
        RELAY_REVIVALS.inc(report.revived or 0)


def connect() -> None:
    """Connect the counters to safeupdates' signals (the app's ``ready()`` does)."""
    for name, signal in signals.OUTCOME_SIGNALS.items():
        signal.connect(_RECEIVERS[name], dispatch_uid=f"safeupdates.prometheus.{name}")
    signals.stale_save_refused.connect(_stale_save, dispatch_uid="safeupdates.prometheus.stale_save")
    signals.lock_unavailable.connect(_lock_timeout, dispatch_uid="safeupdates.prometheus.lock_timeout")
    signals.relay_finished.connect(_relay, dispatch_uid="safeupdates.prometheus.relay")


class RequestLogCollector(Collector):
    """The gauges of the request log: pending requests and the oldest one's age, per model and queue.

    One query through the ``safeupdates_pending`` index (:func:`safeupdates.status.backlog`), reused for
    ``SAFEUPDATES_METRICS_CACHE`` seconds, so that several scrapers, or a scrape per web process, cost at
    most one query per period.
    """

    def __init__(self, using: str | None = None) -> None:
        self.using = using
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._backlog: list[status.Backlog] = []

    def backlog(self) -> list[status.Backlog]:
        with self._lock:
            if time.monotonic() - self._read_at >= conf.metrics_cache():
                self._backlog = status.backlog(self.using or router.db_for_write(ProcessedRequest))
                self._read_at = time.monotonic()
            return self._backlog

    def collect(self) -> Iterator[Metric]:
        pending = GaugeMetricFamily(
            "safeupdates_pending_requests", "Update requests waiting for their job.", labels=["model", "queue"]
        )
        oldest = GaugeMetricFamily(
            "safeupdates_oldest_pending_age_seconds",
            "Seconds since the oldest pending request was created (the database's clock).",
            labels=["model", "queue"],
        )
        for entry in self.backlog():
            pending.add_metric([entry.model, entry.queue], entry.pending)
            oldest.add_metric([entry.model, entry.queue], entry.oldest_age)
        yield pending
        yield oldest


_COLLECTOR = RequestLogCollector()


def registry() -> CollectorRegistry:
    """What a scrape shows: the counters (this process's, or in multiprocess mode every process's, from
    ``PROMETHEUS_MULTIPROC_DIR``) and the request log's gauges."""
    found = CollectorRegistry()  # no auto_describe: it would read the gauges once more
    if multiprocess_dir():
        MultiProcessCollector(found)  # type: ignore[no-untyped-call]
    else:
        for metric in _OWN:
            found.register(metric)
    found.register(_COLLECTOR)
    return found
