"""Receivers of safeupdates' signals for tests with real workers: each one pushes what it got to a Redis
list that the test reads. Connected in worker processes started with ``SAFEUPDATES_TEST_SIGNALS=1``."""

from __future__ import annotations

import json
from typing import Any

from django.db import connections

from safeupdates import signals

#: The Redis list the recording receivers push to (one JSON object per signal).
RECORDED_KEY = "safeupdates-test:signals"


def _recorder(name: str) -> Any:
    def record(sender: Any, **kwargs: Any) -> None:
        import django_rq

        entry = {
            "signal": name,
            "sender": sender._meta.label,
            "pk": kwargs["pk"],
            "request_id": str(kwargs["request_id"]),
            "version": kwargs["version"],
            "fields": list(kwargs["fields"]),
            "held": kwargs["held"],
            "job_id": kwargs["job_id"],
            "using": kwargs["using"],
            "latency": kwargs["latency"],
            # After commit: outside the job's transaction.
            "in_transaction": connections[kwargs["using"]].in_atomic_block,
        }
        django_rq.get_connection("default").rpush(RECORDED_KEY, json.dumps(entry))

    record.__name__ = f"record_{name}"
    return record


_RECEIVERS = {name: _recorder(name) for name in signals.OUTCOME_SIGNALS}


def raise_in_receiver(sender: Any, **kwargs: Any) -> None:
    raise RuntimeError("a receiver that raises")


def connect() -> None:
    """Connect the recording receivers to every outcome signal, and one that raises before them."""
    signals.request_applied.connect(raise_in_receiver, dispatch_uid="tests.raise")
    for name, signal in signals.OUTCOME_SIGNALS.items():
        signal.connect(_RECEIVERS[name], dispatch_uid=f"tests.record.{name}")
