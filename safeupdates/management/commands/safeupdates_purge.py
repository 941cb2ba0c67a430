"""``manage.py safeupdates_purge``: delete old terminal requests, in batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from safeupdates import conf, db
from safeupdates.lifecycle import RequestLogQuerySet
from safeupdates.models import TERMINAL_STATUSES, ProcessedRequest, RequestKind

#: The oldest cutoff a purge takes: 1000 years, far inside every supported database's date range.
MAX_DAYS = 365_000


def _valid_days(days: float) -> bool:
    # NaN fails both comparisons; infinity and larger values would overflow the date arithmetic.
    return 0 <= days <= MAX_DAYS


def _setting_days(name: str, read: Callable[[], float]) -> float:
    try:
        days = read()
    except (TypeError, ValueError, OverflowError) as exc:
        raise CommandError(f"{name} is invalid: {exc}; run manage.py check.") from exc
    if not _valid_days(days):
        raise CommandError(f"{name} must be a number of days from 0 to {MAX_DAYS}, not {days!r}.")
    return days


class Command(BaseCommand):
    help = (
        "Delete terminal requests (applied, stale, rejected, failed) created more than DAYS days ago, in "
        "batches. Pending requests are never deleted. Versions stay monotonic: they come from a sequence. "
        "The rows of @idempotent tasks are kept, as long as SAFEUPDATES_TASK_RETENTION is None (the "
        "default): a deleted row would let its side effect run again. With SAFEUPDATES_TASK_RETENTION set "
        "to a number of days, task rows completed longer ago than that are deleted too (whatever DAYS is)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", type=float, default=None, metavar="DAYS", help="Default: SAFEUPDATES_RETENTION."
        )
        parser.add_argument("--batch-size", type=int, default=1000)
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")

    def handle(self, *args: Any, older_than: float | None, batch_size: int, dry_run: bool, **options: Any) -> None:
        if older_than is None:
            days = _setting_days("SAFEUPDATES_RETENTION", conf.retention)
        elif not _valid_days(older_than):
            raise CommandError(f"--older-than must be a number of days from 0 to {MAX_DAYS}, not {older_than:g}.")
        else:
            days = older_than
        if batch_size < 1:
            raise CommandError(f"--batch-size must be at least 1, not {batch_size}.")
        # The database's clock decides what is old, never this process's.
        old = ProcessedRequest.objects.filter(status__in=TERMINAL_STATUSES, created_at__lt=db.older_than(days * 86400))
        batches = [old.exclude(kind=RequestKind.TASK)]
        task_days = _task_retention()
        if task_days is not None:
            # Age from completion: the time since which no run of the task has been needed.
            batches.append(
                ProcessedRequest.objects.filter(
                    kind=RequestKind.TASK,
                    status__in=TERMINAL_STATUSES,
                    processed_at__lt=db.older_than(task_days * 86400),
                )
            )
        if dry_run:
            counts = [queryset.count() for queryset in batches]
            self.stdout.write(f"would delete {self._summary(counts, days, task_days)}")
            return
        deleted = [self._delete(queryset, batch_size) for queryset in batches]
        self.stdout.write(f"deleted {self._summary(deleted, days, task_days)}")

    @staticmethod
    def _delete(queryset: RequestLogQuerySet, batch_size: int) -> int:
        deleted = 0
        while True:
            ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:batch_size])
            if not ids:
                return deleted
            # The queryset's conditions again: a row that changed meanwhile (a failed task that ran again
            # and completed just now) is rechecked by the DELETE and kept.
            deleted += queryset.filter(pk__in=ids).purge()

    @staticmethod
    def _summary(counts: list[int], days: float, task_days: int | None) -> str:
        text = f"{counts[0]} request(s) older than {days:g} day(s)"
        if task_days is None:
            return f"{text}; tasks kept (SAFEUPDATES_TASK_RETENTION is None)"
        return f"{text} and {counts[1]} task(s) completed more than {task_days} day(s) ago (SAFEUPDATES_TASK_RETENTION)"


def _task_retention() -> int | None:
    try:
        days = conf.task_retention()
    except (TypeError, ValueError, OverflowError) as exc:
        raise CommandError(f"SAFEUPDATES_TASK_RETENTION is invalid: {exc}; run manage.py check.") from exc
    if days is not None and not _valid_days(days):
        raise CommandError(f"SAFEUPDATES_TASK_RETENTION must be None or a number of days from 0 to {MAX_DAYS}.")
    return days
