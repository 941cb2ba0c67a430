"""``manage.py safeupdates_relay``: deliver again the requests whose job was lost."""

from __future__ import annotations

import time
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections, connections, models

from safeupdates import conf
from safeupdates.exceptions import BackendUnavailable
from safeupdates.jobs import relay
from safeupdates.models import LockVersionMixin
from safeupdates.pipeline.relay import MAX_AGE, valid_age

#: The longest ``--interval``, in seconds: a day (``time.sleep()`` overflows near 2**63 nanoseconds).
MAX_INTERVAL = 86_400


def _relay_after() -> Any:
    try:
        return conf.relay_after()
    except (TypeError, ValueError, OverflowError):
        return getattr(settings, "SAFEUPDATES_RELAY_AFTER", None)


class Command(BaseCommand):
    help = (
        "Re-enqueue the records that have requests pending for longer than SAFEUPDATES_RELAY_AFTER seconds "
        "(a job lost between commit and enqueue, lost in Redis, abandoned by a killed worker, or stuck in RQ's "
        "scheduled registry with no scheduler). One pass by default; --interval N keeps running, through "
        "outages of Redis and the database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            default=None,
            help="Seconds a request must have been pending (default: SAFEUPDATES_RELAY_AFTER).",
        )
        parser.add_argument("--interval", type=float, default=None, help="Keep running, one pass every N seconds.")
        parser.add_argument("--dry-run", action="store_true", help="Count what would be delivered; enqueue nothing.")
        parser.add_argument(
            "--retry-failed",
            action="store_true",
            help="First make every failed update request pending again (their retries ran out during an "
            "outage; nothing of them was written), so that this pass delivers them.",
        )
        parser.add_argument(
            "--model",
            default=None,
            metavar="APP_LABEL.MODEL",
            help="With --retry-failed: only the failed requests of that model (the pass still delivers every "
            "overdue record).",
        )
        parser.add_argument(
            "--database",
            default=None,
            help="The database whose request log to scan (default: where the router writes the request log).",
        )

    def handle(
        self,
        *args: Any,
        older_than: float | None,
        interval: float | None,
        dry_run: bool,
        retry_failed: bool,
        database: str | None = None,
        model: str | None = None,
        **options: Any,
    ) -> None:
        if database is not None and database not in connections:
            raise CommandError(f"--database {database!r} is not in DATABASES.")
        chosen = None if model is None else _model(model, retry_failed)
        # float() accepts "nan" and "inf": a NaN compares false with everything, so test for what is valid.
        # Beyond the bounds, the date arithmetic and time.sleep() overflow.
        if older_than is not None and not valid_age(older_than):
            raise CommandError(f"--older-than must be a number of seconds from 0 to {MAX_AGE}, not {older_than:g}.")
        if older_than is None and not valid_age(setting := _relay_after()):
            raise CommandError(
                f"SAFEUPDATES_RELAY_AFTER must be a whole number of seconds from 0 to {MAX_AGE}, not {setting!r}; "
                "run manage.py check, which says what it takes."
            )
        if interval is not None and not 0 < interval <= MAX_INTERVAL:
            raise CommandError(
                f"--interval must be a number of seconds from more than 0 to {MAX_INTERVAL}, not {interval:g}; "
                "for a longer wait, run single passes from cron."
            )
        verbosity = int(options.get("verbosity", 1))
        while True:
            if interval is not None:
                # A connection that broke in the last pass (the database restarted) is replaced, not reused.
                close_old_connections()
            try:
                report = relay(older_than, dry_run=dry_run, using=database, retry_failed=retry_failed, model=chosen)
            except BackendUnavailable as exc:
                if interval is None:
                    raise CommandError(f"safeupdates relay: {exc}") from None
                # One line per failed pass, no traceback: an outage is expected, and the loop waits it out.
                self.stderr.write(f"safeupdates relay: {exc}; will retry in {interval:g} s")
            else:
                if verbosity:
                    self.stdout.write(f"safeupdates relay: {report.summary()}")
                for warning in report.warnings:
                    self.stderr.write(f"safeupdates relay: {warning}")
            if interval is None:
                return
            # A process manager sends the output to a file or a pipe, where it is block-buffered: each
            # pass's line is there as the pass ends, not when the process exits (a SIGTERM never lets it).
            self.stdout.flush()
            time.sleep(interval)


def _model(label: str, retry_failed: bool) -> type[models.Model]:
    """The model ``--model`` names (``app_label.Model``, any case), or a :class:`CommandError` saying why not."""
    if not retry_failed:
        raise CommandError("--model goes with --retry-failed: it says whose failed requests to make pending again.")
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError):
        raise CommandError(f"--model {label!r} is not an installed model; name it app_label.Model.") from None
    if not issubclass(model, LockVersionMixin):
        raise CommandError(f"--model {label!r} is not updated through safeupdates: it has no request to retry.")
    return model._meta.concrete_model or model
