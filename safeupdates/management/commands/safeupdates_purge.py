"""``manage.py safeupdates_purge``: delete old terminal requests, in batches."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from safeupdates import conf, db
from safeupdates.models import TERMINAL_STATUSES, ProcessedRequest


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
        days = conf.retention() if older_than is None else older_than
        if days < 0:
            raise CommandError("--older-than must be zero or more days.")
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
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
