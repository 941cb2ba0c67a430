"""``manage.py race_demo``: the race that safeupdates exists for, and safeupdates fixing it, with real workers."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

from demo_project.processes import Terminated, stop_signals_interrupt
from demo_project.toggles.plan import make_plan
from demo_project.toggles.race import RaceBase
from safeupdates import conf


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Show the race of queued updates with real workers (RQ; with DELIVERY=tasks db_worker, with "
        "DELIVERY=celery Celery): the seeds' story (two jobs in reverse order), "
        "then a stress round (shuffled, duplicated deliveries, a worker killed), naive jobs against "
        "safeupdates. The last line reads 'naive: X/N fields wrong; safeupdates: Y/N fields wrong'."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--toggles", type=_positive, default=200, help="Toggles in the stress round (200).")
        parser.add_argument("--records", type=_positive, default=10, help="Profiles they are spread over (10).")
        parser.add_argument("--workers", type=_positive, default=4, help="Worker processes, at least 2 (4).")
        parser.add_argument("--seed", type=int, default=42, help="Seed of the random plan (42).")
        parser.add_argument(
            "--progress",
            action="store_true",
            default=None,
            help="Show progress bars even when stderr is not a terminal.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["workers"] < 2:
            raise CommandError("--workers must be at least 2: the stress round kills one of them.")
        # The workers run in sessions of their own: SIGTERM's default action would leave them running.
        try:
            with stop_signals_interrupt():
                self._race(options)
        except Terminated as stopped:
            raise CommandError(
                f"race_demo was stopped by {stopped.signal.name}; the workers it started are stopped.",
                returncode=128 + stopped.signal,
            ) from None

    def _race(self, options: dict[str, Any]) -> None:
        self._check_migrated()
        demo = self._demo(options)
        demo.check()
        started = time.monotonic()
        plan = make_plan(options["toggles"], options["records"], options["seed"])
        vendor = "PostgreSQL" if connection.vendor == "postgresql" else "SQLite"
        self._write(demo.header(f"{vendor} database {connection.settings_dict['NAME']}"))
        self._write("")
        summary = demo.run(plan)
        self._write("")
        self._write(f"    done in {time.monotonic() - started:.0f} s")
        self._write(summary)

    def _demo(self, options: dict[str, Any]) -> RaceBase:
        """The race demo of ``SAFEUPDATES_DELIVERY``: RQ, Django tasks (db_workers, no Redis) or Celery
        (prefork workers of the demo's Celery app). Celery is imported only for Celery: it is an extra."""
        demo_class: type[RaceBase]
        if conf.delivery() == "tasks":
            from demo_project.toggles.race_tasks import TasksRaceDemo as demo_class
        elif conf.delivery() == "celery":
            from demo_project.toggles.race_celery import CeleryRaceDemo as demo_class
        else:
            from demo_project.toggles.race_rq import RqRaceDemo as demo_class
        return demo_class(
            workers=options["workers"],
            write=self._write,
            progress=options["progress"],
            show_worker_output=options["verbosity"] >= 2,
        )

    def _write(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    @staticmethod
    def _check_migrated() -> None:
        try:
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except DatabaseError as exc:
            raise CommandError(f"cannot read the demo database ({exc}); check DATABASE_URL.") from exc
        if plan:
            raise CommandError("the demo database is not migrated: run `python manage.py migrate` first.")
