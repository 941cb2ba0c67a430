"""``manage.py race_demo``: the race that safeupdates exists for, and safeupdates fixing it, with real workers."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from redis.exceptions import RedisError

from demo_project.toggles.plan import make_plan, summary_line
from demo_project.toggles.race import RACE_QUEUE, RaceDemo, redis_url
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
        self._check_migrated()
        if conf.uses_tasks():
            self._tasks_demo(options)
            return
        if conf.uses_celery():
            self._celery_demo(options)
            return
        demo = RaceDemo(
            workers=options["workers"],
            write=self._write,
            progress=options["progress"],
            show_worker_output=options["verbosity"] >= 2,
        )
        try:
            demo.queue.connection.ping()
        except RedisError as exc:
            raise CommandError(
                f"Redis is not reachable ({exc}). Start it with `redis-server --daemonize yes`, or set REDIS_URL."
            ) from exc
        started = time.monotonic()
        plan = make_plan(options["toggles"], options["records"], options["seed"])
        vendor = "PostgreSQL" if connection.vendor == "postgresql" else "SQLite"
        self._write(
            f"safeupdates race demo: {vendor} database {connection.settings_dict['NAME']}, "
            f"Redis {redis_url()}, queue {RACE_QUEUE!r}"
        )
        self._write("")
        with demo.exclusive():
            demo.story()
            naive, safe = demo.stress(plan)
        self._write("")
        self._write(f"    done in {time.monotonic() - started:.0f} s")
        self._write(summary_line(naive, safe))

    def _tasks_demo(self, options: dict[str, Any]) -> None:
        """``DELIVERY=tasks``: the same demo on Django tasks, with db_worker processes and no Redis."""
        from demo_project.toggles.race_tasks import RACE_QUEUE as TASK_QUEUE
        from demo_project.toggles.race_tasks import TasksRaceDemo

        verbose = options["verbosity"] >= 2
        demo = TasksRaceDemo(workers=options["workers"], write=self._write, show_worker_output=verbose)
        started = time.monotonic()
        plan = make_plan(options["toggles"], options["records"], options["seed"])
        vendor = "PostgreSQL" if connection.vendor == "postgresql" else "SQLite"
        self._write(
            f"safeupdates race demo on Django tasks: {vendor} database {connection.settings_dict['NAME']}, "
            f"TASKS backend {conf.task_backend()!r}, task queue {TASK_QUEUE!r}, no Redis"
        )
        self._write("")
        demo.story()
        naive, safe = demo.stress(plan)
        self._write("")
        self._write(f"    done in {time.monotonic() - started:.0f} s")
        self._write(f"naive: {naive}/{plan.fields} fields wrong; safeupdates: {safe}/{plan.fields} fields wrong")

    def _celery_demo(self, options: dict[str, Any]) -> None:
        """``DELIVERY=celery``: the same demo on the demo's Celery app, with Celery prefork workers."""
        from demo_project.toggles.race_celery import CeleryRaceDemo, broker_url

        demo = CeleryRaceDemo(
            workers=options["workers"],
            write=self._write,
            progress=options["progress"],
            show_worker_output=options["verbosity"] >= 2,
        )
        try:
            demo.queue.connection.ping()
        except RedisError as exc:
            raise CommandError(
                f"Redis is not reachable ({exc}); the demo counts the workers' tasks there. Start it with "
                "`redis-server --daemonize yes`, or set REDIS_URL."
            ) from exc
        try:
            demo.queued()
        except Exception as exc:
            raise CommandError(f"the Celery broker at {broker_url()} is not reachable ({exc}).") from exc
        started = time.monotonic()
        plan = make_plan(options["toggles"], options["records"], options["seed"])
        vendor = "PostgreSQL" if connection.vendor == "postgresql" else "SQLite"
        self._write(
            f"safeupdates race demo on Celery: {vendor} database {connection.settings_dict['NAME']}, "
            f"broker {broker_url()}, queue {RACE_QUEUE!r}, prefork workers (celery -A demo_project worker)"
        )
        self._write("")
        with demo.exclusive():
            demo.story()
            naive, safe = demo.stress(plan)
        self._write("")
        self._write(f"    done in {time.monotonic() - started:.0f} s")
        self._write(summary_line(naive, safe))

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
