"""The engine of ``manage.py race_demo`` with ``DELIVERY=tasks`` (``SAFEUPDATES_DELIVERY = "tasks"``): the
same story and stress round as :mod:`demo_project.toggles.race`, on Django's Tasks framework with
django-tasks-db's database backend and real ``manage.py db_worker`` processes. No Redis.

The reverse order of the story is forced by enqueuing the tasks newest first while no worker runs; the
stress round's deliveries are delayed and duplicated by the plan, and one worker is SIGKILLed halfway.
The demo works on its own users' profiles and on its own task queue (``race_demo``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError
from django.db import connection

from demo_project.processes import TaskWorkers, wait_until
from demo_project.toggles.models import Profile
from demo_project.toggles.plan import FIELDS, Plan
from demo_project.toggles.race import RACE_QUEUE, ROUND_TIMEOUT, RaceBase, Write
from safeupdates import conf
from safeupdates.delivery import tasks as taskqueue
from safeupdates.jobs import enqueue_update, relay
from safeupdates.models import ProcessedRequest


def _tasks() -> Any:
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult.objects.filter(queue_name=RACE_QUEUE)


class TasksRaceDemo(RaceBase):
    """The race demo on Django tasks, writing its report through ``write``."""

    def __init__(
        self, *, workers: int, write: Write, progress: bool | None = None, show_worker_output: bool = False
    ) -> None:
        super().__init__(workers=workers, write=write, progress=progress, show_worker_output=show_worker_output)
        self.backend = conf.task_backend()

    def header(self, database: str) -> str:
        return (
            f"safeupdates race demo on Django tasks: {database}, "
            f"TASKS backend {self.backend!r}, task queue {RACE_QUEUE!r}, no Redis"
        )

    def run(self, plan: Plan) -> str:
        self.story()
        naive, safe = self.stress(plan)
        return f"naive: {naive}/{plan.fields} fields wrong; safeupdates: {safe}/{plan.fields} fields wrong"

    def clear_queue(self) -> None:
        _tasks().delete()

    def pool(self, name: str) -> TaskWorkers:
        return TaskWorkers(name=f"race-demo-{name}", backend=self.backend, output=self.worker_output)

    def run_one_task(self) -> None:
        pool = self.pool("step")
        try:
            pool.start(1, (RACE_QUEUE,), burst=True, max_jobs=1, verbosity=0)
            if not pool.wait(60):
                raise CommandError("the db_worker did not finish its task within 60 s; is the database locked?")
        finally:
            pool.stop()

    # -- (a) the story --------------------------------------------------------------------------

    def story(self) -> tuple[bool, bool]:
        from demo_project.toggles.tasks import naive_toggle

        w = self.write
        (profile,) = self.profiles(["story"])
        w('(a) The story from the seeds: a user switches "active" on, then off, and the two tasks run in')
        w("    reverse order: the demo enqueues them newest first while no db_worker runs, then starts one")
        w("    worker per task.")
        w("")
        w("  naive: one task per click, each doing Profile.objects.filter(pk=...).update(active=...)")
        self.reset([profile])
        naive = naive_toggle.using(backend=self.backend)
        for value in (False, True):  # newest first
            naive.enqueue(profile.pk, "active", value)
        for label in ("task 2 (active=False)", "task 1 (active=True)"):
            self.run_one_task()
            profile.refresh_from_db()
            w(f"    db_worker ran {label}   active={profile.active}")
        naive_active = profile.active
        w(f"    result: active={naive_active}  {'WRONG: the last click said False' if naive_active else 'right'}")
        w("")
        w("  safeupdates: enqueue_update(profile, active=...); the task carries the request id only")
        self.reset([profile])
        profile.refresh_from_db()
        first = enqueue_update(profile, queue=RACE_QUEUE, active=True)
        second = enqueue_update(profile, queue=RACE_QUEUE, active=False)
        w(f"    click 1 v{first.version} active=True, click 2 v{second.version} active=False: one task waits for both;")
        w("    the demo deletes it and enqueues one task per request, newest first.")
        _tasks().delete()
        apply = taskqueue.apply_update.using(backend=self.backend, queue_name=RACE_QUEUE)
        for request in (second, first):
            apply.enqueue(str(request.request_id), record=f"{first.content_type_id}:{profile.pk}")
        for label in ("task 2", "task 1"):
            self.run_one_task()
            profile.refresh_from_db()
            statuses = dict(ProcessedRequest.objects.filter(pk__in=[first.pk, second.pk]).values_list("pk", "status"))
            w(
                f"    db_worker ran {label}   active={profile.active}   "
                f"v{first.version} {statuses[first.pk]}, v{second.version} {statuses[second.pk]}"
            )
        w(f"    result: active={profile.active}  {'right' if profile.active is False else 'WRONG'}")
        w("")
        return naive_active, profile.active

    # -- (b) the stress round -------------------------------------------------------------------

    def stress(self, plan: Plan) -> tuple[int, int]:
        """Run ``plan`` through naive tasks, then through safeupdates; return the wrong fields of each."""
        w = self.write
        vendor = "PostgreSQL" if connection.vendor == "postgresql" else "SQLite"
        w(
            f"(b) Stress round: {len(plan.toggles)} random toggles on {plan.records} profiles ({plan.fields} "
            f"fields), {self.workers} db_workers, {vendor}, seed {plan.seed}; {plan.duplicates} deliveries twice,"
        )
        w("    worker 1 SIGKILLed halfway; then the relay re-delivers whatever is still pending.")
        profiles = self.profiles([f"{n:03d}" for n in range(plan.records)])
        results = [self._round(name, plan, profiles, safe=safe) for name, safe in (("naive", False), ("safe", True))]
        w("")
        w(f"    {'':<26}{'naive':>10}{'safeupdates':>14}")
        for label, index in (("wrong fields", 0), ("tasks run", 1), ("time taken (s)", 2), ("relay re-delivered", 3)):
            w(f"    {label:<26}{results[0][index]:>10}{results[1][index]:>14}")
        return int(results[0][0]), int(results[1][0])

    def _round(self, name: str, plan: Plan, profiles: Sequence[Profile], *, safe: bool) -> tuple[Any, ...]:
        from demo_project.toggles.tasks import naive_toggle

        self.reset(profiles)
        for profile in profiles:
            profile.refresh_from_db()
        pool = self.pool(name)
        requests: dict[int, ProcessedRequest] = {}
        naive = naive_toggle.using(backend=self.backend)
        apply = taskqueue.apply_update.using(backend=self.backend, queue_name=RACE_QUEUE)
        try:
            pool.start(self.workers, (RACE_QUEUE,), verbosity=0)
            started, relayed = time.monotonic(), 0
            for n, (kind, k) in enumerate(plan.events):
                if n == len(plan.events) // 2:
                    pool.kill(0)
                toggle = plan.toggles[k]
                profile = profiles[toggle.record]
                if kind == "click" and safe:
                    changes: dict[str, Any] = {toggle.field: toggle.value}
                    requests[k] = enqueue_update(profile, queue=RACE_QUEUE, **changes)
                elif kind == "deliver" and safe:
                    request = requests[k]
                    apply.enqueue(str(request.request_id), record=f"{request.content_type_id}:{profile.pk}")
                elif kind == "deliver":
                    naive.enqueue(profile.pk, toggle.field, toggle.value)

            def settled() -> bool:
                nonlocal relayed
                if safe:
                    relayed += relay(0).enqueued
                pending = safe and ProcessedRequest.objects.filter(status="pending").exists()
                return not pending and not _tasks().filter(status="READY").exists()

            if not wait_until(settled, ROUND_TIMEOUT, interval=0.5):
                raise CommandError(f"the {name} round did not settle within {ROUND_TIMEOUT:.0f} s")
        finally:
            pool.stop()
        expected = plan.expected()
        wrong = 0
        for record, profile in enumerate(profiles):
            profile.refresh_from_db()
            wrong += sum(getattr(profile, field) != expected[record, field] for field in FIELDS)
        ran = _tasks().filter(status="SUCCESSFUL").count()
        return wrong, ran, f"{time.monotonic() - started:.1f}", relayed if safe else "-"
