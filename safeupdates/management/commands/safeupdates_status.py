"""``manage.py safeupdates_status``: the backlog, outcomes, failures, batches and the delivery backend's
queues and workers, at a glance; exit status 1 when unhealthy (a health check, a liveness probe, a cron
alert): see :meth:`safeupdates.status.Status.problems`."""

from __future__ import annotations

import json
import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from safeupdates import status
from safeupdates.delivery import QueueHealth


class Command(BaseCommand):
    help = (
        "Show the request log's backlog by model and queue, the oldest pending request, the records waiting for "
        "the relay, outcomes of the last "
        "hour, failed requests, batches, and the delivery backend's queues, workers and schedulers. Exits with "
        "status 1 when pending requests have no worker to apply them (no worker registered on their queue, "
        "retries scheduled and no RQ scheduler, or, where the backend shows no workers, a request older than "
        "SAFEUPDATES_STUCK_AFTER), a request has been pending longer than --max-age, failures exceed "
        "--max-failed, or the broker cannot be reached."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object, for scripts.")
        parser.add_argument(
            "--max-age",
            type=float,
            default=None,
            metavar="SECONDS",
            help="Unhealthy if a request has been pending for longer (default: SAFEUPDATES_STUCK_AFTER where the "
            "delivery backend shows no workers, else not checked: a queue without workers is).",
        )
        parser.add_argument(
            "--max-failed",
            type=int,
            default=None,
            metavar="N",
            help="Unhealthy if more than N requests are failed (default: not checked).",
        )

    def handle(self, *args: Any, json: bool, max_age: float | None, max_failed: int | None, **options: Any) -> None:
        if max_age is not None and not (math.isfinite(max_age) and max_age >= 0):
            raise CommandError(f"--max-age must be a finite number of seconds, zero or more; got {max_age}.")
        if max_failed is not None and max_failed < 0:
            raise CommandError(f"--max-failed must be zero or more; got {max_failed}.")
        snapshot = status.collect()
        problems = snapshot.problems(max_age=max_age, max_failed=max_failed)
        if json:
            self.stdout.write(_dumps({**snapshot.as_json(), "healthy": not problems, "problems": problems}))
        else:
            self.stdout.write("\n".join(render(snapshot, problems)))
        if problems:
            raise SystemExit(1)


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True)


def render(snapshot: status.Status, problems: list[str]) -> list[str]:
    """The snapshot as lines of text."""
    oldest = snapshot.oldest_pending_age
    lines = [
        f"safeupdates status at {snapshot.checked_at:%Y-%m-%d %H:%M:%S %Z}: "
        + ("healthy" if not problems else "UNHEALTHY"),
        *(f"  problem: {problem}" for problem in problems),
        *(f"  warning: {warning}" for warning in snapshot.warnings()),
        f"Pending: {snapshot.pending} request(s)" + ("" if oldest is None else f", the oldest for {oldest:.0f} s"),
        *(
            f"  {entry.model} on {entry.queue}: {entry.pending}, oldest {entry.oldest_age:.0f} s"
            for entry in snapshot.backlog
        ),
        f"Waiting for the relay: {snapshot.relay_due} record(s) with a request pending for more than "
        f"{snapshot.relay_after} s (SAFEUPDATES_RELAY_AFTER): its next pass delivers them again",
        "Last hour: "
        + ", ".join(f"{count} {name}" for name, count in snapshot.outcomes.items())
        + " (duplicates are not stored: see the metrics)",
        f"Failed: {snapshot.failed} (safeupdates_relay --retry-failed delivers update requests again)",
        *(
            f"  {entry.request_id} {entry.kind} {entry.model} {entry.object_id or entry.key} "
            f"after {entry.attempts} attempt(s): {entry.error[:200]}"
            for entry in snapshot.failed_requests
        ),
    ]
    if snapshot.replication is not None:
        lines.append(f"Replication: {snapshot.replication.summary()}")
    if snapshot.batches is not None:
        lines.append("Batches: " + ", ".join(f"{count} {name}" for name, count in snapshot.batches.items()))
    if snapshot.backend_error:
        lines.append(f"Queues: unknown ({snapshot.backend_error})")
    for state in snapshot.queues:
        lines.append(f"Queue {state.name}: {_queue(state)}")
    return lines


def _queue(state: QueueHealth) -> str:
    """What the backend tells of a queue, in words; what it cannot tell is said so."""
    counts = ", ".join(
        f"{value} {name}"
        for value, name in ((state.queued, "queued"), (state.scheduled, "scheduled"), (state.failed, "failed"))
        if value is not None
    )
    if state.workers is None:
        return f"{counts}; workers not shown by this backend"
    scheduler = "" if state.scheduler is None else ", scheduler running" if state.scheduler else ", NO scheduler"
    busy = "" if state.busy_workers is None else f" ({state.busy_workers} busy)"
    return f"{counts}; {state.workers} worker(s){busy}{scheduler}"
