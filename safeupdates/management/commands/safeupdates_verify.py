"""``manage.py safeupdates_verify``: compare stored values with the values the request log derives."""

from __future__ import annotations

import time
from typing import Any

from django.apps import apps
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections, models, router

from safeupdates.audit import BATCH_SIZE, find_drift
from safeupdates.exceptions import InvalidUpdate
from safeupdates.management.commands import check_batch_size
from safeupdates.models import LockVersionMixin
from safeupdates.write.validation import clean_pk

#: Seconds between two progress lines.
PROGRESS_EVERY = 1.0


class Command(BaseCommand):
    help = (
        "List records whose stored values differ from the request log's (a write that bypassed "
        "safeupdates, such as QuerySet.update). Exits with status 1 when any drift is found. Reads the "
        "records in primary key order, a batch at a time with their requests, in flat memory; a pass that "
        "was stopped resumes with --after-pk (the last pk of its progress lines)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("models", nargs="*", metavar="app_label.Model", help="Models to check (default: all).")
        parser.add_argument(
            "--database",
            default=None,
            help="The database to check (default: where the router writes each model; a replica may lag).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=BATCH_SIZE,
            metavar="RECORDS",
            help=f"Records read per batch, with their requests in one query (default {BATCH_SIZE}).",
        )
        parser.add_argument(
            "--after-pk",
            default=None,
            metavar="PK",
            help="Start after this primary key (resume a pass of one model that was stopped).",
        )

    def handle(
        self,
        *args: Any,
        models: list[str],
        database: str | None,
        batch_size: int,
        after_pk: str | None,
        **options: Any,
    ) -> None:
        if models:
            try:
                chosen = [apps.get_model(label) for label in models]
            except (LookupError, ValueError) as exc:
                raise CommandError(f"{exc} Give models as app_label.Model.") from exc
        else:
            # A proxy's rows are its concrete model's: checked (and reported) once, there.
            chosen = [m for m in apps.get_models() if issubclass(m, LockVersionMixin) and not m._meta.proxy]
        not_versioned = [m._meta.label for m in chosen if not issubclass(m, LockVersionMixin)]
        if not_versioned:
            raise CommandError(f"not a LockVersionMixin model: {', '.join(not_versioned)}.")
        check_batch_size(batch_size)
        if database is not None and database not in connections:
            raise CommandError(f"--database {database!r} is not in DATABASES.")
        after = None
        if after_pk is not None:
            if len(chosen) != 1:
                raise CommandError("--after-pk resumes the pass of one model: name exactly one app_label.Model.")
            after = _pk_value(chosen[0], after_pk)
        verbosity = int(options.get("verbosity", 1))
        drifted = 0
        for model in chosen:
            using = database or router.db_for_write(model)
            rows = model._base_manager.db_manager(using)
            total = (rows.all() if after is None else rows.filter(pk__gt=after)).count()
            started = last_line = time.monotonic()
            label = model._meta.label

            def progress(checked: int, last_pk: Any, label: str = label, total: int = total) -> None:
                nonlocal last_line
                if verbosity and time.monotonic() - last_line >= PROGRESS_EVERY:
                    last_line = time.monotonic()
                    share = f" ({checked / total:.0%})" if total else ""
                    self.stderr.write(
                        f"safeupdates verify: {label}: {checked:,} of {total:,} record(s) checked{share}, "
                        f"last pk {last_pk} (--after-pk {last_pk} resumes)"
                    )

            count = 0
            for drift in find_drift(model, using=using, after=after, batch_size=batch_size, progress=progress):
                count += 1
                self.stdout.write(
                    f"{drift.label} pk={drift.pk} {drift.field}: stored {drift.stored!r}, "
                    f"request log says {drift.derived!r}"
                )
            elapsed = time.monotonic() - started
            self.stdout.write(f"{label}: {count} field(s) drifted ({total:,} record(s) in {elapsed:.1f} s)")
            drifted += count
        if drifted:
            self.stderr.write(self.style.ERROR(f"drift found in {drifted} field(s)"))
            raise SystemExit(1)
        self.stdout.write(self.style.SUCCESS("no drift"))


def _pk_value(model: type[models.Model], text: str) -> Any:
    """``text`` as a primary key value of ``model``."""
    pk = model._meta.pk
    assert pk is not None
    try:
        value = pk.to_python(text)
    except ValidationError as exc:
        raise CommandError(
            f"--after-pk {text!r} is not a primary key of {model._meta.label}: {exc.messages[0]}"
        ) from exc
    try:
        # What no column can hold (a NUL, a lone surrogate of a byte the terminal's encoding did not
        # decode, an integer beyond the column) is refused here, not as the DataError of the first query.
        return clean_pk(model, value)
    except InvalidUpdate as exc:
        raise CommandError(f"--after-pk {text!r} is not a primary key of {model._meta.label}: {exc}") from exc
