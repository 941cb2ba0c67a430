"""``manage.py safeupdates_purge``: delete old terminal requests, in batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from safeupdates import conf, db
from safeupdates.models import TERMINAL_STATUSES, ProcessedRequest

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
        "batches. Pending requests are never deleted. Versions stay monotonic: they come from a sequence."
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
        cutoff = db.older_than(days * 86400)
        old = ProcessedRequest.objects.filter(status__in=TERMINAL_STATUSES, created_at__lt=cutoff)
        if dry_run:
            self.stdout.write(f"would delete {old.count()} request(s) older than {days:g} day(s)")
            return
        deleted = 0
        while True:
            ids = list(old.order_by("pk").values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            deleted += ProcessedRequest.objects.filter(pk__in=ids, status__in=TERMINAL_STATUSES).delete()[0]
        self.stdout.write(f"deleted {deleted} request(s) older than {days:g} day(s)")
