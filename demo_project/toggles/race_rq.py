"""The race demo on RQ (``manage.py race_demo``, the default delivery): jobs go through Redis to
``manage.py rqworker`` processes started here.

The reverse order of the story comes from reversing the queue's Redis list while no worker runs, then
starting one worker per job; in the stress round, worker 0 is SIGKILLed with its work horse. The demo's own
jobs keep their result for a while (:data:`RESULT_TTL`): the report counts them in the queue's registries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import django_rq
from django.core.management.base import CommandError
from redis.exceptions import RedisError
from rq.job import Job
from rq.queue import Queue
from rq.results import Result
from rq.utils import as_text
from rq.worker import Worker

from demo_project.processes import Workers, wait_until
from demo_project.toggles.jobs import naive_update
from demo_project.toggles.race import RACE_QUEUE, RaceDemo, Write, redis_url
from safeupdates.jobs import apply_update
from safeupdates.models import ProcessedRequest

#: Results of the demo's own jobs are kept this long, so that it can count what they did.
RESULT_TTL = 600


class RqRaceDemo(RaceDemo):
    """The race demo on RQ, writing its report through ``write`` (progress bars to stderr)."""

    def __init__(
        self, *, workers: int, write: Write, progress: bool | None = None, show_worker_output: bool = False
    ) -> None:
        super().__init__(workers=workers, write=write, progress=progress, show_worker_output=show_worker_output)
        self.queue: Queue = django_rq.get_queue(RACE_QUEUE, commit_mode="auto")
        self.redis = self.queue.connection

    def check(self) -> None:
        try:
            self.redis.ping()
        except RedisError as exc:
            raise CommandError(
                f"Redis is not reachable ({exc}). Start it with `redis-server --daemonize yes`, or set REDIS_URL."
            ) from exc

    def header(self, database: str) -> str:
        return f"safeupdates race demo: {database}, Redis {redis_url()}, queue {RACE_QUEUE!r}"

    # -- the queue ------------------------------------------------------------------------------

    def clear_queue(self) -> None:
        """Empty the demo queue and its registries, deleting their jobs (this queue is the demo's alone)."""
        queue, redis = self.queue, self.queue.connection
        queue.empty()  # type: ignore[no-untyped-call]
        registries = [
            queue.started_job_registry,
            queue.finished_job_registry,
            queue.failed_job_registry,
            queue.deferred_job_registry,
            queue.scheduled_job_registry,
            queue.canceled_job_registry,
        ]
        job_ids = {job_id for registry in registries for job_id in registry.get_job_ids(cleanup=False)}
        # Jobs that a killed worker had taken off the queue but not started.
        job_ids.update(as_text(job_id) for job_id in redis.lrange(queue.intermediate_queue_key, 0, -1))
        with redis.pipeline() as pipe:
            for job_id in job_ids:
                pipe.delete(Job.key_for(job_id), Result.get_key(job_id))  # type: ignore[no-untyped-call]
            pipe.delete(queue.intermediate_queue_key, *(registry.key for registry in registries))
            pipe.execute()

    def forget_workers(self, names: Sequence[str]) -> None:
        """Unregister killed workers, which could not do it themselves."""
        for name in names:
            worker = Worker.find_by_key(Worker.redis_worker_namespace_prefix + name, connection=self.queue.connection)
            if worker is not None:
                worker.register_death()  # type: ignore[no-untyped-call]

    def enqueue(self, func: Callable[..., Any], *args: Any) -> Job:
        """Enqueue one of the demo's own jobs, keeping its result so that the demo can read it."""
        return self.queue.enqueue_call(func, args=args, result_ttl=RESULT_TTL, failure_ttl=RESULT_TTL)

    def send_naive(self, pk: int, field: str, value: bool) -> str:
        return str(self.enqueue(naive_update, pk, field, value).id)

    def send_apply(self, request: ProcessedRequest) -> str:
        return str(self.enqueue(apply_update, str(request.request_id)).id)

    def jobs_done(self) -> int:
        """The demo's jobs that ran to an end (its own jobs keep their result; safeupdates' do not)."""
        finished = self.queue.finished_job_registry.get_job_count(cleanup=False)
        return int(finished + self.queue.failed_job_registry.get_job_count(cleanup=False))

    def absorbed(self, duplicate_ids: Sequence[str]) -> int:
        return sum(1 for rows in finished_results(self.queue, duplicate_ids) if not rows)

    # -- (a) the story --------------------------------------------------------------------------

    def how_reversed(self) -> list[str]:
        return [
            "    jobs in reverse order. The demo forces that order in the open: it enqueues both jobs while no",
            f"    worker runs, reverses the queue's Redis list ({self.queue.key}), then starts one worker per",
            "    job, so you see the record after each job.",
        ]

    def second_click(self, second: ProcessedRequest) -> list[str]:
        self.enqueue(apply_update, str(second.request_id))
        return [
            f"    click 2  active=False   request v{second.version} pending; safeupdates lets it ride on job 1,",
            "                            which is still queued. To replay the naive schedule, the demo",
            "                            enqueues job 2 = apply_update(request 2) itself.",
        ]

    @contextmanager
    def reversed_queue(self) -> Iterator[Callable[[], None]]:
        """Reverse the queue's Redis list in one transaction, while no worker runs; each job then runs in a
        worker started for it alone."""
        ids = self.queue.get_job_ids()
        with self.queue.connection.pipeline() as pipe:
            pipe.delete(self.queue.key)
            if ids:
                pipe.rpush(self.queue.key, *reversed(ids))
            pipe.execute()
        yield self.run_one_job

    def run_one_job(self) -> None:
        """Start a worker that runs exactly one job, then exits."""
        pool = Workers(name="race-demo-step", output=self.worker_output)
        try:
            pool.start(1, (RACE_QUEUE,), scheduler=False, burst=True, max_jobs=1, verbosity=0)
            if not pool.wait(60):
                raise CommandError("the worker did not finish its job within 60 s; is the database locked?")
        finally:
            pool.stop()

    # -- (b) the stress round: the workers ------------------------------------------------------

    def pool(self, name: str) -> Workers:
        return Workers(name=f"race-demo-{name}", output=self.worker_output)

    def start(self, pool: Workers, count: int) -> None:
        """Start the workers, and wait until each has registered with Redis: it then listens to the queue."""
        pool.start(count, (RACE_QUEUE,), scheduler=False, verbosity=0)
        names = {pool.worker_name(index) for index in range(len(pool.procs))}

        def ready() -> bool:
            registered = {w.name for w in Worker.all(queue=self.queue)}
            return names <= registered

        if not wait_until(ready, timeout=60.0, interval=0.1):
            raise CommandError("the workers did not start within 60 s; run with -v 2 to see their output.")

    def stop(self, pool: Workers) -> None:
        pool.stop()
        self.forget_workers(pool.killed)

    def first_worker_busy(self, pool: Workers) -> bool:
        state = self.redis.hget(Worker.redis_worker_namespace_prefix + pool.worker_name(0), "state")
        return as_text(state or b"") == "busy"

    def kill_first(self, pool: Workers, busy: bool) -> bool:
        if busy:
            # RQ marks the worker busy just before it runs the job (in a work horse, or in its own process).
            wait_until(lambda: pool.busy(0), timeout=0.2, interval=0.005)
        return pool.kill(0)

    def drained(self, done: int, expected: int, quiet: bool, pool: Workers) -> bool:
        # The job the killed worker had taken, if any, never finishes: one job fewer to wait for.
        finished = done >= expected - 1 or quiet
        return finished and self.queue.count == 0 and not any(pool.busy(i) for i in pool.running())


def finished_results(queue: Queue, job_ids: Sequence[str]) -> list[Any]:
    """Return values of those of the jobs ``job_ids`` that finished (a lost job has none)."""
    jobs = Job.fetch_many(list(job_ids), connection=queue.connection)
    return [job.return_value() for job in jobs if job is not None and job.get_status(refresh=False) == "finished"]
