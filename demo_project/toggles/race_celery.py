"""The race demo with ``DELIVERY=celery`` (``SAFEUPDATES_DELIVERY = "celery"``): the same story and stress
round as on RQ (:mod:`demo_project.toggles.race`), with the same table, on the demo's Celery app
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
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from kombu.utils.url import maybe_sanitize_url
from redis import Redis
from redis.exceptions import RedisError

from demo_project.celery import counts_key
from demo_project.processes import CeleryWorkers, Workers, take_messages, wait_until
from demo_project.toggles.race import RACE_QUEUE, RaceDemo, Write
from safeupdates.delivery.celery import APPLY_TASK, celery_app
from safeupdates.models import ProcessedRequest

#: The ids of the tasks the demo sends itself start with this: the table counts those, not the ones
#: ``enqueue_update()`` and the relay send.
TASK_PREFIX = "race-demo-"


def broker_url() -> str:
    """The demo app's broker, password masked."""
    return str(maybe_sanitize_url(celery_app().conf.broker_url))


class CeleryRaceDemo(RaceDemo):
    """The race demo on Celery, writing its report through ``write`` (progress bars to stderr)."""

    noun = "task"
    sent = "sent"

    def __init__(
        self, *, workers: int, write: Write, progress: bool | None = None, show_worker_output: bool = False
    ) -> None:
        super().__init__(workers=workers, write=write, progress=progress, show_worker_output=show_worker_output)
        self.app = celery_app()
        self.redis = Redis.from_url(settings.REDIS_URL)
        self.counts = f"celery-race-demo:{uuid.uuid4().hex[:8]}"

    def check(self) -> None:
        try:
            self.redis.ping()
        except RedisError as exc:
            raise CommandError(
                f"Redis is not reachable ({exc}); the demo counts the workers' tasks there. Start it with "
                "`redis-server --daemonize yes`, or set REDIS_URL."
            ) from exc
        try:
            self.queued()
        except Exception as exc:
            raise CommandError(f"the Celery broker at {broker_url()} is not reachable ({exc}).") from exc

    def header(self, database: str) -> str:
        return (
            f"safeupdates race demo on Celery: {database}, broker {broker_url()}, queue {RACE_QUEUE!r}, "
            "prefork workers (celery -A demo_project worker)"
        )

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

    def jobs_done(self) -> int:
        """The demo's own tasks that ran to an end."""
        keys = self.redis.hkeys(counts_key(self.counts, "done"))
        return sum(1 for key in keys if key.startswith(TASK_PREFIX.encode()))

    def absorbed(self, duplicate_ids: Sequence[str]) -> int:
        results = self.done()
        return sum(1 for task_id in duplicate_ids if task_id in results and not results[task_id])

    def running(self, pool: Workers, index: int) -> int:
        """Tasks the pool of worker ``index`` runs now."""
        value = self.redis.hget(counts_key(self.counts, "running"), str(pool.procs[index].pid))
        return int(value or 0)

    def send(self, task: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> str:
        """Send one of the demo's own tasks to its queue; return the task id."""
        task_id = f"{TASK_PREFIX}{uuid.uuid4()}"
        self.app.send_task(task, args=args, kwargs=kwargs or {}, queue=RACE_QUEUE, task_id=task_id)
        return task_id

    def send_naive(self, pk: int, field: str, value: bool) -> str:
        from demo_project.toggles.celery_tasks import NAIVE_TOGGLE

        return self.send(NAIVE_TOGGLE, (pk, field, value))

    def send_apply(self, request: ProcessedRequest) -> str:
        """Send safeupdates' apply task for ``request`` (what ``enqueue_update()`` sends on commit)."""
        kwargs = {"content_type_id": request.content_type_id, "object_id": request.object_id, "using": "default"}
        return self.send(APPLY_TASK, (str(request.request_id),), kwargs)

    # -- the workers ----------------------------------------------------------------------------

    def pool(self, name: str, *, concurrency: int = 2) -> CeleryWorkers:
        return CeleryWorkers(name=f"race-demo-{name}", concurrency=concurrency)

    def start(self, pool: Workers, count: int) -> None:
        assert isinstance(pool, CeleryWorkers)
        pool.start(count, (RACE_QUEUE,), env={"DEMO_CELERY_COUNTS": self.counts})
        if not pool.wait_ready(90):
            pool.stop()
            raise CommandError(f"the Celery workers did not start within 90 s:\n{pool.logs()[-4000:]}")

    def stop(self, pool: Workers) -> None:
        """Stop the pool's workers; their logs go to stderr with ``-v 2``, and are deleted."""
        pool.stop()
        if self.show_worker_output:
            sys.stderr.write(pool.logs())
        shutil.rmtree(pool.log_dir, ignore_errors=True)

    def first_worker_busy(self, pool: Workers) -> bool:
        return self.running(pool, 0) > 0

    def kill_first(self, pool: Workers, busy: bool) -> bool:
        """SIGKILL worker 0 with its pool processes."""
        pool.kill(0)
        return busy

    def drained(self, done: int, expected: int, quiet: bool, pool: Workers) -> bool:
        # Tasks lost with the killed worker (the one it ran and those it held) never run: then the queue
        # is empty and nothing moved.
        idle = quiet and self.queued() == 0 and not any(self.running(pool, index) for index in pool.running())
        return done >= expected or idle

    # -- (a) the story --------------------------------------------------------------------------

    def how_reversed(self) -> list[str]:
        return [
            "    tasks in reverse order. The demo forces that order in the open: it sends both tasks while no",
            f"    worker runs, takes their messages off the broker's queue {RACE_QUEUE!r} and sends them back",
            "    newest first, one at a time to one worker, so you see the record after each task.",
        ]

    def second_click(self, second: ProcessedRequest) -> list[str]:
        self.send_apply(second)
        return [
            f"    click 2  active=False   request v{second.version} pending; safeupdates lets it ride on task 1,",
            "                            whose message still waits. To replay the naive schedule, the demo",
            "                            sends task 2 = apply_update(request 2) itself.",
        ]

    @contextmanager
    def reversed_queue(self) -> Iterator[Callable[[], None]]:
        """Take the queue's two messages off the broker (no worker runs), then start one worker; each message
        goes back, newest first, once the one before it ran."""
        messages = list(reversed(take_messages(self.app, RACE_QUEUE)))
        if len(messages) != 2:
            raise CommandError(f"expected the two tasks of the clicks on the queue, found {len(messages)}")
        pool = self.pool("story", concurrency=1)
        try:
            self.start(pool, 1)
            yield lambda: self.run_message(messages.pop(0))
        finally:
            self.stop(pool)

    def run_message(self, message: Any) -> None:
        """Send ``message`` back to the queue and wait until the worker ran its task."""
        task_id = self.send_back(message)
        if not wait_until(lambda: task_id in self.done(), 60):
            raise CommandError("the worker did not run its task within 60 s; is the database locked?")


__all__ = ["TASK_PREFIX", "CeleryRaceDemo", "broker_url"]
