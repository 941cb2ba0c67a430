"""``manage.py safeupdates_verify``: compare stored values with the values the request log derives."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError, CommandParser

from safeupdates.audit import find_drift
from safeupdates.models import LockVersionMixin


class Command(BaseCommand):
    help = (
        "List records whose stored values differ from the request log's (a write that bypassed "
        "safeupdates, such as QuerySet.update). Exits with status 1 when any drift is found."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("models", nargs="*", metavar="app_label.Model", help="Models to check (default: all).")

    def handle(self, *args: Any, models: list[str], **options: Any) -> None:
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
        drifted = 0
        for model in chosen:
            count = 0
            for drift in find_drift(model):
                count += 1
                self.stdout.write(
                    f"{drift.label} pk={drift.pk} {drift.field}: stored {drift.stored!r}, "
                    f"request log says {drift.derived!r}"
                )
            self.stdout.write(f"{model._meta.label}: {count} field(s) drifted")
            drifted += count
        if drifted:
            self.stderr.write(self.style.ERROR(f"drift found in {drifted} field(s)"))
            raise SystemExit(1)
        self.stdout.write(self.style.SUCCESS("no drift"))
