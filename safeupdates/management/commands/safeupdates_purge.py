"""``manage.py safeupdates_purge``: delete old terminal requests, in short batches that never block writers."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections, router

from safeupdates import conf
from safeupdates.database import statements
from safeupdates.database.clock import database_now
from safeupdates.management.commands import check_batch_size
from safeupdates.models import ProcessedRequest, RequestStatus

#: The oldest cutoff a purge takes (:data:`safeupdates.conf.MAX_DAYS`: 1000 years).
MAX_DAYS = conf.MAX_DAYS

#: Seconds between two progress lines.
PROGRESS_EVERY = 1.0

#: The longest ``--pause`` taken, in seconds.
MAX_PAUSE = 60.0

#: ``--pause`` unless told otherwise: at 1,000 rows a batch, 1M rows are purged in about a minute, and a
#: writer's latency during the purge stays what it is without one (docs/benchmarks.md).
DEFAULT_PAUSE = 0.05

#: How the purge waits between two batches (``--pause``).
sleep = time.sleep


def _valid_days(days: float) -> bool:
    # NaN fails both comparisons; infinity and larger values would overflow the date arithmetic.
    return 0 <= days <= MAX_DAYS


def outcomes() -> tuple[tuple[str, str, Callable[[], float | None]], ...]:
    """Each outcome of a request, in the order the summary names them, with its retention's setting and
    getter: a failed or rejected request is what an operator looks for weeks later (and re-drives), an
    applied or stale one is not."""
    return (
        (RequestStatus.APPLIED.value, conf.RETENTION.name, conf.retention),
        (RequestStatus.STALE.value, conf.RETENTION.name, conf.retention),
        (RequestStatus.REJECTED.value, conf.REJECTED_RETENTION.name, conf.rejected_retention),
        (RequestStatus.FAILED.value, conf.FAILED_RETENTION.name, conf.failed_retention),
    )


def _setting_days(name: str, read: Callable[[], float | None]) -> float:
    try:
        days = read()
    except (TypeError, ValueError, OverflowError) as exc:
        raise CommandError(f"{name} is not a number of days; run manage.py check, which says what it takes.") from exc
    if days is None or not _valid_days(days):
        raise CommandError(f"{name} must be a number of days from 0 to {MAX_DAYS}, not {days!r}.")
    return days


class Command(BaseCommand):
    help = (
        "Delete terminal requests created more than DAYS days ago, in batches: by default each outcome "
        "after its own retention (applied and stale: SAFEUPDATES_RETENTION; rejected: "
        "SAFEUPDATES_REJECTED_RETENTION; failed: SAFEUPDATES_FAILED_RETENTION; None keeps them); --older-than "
        "DAYS applies to every outcome. Pending requests are never deleted. Versions stay monotonic: they come "
        "from a sequence. "
        "The rows of @idempotent tasks are kept, as long as SAFEUPDATES_TASK_RETENTION is None (the "
        "default): a deleted row would let its side effect run again. With SAFEUPDATES_TASK_RETENTION set "
        "to a number of days, task rows completed longer ago than that are deleted too (whatever DAYS is). "
        "Each batch is one short statement in its own transaction: writers never wait for the purge, and a "
        "purge that is stopped (or killed) keeps what it deleted; run it again to finish."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            default=None,
            metavar="DAYS",
            help="For every outcome (default: each outcome's retention, SAFEUPDATES_RETENTION for applied and "
            "stale requests, SAFEUPDATES_REJECTED_RETENTION and SAFEUPDATES_FAILED_RETENTION).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=1000,
            metavar="ROWS",
            help="Rows deleted per statement (default 1000). Each batch commits on its own and holds the row "
            "locks of its rows only while it runs (milliseconds at the default); a larger batch deletes "
            "faster and holds them longer.",
        )
        parser.add_argument(
            "--pause",
            type=float,
            default=DEFAULT_PAUSE,
            metavar="SECONDS",
            help=f"Seconds to wait after each full batch (default {DEFAULT_PAUSE:g}, at most {MAX_PAUSE:g}; 0: none). "
            "The purge has no hurry: a pause spreads the write-ahead log its deletions produce, so that the "
            "database's checkpoints and disk keep up and writers never share a stall with it.",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")
        parser.add_argument(
            "--database",
            default=None,
            help="The database whose request log to purge (default: where the router writes the request log).",
        )

    def handle(
        self,
        *args: Any,
        older_than: float | None,
        batch_size: int,
        pause: float,
        dry_run: bool,
        database: str | None,
        **options: Any,
    ) -> None:
        if older_than is None:
            groups, kept = _retention_groups()
        elif not _valid_days(older_than):
            raise CommandError(f"--older-than must be a number of days from 0 to {MAX_DAYS}, not {older_than:g}.")
        else:
            groups, kept = [(older_than, None)], []
        check_batch_size(batch_size)
        if not 0 <= pause <= MAX_PAUSE:  # NaN fails both comparisons
            raise CommandError(f"--pause must be a number of seconds from 0 to {MAX_PAUSE:g}, not {pause:g}.")
        using = database or router.db_for_write(ProcessedRequest)
        if using not in connections:
            raise CommandError(f"--database {using!r} is not in DATABASES.")
        self.verbosity = int(options.get("verbosity", 1))
        # The database's clock decides what is old, never this process's; once, so that a purge deletes
        # one fixed set of rows, whatever is written meanwhile.
        now = database_now(using)
        scopes: list[tuple[str, datetime, tuple[str, ...] | None]] = [
            (statements.PURGE_REQUESTS, now - timedelta(days=days), statuses) for days, statuses in groups
        ]
        task_days = _optional_days(conf.TASK_RETENTION.name, conf.task_retention)
        if task_days is not None:
            # Age from completion: the time since which no run of the task has been needed.
            scopes.append((statements.PURGE_TASKS, now - timedelta(days=task_days), None))
        counts = [self._count(using, *scope) for scope in scopes]
        if dry_run:
            self.stdout.write(f"would delete {self._summary(counts, groups, kept, task_days)}")
            return
        self.batches, self.longest = 0, 0.0
        started = time.monotonic()
        deleted = [
            self._purge(using, scope, batch_size, total, pause) for scope, total in zip(scopes, counts, strict=True)
        ]
        self.stdout.write(
            f"deleted {self._summary(deleted, groups, kept, task_days)}; {self.batches} batch(es) in "
            f"{time.monotonic() - started:.1f} s, longest batch {self.longest * 1000:.1f} ms"
        )

    @staticmethod
    def _count(using: str, scope: str, cutoff: datetime, statuses: tuple[str, ...] | None) -> int:
        """How many rows of ``scope`` (and ``statuses``) are older than ``cutoff`` (what the batches of
        :meth:`_purge` match)."""
        return ProcessedRequest.objects.using(using).purgeable(scope, cutoff, statuses).count()

    def _purge(
        self,
        using: str,
        of: tuple[str, datetime, tuple[str, ...] | None],
        batch_size: int,
        total: int,
        seconds: float,
    ) -> int:
        """Delete the rows of ``of`` (a scope, its cutoff, its statuses), batch by batch, waiting ``seconds``
        after each full one (a batch that deleted fewer rows was most likely the last); return how many."""
        scope, cutoff, statuses = of
        deleted, last_line = 0, time.monotonic()
        batches = ProcessedRequest.objects.using(using).purge(scope, cutoff, batch_size, statuses)
        if statuses is not None:
            scope = f"{scope} ({' or '.join(statuses)})"
        while True:
            started = time.monotonic()
            count = next(batches, None)
            if count is None:
                return deleted
            self.longest = max(self.longest, time.monotonic() - started)
            self.batches += 1
            deleted += count
            if self.verbosity and time.monotonic() - last_line >= PROGRESS_EVERY:
                last_line = time.monotonic()
                self.stderr.write(f"safeupdates purge: {scope}: {self._fraction(deleted, total)}")
            if seconds and count >= batch_size:
                sleep(seconds)

    @staticmethod
    def _fraction(deleted: int, total: int) -> str:
        share = f" ({deleted / total:.0%})" if total else ""
        return f"{deleted:,} of {total:,} deleted{share}"

    @staticmethod
    def _summary(
        counts: list[int],
        groups: list[tuple[float, tuple[str, ...] | None]],
        kept: list[tuple[str, str]],
        task_days: float | None,
    ) -> str:
        """``counts``: of each group of requests, then of the tasks."""
        requests = counts[: len(groups)]
        if len(groups) == 1 and groups[0][1] is None:
            text = f"{requests[0]} request(s) older than {groups[0][0]:g} day(s)"
        else:
            parts = [
                f"{count} {' or '.join(statuses or ())} older than {days:g} day(s)"
                for count, (days, statuses) in zip(requests, groups, strict=True)
            ]
            text = f"{sum(requests)} request(s): {', '.join(parts)}"
        for status, setting in kept:
            text += f"; {status} kept ({setting} is None)"
        if task_days is None:
            return f"{text}; tasks kept (SAFEUPDATES_TASK_RETENTION is None)"
        return (
            f"{text} and {counts[-1]} task(s) completed more than {task_days:g} day(s) ago (SAFEUPDATES_TASK_RETENTION)"
        )


def _retention_groups() -> tuple[list[tuple[float, tuple[str, ...] | None]], list[tuple[str, str]]]:
    """The requests to purge by the settings: ``(days, statuses)`` per retention, in the order of
    :func:`outcomes` (None: every terminal status, where they all share one), and ``(status, setting)`` of
    each outcome kept for good (its retention is None)."""
    by_days: dict[float, list[str]] = {}
    kept: list[tuple[str, str]] = []
    every = outcomes()
    for status, setting, read in every:
        days = _setting_days(setting, read) if setting == conf.RETENTION.name else _optional_days(setting, read)
        if days is None:
            kept.append((status, setting))
        else:
            by_days.setdefault(days, []).append(status)
    groups: list[tuple[float, tuple[str, ...] | None]] = [
        (days, None if len(statuses) == len(every) else tuple(statuses)) for days, statuses in by_days.items()
    ]
    return groups, kept


def _optional_days(name: str, read: Callable[[], float | None]) -> float | None:
    """The retention ``name`` (None: kept for good), or a :class:`CommandError` saying what is wrong with it."""
    try:
        days = read()
    except (TypeError, ValueError, OverflowError) as exc:
        raise CommandError(
            f"{name} is not None nor a number of days; run manage.py check, which says what it takes."
        ) from exc
    if days is not None and not _valid_days(days):
        raise CommandError(f"{name} must be None or a number of days from 0 to {MAX_DAYS}.")
    return days
