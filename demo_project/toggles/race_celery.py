"""The engine of ``manage.py race_demo`` with ``DELIVERY=celery`` (``SAFEUPDATES_DELIVERY = "celery"``): the
same story and stress round as :mod:`demo_project.toggles.race`, with the same table, on the demo's Celery app
(:mod:`demo_project.celery`) and real prefork workers (``celery -A demo_project worker --pool prefork -c 2``).

The broker is ``CELERY_BROKER_URL`` (the demo's Redis, or RabbitMQ). The reverse order of the story is forced
in the open: both messages are taken off the queue while no worker runs and sent back newest first, one at a
time. What the workers ran is counted by the app's task signals in Redis (``DEMO_CELERY_COUNTS``, see
:mod:`demo_project.celery`): Celery keeps no result here (safeupdates' tasks need no result backend).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.db.models import F, Sum
from kombu.utils.url import maybe_sanitize_url
from redis import Redis
from tqdm import tqdm

from demo_project.celery import counts_key
from demo_project.processes import CeleryWorkers, take_messages, wait_until
from demo_project.toggles.models import Profile
from demo_project.toggles.plan import FIELDS, Plan, RoundResult
from demo_project.toggles.race import QUIET_SECONDS, RACE_QUEUE, ROUND_TIMEOUT, RaceDemo, Write
from safeupdates.delivery.celery import APPLY_TASK, celery_app
from safeupdates.jobs import enqueue_update
from safeupdates.models import ProcessedRequest, RequestStatus

#: The ids of the tasks the demo sends itself start with this: the table counts those, not the ones
#: ``enqueue_update()`` and the relay send.
TASK_PREFIX = "race-demo-"


def broker_url() -> str:
    """The demo app's broker, password masked."""
    return str(maybe_sanitize_url(celery_app().conf.broker_url))


class CeleryRaceDemo(RaceDemo):
    """The race demo on Celery, writing its report through ``write`` (progress bars to stderr)."""

    def __init__(
        self, *, workers: int, write: Write, progress: bool | None = None, show_worker_output: bool = False
    ) -> None:
        super().__init__(workers=workers, write=write, progress=progress, show_worker_output=show_worker_output)
        self.show_worker_output = show_worker_output
        self.app = celery_app()
        self.redis = Redis.from_url(settings.REDIS_URL)
        self.counts = f"celery-race-demo:{uuid.uuid4().hex[:8]}"

    # -- the broker and the counts ----------------------------------------------------------------

    def clear_queue(self) -> None:
        """Empty the demo's queue on the broker (it is the demo's alone) and forget the counts."""
        with self.app.connection_for_write() as connection:
            simple = connection.SimpleQueue(RACE_QUEUE)
            try:
                simple.clear()
            finally:
                simple.close()
            if str(connection.transport.driver_type) == "redis":
                self._forget_unacked(Redis.from_url(connection.as_uri(include_password=True)))
        self.redis.delete(counts_key(self.counts, "done"), counts_key(self.counts, "running"))

    @staticmethod
    def _forget_unacked(broker: Redis[bytes]) -> None:
        """On a Redis broker, drop the messages of the demo's queue that a killed worker held: kombu would
        put them back on the queue after its visibility timeout (an hour), into a later run of the demo."""
        for tag, raw in broker.hgetall("unacked").items():
            try:
                _message, exchange, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                continue
            if RACE_QUEUE in (exchange, routing_key):
                with broker.pipeline() as pipe:
                    pipe.hdel("unacked", tag)
                    pipe.zrem("unacked_index", tag)
                    pipe.execute()

    def queued(self) -> int:
        """Messages waiting in the demo's queue (not those a worker holds)."""
        with self.app.connection_for_read() as connection:
            channel = connection.channel()
            try:
                return int(channel.queue_declare(queue=RACE_QUEUE, passive=True).message_count)
            except connection.channel_errors:
                return 0
            finally:
                channel.close()

    def take_messages(self) -> list[Any]:
        """Take every message waiting in the demo's queue off the broker, in queue order."""
        return take_messages(self.app, RACE_QUEUE)

    def send_back(self, message: Any) -> str:
        """Publish a message taken off the queue again, as it was; return its task id."""
        from celery.contrib.migrate import republish

        with self.app.producer_or_acquire() as producer:
            republish(producer, message, exchange=RACE_QUEUE, routing_key=RACE_QUEUE)
        return str(message.headers["id"])

    def done(self) -> dict[str, Any]:
        """What each task that ran to an end returned, by task id."""
        raw = self.redis.hgetall(counts_key(self.counts, "done"))
        return {key.decode(): json.loads(value) for key, value in raw.items()}

    def _done(self) -> int:
        """The demo's own tasks that ran to an end."""
        keys = self.redis.hkeys(counts_key(self.counts, "done"))
        return sum(1 for key in keys if key.startswith(TASK_PREFIX.encode()))

    def running(self, pool: CeleryWorkers, index: int) -> int:
        """Tasks the pool of worker ``index`` runs now."""
        value = self.redis.hget(counts_key(self.counts, "running"), str(pool.procs[index].pid))
        return int(value or 0)

    def pool(self, name: str, *, concurrency: int = 2) -> CeleryWorkers:
        return CeleryWorkers(name=f"race-demo-{name}", concurrency=concurrency)

    def start(self, pool: CeleryWorkers, count: int) -> None:
        pool.start(count, (RACE_QUEUE,), env={"DEMO_CELERY_COUNTS": self.counts})
        if not pool.wait_ready(90):
            pool.stop()
            raise CommandError(f"the Celery workers did not start within 90 s:\n{pool.logs()[-4000:]}")

    def stop(self, pool: CeleryWorkers) -> None:
        """Stop the pool's workers; their logs go to stderr with ``-v 2``, and are deleted."""
        pool.stop()
        if self.show_worker_output:
            sys.stderr.write(pool.logs())
        shutil.rmtree(pool.log_dir, ignore_errors=True)

    def send(self, task: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> str:
        """Send one of the demo's own tasks to its queue; return the task id."""
        task_id = f"{TASK_PREFIX}{uuid.uuid4()}"
        self.app.send_task(task, args=args, kwargs=kwargs or {}, queue=RACE_QUEUE, task_id=task_id)
        return task_id

    def send_apply(self, request: ProcessedRequest) -> str:
        """Send safeupdates' apply task for ``request`` (what ``enqueue_update()`` sends on commit)."""
        kwargs = {"content_type_id": request.content_type_id, "object_id": request.object_id, "using": "default"}
        return self.send(APPLY_TASK, (str(request.request_id),), kwargs)

    def reversed_queue(self) -> list[Any]:
        """Take the queue's messages off the broker (no worker runs): newest first."""
        return list(reversed(self.take_messages()))

    def run_message(self, message: Any) -> None:
        """Send ``message`` back to the queue and wait until the worker ran its task."""
        task_id = self.send_back(message)
        if not wait_until(lambda: task_id in self.done(), 60):
            raise CommandError("the worker did not run its task within 60 s; is the database locked?")

    # -- (a) the story --------------------------------------------------------------------------

    def story(self) -> tuple[bool, bool]:
        """The seeds' story; return the final ``active`` of the naive path and of safeupdates."""
        from demo_project.toggles.celery_tasks import NAIVE_TOGGLE

        w = self.write
        (profile,) = self.profiles(["story"])
        w('(a) The story from the seeds: a user switches "active" on, then off, and the queue runs the two')
        w("    tasks in reverse order. The demo forces that order in the open: it sends both tasks while no")
        w(f"    worker runs, takes their messages off the broker's queue {RACE_QUEUE!r} and sends them back")
        w("    newest first, one at a time to one worker, so you see the record after each task.")
        w("")
        w("  naive: one task per click, each doing Profile.objects.filter(pk=...).update(active=...)")
        self.reset([profile])
        self.send(NAIVE_TOGGLE, (profile.pk, "active", True))
        w("    click 1  active=True    task 1 sent")
        self.send(NAIVE_TOGGLE, (profile.pk, "active", False))
        w("    click 2  active=False   task 2 sent")
        pool = self.pool("story", concurrency=1)
        try:
            reversed_messages = self.reversed_queue()
            w("    queue reversed: task 2, task 1")
            self.start(pool, 1)
            for label, message in zip(("task 2", "task 1"), reversed_messages, strict=True):
                self.run_message(message)
                profile.refresh_from_db()
                w(f"    worker ran {label}       active={profile.active}")
        finally:
            self.stop(pool)
        naive_active = profile.active
        verdict = "WRONG: the last click said False" if naive_active else "right"
        w(f"    result: active={naive_active}  {verdict}")
        w("")

        w("  safeupdates: enqueue_update(profile, active=...); the task apply_update(request_id) carries ids only")
        self.reset([profile])
        profile.refresh_from_db()
        first = enqueue_update(profile, queue=RACE_QUEUE, active=True)
        w(f"    click 1  active=True    request v{first.version} pending; task 1 sent on commit")
        second = enqueue_update(profile, queue=RACE_QUEUE, active=False)
        w(f"    click 2  active=False   request v{second.version} pending; task 2 sent on commit (Celery")
        w("                            cannot tell that task 1 still waits: every request gets a task)")
        requests = [first, second]
        pool = self.pool("story", concurrency=1)
        try:
            reversed_messages = self.reversed_queue()
            if len(reversed_messages) != 2:
                raise CommandError(f"expected the two tasks of the clicks on the queue, found {len(reversed_messages)}")
            w("    queue reversed: task 2, task 1")
            self.start(pool, 1)
            for label, message in zip(("task 2", "task 1"), reversed_messages, strict=True):
                before = self._statuses(requests)
                self.run_message(message)
                profile.refresh_from_db()
                after = self._statuses(requests)
                changed = [f"v{r.version} {after[r.pk]}" for r in requests if after[r.pk] != before[r.pk]]
                what = ", ".join(changed) if changed else "nothing pending: writes nothing"
                w(f"    worker ran {label}       active={profile.active}   {what}")
        finally:
            self.stop(pool)
        w(f"    result: active={profile.active}  {'right' if profile.active is False else 'WRONG'}")
        w(f"    Task 2 applied the profile's pending requests by version: v{second.version} set active=False;")
        w(f"    v{first.version} is older, so it was marked stale. Task 1 then found its request settled.")
        w("")
        return naive_active, profile.active

    # -- (b) the stress round -------------------------------------------------------------------

    def _round(self, name: str, plan: Plan, profiles: Sequence[Profile], *, safe: bool) -> RoundResult:
        from demo_project.toggles.celery_tasks import NAIVE_TOGGLE

        self.reset(profiles)
        pool = self.pool(name)
        requests: dict[int, ProcessedRequest] = {}
        duplicate_tasks: list[str] = []
        delivered: set[int] = set()
        expected_jobs = plan.deliveries
        bar = tqdm(
            total=expected_jobs, desc=f"    {name:<12}", unit="task", file=sys.stderr, disable=self.progress_disabled
        )
        killer = _CeleryKiller(self, pool, at=expected_jobs // 2)
        relayed: int | None = None
        try:
            self.start(pool, self.workers)
            started = time.monotonic()
            done = 0
            for count, (kind, index) in enumerate(plan.events):
                toggle = plan.toggles[index]
                pk = profiles[toggle.record].pk
                if kind == "click":
                    if safe:
                        change: dict[str, Any] = {toggle.field: toggle.value}
                        requests[index] = enqueue_update(Profile, pk, queue=RACE_QUEUE, **change)
                    continue
                if safe:
                    task_id = self.send_apply(requests[index])
                else:
                    task_id = self.send(NAIVE_TOGGLE, (pk, toggle.field, toggle.value))
                if index in delivered:
                    duplicate_tasks.append(task_id)
                delivered.add(index)
                done = self._progress(bar) if count % 8 == 0 else done
                killer.check(done)
            self._drain_celery(bar, expected_jobs, pool, killer, started)
            if safe:
                relayed = self._relay(pool, profiles, started)
            seconds = time.monotonic() - started
            results = self.done()
        finally:
            self.stop(pool)
            bar.close()
        jobs = sum(1 for task_id in results if task_id.startswith(TASK_PREFIX))
        self.clear_queue()

        expected = plan.expected()
        by_pk = {p.pk: n for n, p in enumerate(profiles)}
        actual = {
            (by_pk[row["pk"]], field): row[field]
            for row in Profile.objects.filter(pk__in=by_pk).values("pk", *FIELDS)
            for field in FIELDS
        }
        wrong = sum(actual[key] != value for key, value in expected.items())
        if safe:
            settled = ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests.values()])
            reapplied = settled.filter(attempts__gt=1).aggregate(n=Sum(F("attempts") - 1))["n"] or 0
            absorbed = plan.duplicates - reapplied
            stale = settled.filter(status=RequestStatus.STALE).count()
        else:
            # A naive task writes every time it runs: a duplicate would be absorbed only if it wrote no row.
            absorbed = sum(1 for task_id in duplicate_tasks if task_id in results and not results[task_id])
            stale = 0
        return RoundResult(
            wrong=wrong,
            fields=plan.fields,
            duplicates=plan.duplicates,
            absorbed=absorbed,
            stale_dropped=stale,
            seconds=seconds,
            jobs=jobs,
            lost=max(0, expected_jobs - jobs),
            killed_busy=killer.busy,
            relayed=relayed,
        )

    def _drain_celery(
        self, bar: tqdm[Any], expected: int, pool: CeleryWorkers, killer: _CeleryKiller, started: float
    ) -> None:
        """Wait until every task sent ran, or the queue is empty and nothing moved (tasks were lost with the
        killed worker: the one it ran and those it held)."""
        last, quiet_since = -1, time.monotonic()
        while True:
            done = self._progress(bar)
            killer.check(done)
            now = time.monotonic()
            if done != last:
                last, quiet_since = done, now
            if killer.done and done >= expected:
                return
            if (
                killer.done
                and now - quiet_since > QUIET_SECONDS
                and self.queued() == 0
                and not any(self.running(pool, index) for index in pool.running())
            ):
                return
            if not pool.alive():
                raise CommandError("every worker died; run with -v 2 to see their output.")
            if now - started > ROUND_TIMEOUT:
                raise CommandError(f"the round did not settle within {ROUND_TIMEOUT:.0f} s.")
            time.sleep(0.05)


class _CeleryKiller:
    """SIGKILLs worker 0 (with its pool processes) once ``at`` tasks are done, in the middle of a task if
    it can."""

    PATIENCE = 3.0

    def __init__(self, demo: CeleryRaceDemo, pool: CeleryWorkers, *, at: int) -> None:
        self.demo, self.pool, self.at = demo, pool, at
        self.done = False
        self.busy = False
        self._since: float | None = None

    def check(self, tasks_done: int) -> None:
        """Kill now if it is time and worker 0 runs a task (one Redis read); never blocks."""
        if self.done or tasks_done < self.at or not self.pool.procs:
            return
        self._since = self._since or time.monotonic()
        busy = self.demo.running(self.pool, 0) > 0
        if not busy and time.monotonic() - self._since < self.PATIENCE:
            return
        self.pool.kill(0)
        self.busy = busy
        self.done = True


__all__ = ["TASK_PREFIX", "CeleryRaceDemo", "broker_url"]
