"""The engine of ``manage.py race_demo``: the seeds' race, then a stress round, naive jobs against safeupdates.

Everything runs for real: jobs go through Redis to ``manage.py rqworker`` processes started here, and
write to the demo database. Where the demo forces an order or a failure it says how: the reverse order of
the story comes from reversing the queue's Redis list while no worker runs; the stress round's deliveries
are delayed and duplicated by the plan, and one worker is SIGKILLed.

The demo works on profiles of its own users (``race-demo-*``) and on its own queue (``race_demo``), which it
empties freely; the rest of the database and of Redis is left alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import django_rq
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import F, QuerySet, Sum
from rq.job import Job
from rq.queue import Queue
from rq.results import Result
from rq.utils import as_text
from rq.worker import Worker
from tqdm import tqdm

from demo_project.processes import Workers, wait_until
from demo_project.toggles.jobs import naive_update
from demo_project.toggles.models import Profile
from demo_project.toggles.plan import FIELDS, Plan, RoundResult, what_the_kill_did
from safeupdates.jobs import apply_update, enqueue_update, relay_pending
from safeupdates.models import ProcessedRequest, RequestStatus

#: The queue of the demo (a key of ``RQ_QUEUES``); only workers started by the demo listen to it.
RACE_QUEUE = "race_demo"
USER_PREFIX = "race-demo-"
#: Results of the demo's own jobs are kept this long, so that it can count what they did.
RESULT_TTL = 600
#: Give up (and say so) if a round has not settled after this many seconds.
ROUND_TIMEOUT = 300.0
#: A round is considered drained when nothing moved for this long with an empty queue and idle workers.
QUIET_SECONDS = 2.0

Write = Callable[[str], None]


def redis_url() -> str:
    """The Redis of the demo's queue, as configured."""
    return str(settings.RQ_QUEUES[RACE_QUEUE].get("URL", "?"))


class RaceDemo:
    """Runs the story and the stress round, writing a report through ``write`` (progress bars to stderr)."""

    def __init__(
        self, *, workers: int, write: Write, progress: bool | None = None, show_worker_output: bool = False
    ) -> None:
        self.workers = workers
        self.worker_output = None if show_worker_output else subprocess.DEVNULL
        self.write = write
        # None: tqdm shows bars only on a terminal.
        self.progress_disabled = None if progress is None else not progress
        self.queue: Queue = django_rq.get_queue(RACE_QUEUE, commit_mode="auto")
        self.content_type = ContentType.objects.get_for_model(Profile)

    # -- set-up ---------------------------------------------------------------------------------

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Refuse to run twice at once against the same Redis: both would empty the same queue."""
        key, token = f"{RACE_QUEUE}:running", uuid.uuid4().hex
        redis = self.queue.connection
        if not redis.set(key, token, nx=True, ex=int(ROUND_TIMEOUT * 3)):
            raise CommandError(
                f"another race_demo is running against this Redis ({redis_url()}); wait for it, "
                f"or delete the Redis key {key!r} if it was killed."
            )
        try:
            yield
        finally:
            if redis.get(key) in (token, token.encode()):
                redis.delete(key)

    def profiles(self, names: Sequence[str]) -> list[Profile]:
        """The demo's profiles (created on first use), one per user ``race-demo-<name>``."""
        user_model = get_user_model()
        profiles = []
        for name in names:
            user, _created = user_model.objects.get_or_create(username=f"{USER_PREFIX}{name}")
            profiles.append(Profile.for_user(user))
        return profiles

    def reset(self, profiles: Sequence[Profile]) -> None:
        """All toggles off, the profiles' requests deleted and the demo queue emptied."""
        self.clear_queue()
        self.requests_of(profiles).delete()
        for profile in profiles:
            profile.refresh_from_db()
            for name in FIELDS:
                setattr(profile, name, False)
            # A full save() takes a fresh version: older requests of these rows could never win again.
            profile.save()

    def requests_of(self, profiles: Sequence[Profile]) -> QuerySet[ProcessedRequest]:
        """The request log of ``profiles``."""
        return ProcessedRequest.objects.filter(
            content_type=self.content_type, object_id__in=[str(p.pk) for p in profiles]
        )

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

    def reverse_queue(self) -> list[str]:
        """Reverse the queue's Redis list in one transaction, while no worker runs; return the new order."""
        ids = self.queue.get_job_ids()
        with self.queue.connection.pipeline() as pipe:
            pipe.delete(self.queue.key)
            if ids:
                pipe.rpush(self.queue.key, *reversed(ids))
            pipe.execute()
        return self.queue.get_job_ids()

    def run_one_job(self) -> None:
        """Start a worker that runs exactly one job, then exits."""
        pool = Workers(name="race-demo-step", output=self.worker_output)
        pool.start(1, (RACE_QUEUE,), scheduler=False, burst=True, max_jobs=1, verbosity=0)
        try:
            if not pool.wait(60):
                raise CommandError("the worker did not finish its job within 60 s; is the database locked?")
        finally:
            pool.stop()

    # -- (a) the story --------------------------------------------------------------------------

    def story(self) -> tuple[bool, bool]:
        """The seeds' story; return the final ``active`` of the naive path and of safeupdates."""
        w = self.write
        (profile,) = self.profiles(["story"])
        w('(a) The story from the seeds: a user switches "active" on, then off, and the queue runs the two')
        w("    jobs in reverse order. The demo forces that order in the open: it enqueues both jobs while no")
        w(f"    worker runs, reverses the queue's Redis list ({self.queue.key}), then starts one worker per")
        w("    job, so you see the record after each job.")
        w("")
        w("  naive: one job per click, each doing Profile.objects.filter(pk=...).update(active=...)")
        self.reset([profile])
        self.enqueue(naive_update, profile.pk, "active", True)
        w("    click 1  active=True    job 1 enqueued")
        self.enqueue(naive_update, profile.pk, "active", False)
        w("    click 2  active=False   job 2 enqueued")
        self.reverse_queue()
        w("    queue reversed: job 2, job 1")
        for label in ("job 2", "job 1"):
            self.run_one_job()
            profile.refresh_from_db()
            w(f"    worker ran {label}        active={profile.active}")
        naive_active = profile.active
        verdict = "WRONG: the last click said False" if naive_active else "right"
        w(f"    result: active={naive_active}  {verdict}")
        w("")

        w("  safeupdates: enqueue_update(profile, active=...); the job apply_update(request_id) carries ids only")
        self.reset([profile])
        profile.refresh_from_db()
        first = enqueue_update(profile, queue=RACE_QUEUE, active=True)
        w(f"    click 1  active=True    request v{first.version} pending; job 1 enqueued on commit")
        second = enqueue_update(profile, queue=RACE_QUEUE, active=False)
        w(f"    click 2  active=False   request v{second.version} pending; safeupdates lets it ride on job 1,")
        w("                            which is still queued. To replay the naive schedule, the demo")
        w("                            enqueues job 2 = apply_update(request 2) itself.")
        self.enqueue(apply_update, str(second.request_id))
        self.reverse_queue()
        w("    queue reversed: job 2, job 1")
        requests = [first, second]
        for label in ("job 2", "job 1"):
            before = self._statuses(requests)
            self.run_one_job()
            profile.refresh_from_db()
            after = self._statuses(requests)
            changed = [f"v{r.version} {after[r.pk]}" for r in requests if after[r.pk] != before[r.pk]]
            what = ", ".join(changed) if changed else "nothing pending: writes nothing"
            w(f"    worker ran {label}        active={profile.active}   {what}")
        w(f"    result: active={profile.active}  {'right' if profile.active is False else 'WRONG'}")
        w(f"    Job 2 applied the profile's pending requests by version: v{second.version} set active=False;")
        w(f"    v{first.version} is older, so it was marked stale. Job 1 then found its request settled.")
        w("")
        return naive_active, profile.active

    @staticmethod
    def _statuses(requests: Sequence[ProcessedRequest]) -> dict[int, str]:
        return dict(ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests]).values_list("pk", "status"))

    # -- (b) the stress round -------------------------------------------------------------------

    def stress(self, plan: Plan) -> tuple[RoundResult, RoundResult]:
        """Run ``plan`` through the naive path, then through safeupdates, on the same profiles."""
        w = self.write
        vendor = "PostgreSQL" if connection.vendor == "postgresql" else "SQLite"
        w(
            f"(b) Stress round: {len(plan.toggles)} random toggles on {plan.records} profiles "
            f"({plan.fields} fields), {self.workers} workers, {vendor}, seed {plan.seed}."
        )
        w(
            f"    Each click's job is delivered late by a random delay ({plan.duplicates} of them twice), "
            "while the workers run;"
        )
        w("    worker 1 is SIGKILLed halfway through; then the relay re-delivers whatever is still pending.")
        w("    The same plan for both paths.")
        profiles = self.profiles([f"{n:03d}" for n in range(plan.records)])
        naive = self._round("naive", plan, profiles, safe=False)
        safe = self._round("safeupdates", plan, profiles, safe=True)
        rows = [
            ("wrong fields", f"{naive.wrong}/{naive.fields}", f"{safe.wrong}/{safe.fields}"),
            ("duplicates absorbed", f"{naive.absorbed}/{naive.duplicates}", f"{safe.absorbed}/{safe.duplicates}"),
            ("stale writes dropped", str(naive.stale_dropped), str(safe.stale_dropped)),
            ("time taken", f"{naive.seconds:.1f} s", f"{safe.seconds:.1f} s"),
            ("jobs run", str(naive.jobs), str(safe.jobs)),
            ("SIGKILL hit a running job", _yes(naive.killed_busy), _yes(safe.killed_busy)),
            ("jobs cut off by SIGKILL", str(naive.lost), str(safe.lost)),
            ("records left for the relay", "-", str(safe.relayed)),
        ]
        w("")
        w(f"    {'':<26}{'naive':>10}{'safeupdates':>14}")
        for label, left, right in rows:
            w(f"    {label:<26}{left:>10}{right:>14}")
        w("")
        for line in what_the_kill_did(naive, safe).splitlines():
            w(f"    {line}")
        w("")
        w("    naive writes whatever arrives last. safeupdates gives each click a version from the database;")
        w("    per field, the newest version wins and an older request that arrives late is dropped as stale.")
        w("    A request that is already settled is not applied again, however often its job is delivered.")
        return naive, safe

    def _round(self, name: str, plan: Plan, profiles: Sequence[Profile], *, safe: bool) -> RoundResult:
        self.reset(profiles)
        pool = Workers(name=f"race-demo-{name}", output=self.worker_output)
        requests: dict[int, ProcessedRequest] = {}
        duplicate_jobs: list[str] = []
        delivered: set[int] = set()
        expected_jobs = plan.deliveries
        bar = tqdm(
            total=expected_jobs, desc=f"    {name:<12}", unit="job", file=sys.stderr, disable=self.progress_disabled
        )
        killer = _Killer(pool, self.queue.connection, at=expected_jobs // 2)
        relayed: int | None = None
        try:
            pool.start(self.workers, (RACE_QUEUE,), scheduler=False, verbosity=0)
            self._wait_ready(pool)
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
                    job = self.enqueue(apply_update, str(requests[index].request_id))
                else:
                    job = self.enqueue(naive_update, pk, toggle.field, toggle.value)
                if index in delivered:
                    duplicate_jobs.append(job.id)
                delivered.add(index)
                done = self._progress(bar) if count % 8 == 0 else done
                killer.check(done)
            self._drain(bar, expected_jobs, pool, killer, started)
            if safe:
                relayed = self._relay(pool, profiles, started)
            seconds = time.monotonic() - started
        finally:
            pool.stop()
            bar.close()
            self.forget_workers(pool.killed)
        jobs = self._done()
        self.clear_queue()

        expected = plan.expected()
        by_pk = {p.pk: n for n, p in enumerate(profiles)}
        actual = {
            (by_pk[row["pk"]], name): row[name]
            for row in Profile.objects.filter(pk__in=by_pk).values("pk", *FIELDS)
            for name in FIELDS
        }
        wrong = sum(actual[key] != value for key, value in expected.items())
        if safe:
            settled = ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests.values()])
            # Every settling of a request beyond the first would be a duplicate applied twice.
            reapplied = settled.filter(attempts__gt=1).aggregate(n=Sum(F("attempts") - 1))["n"] or 0
            absorbed = plan.duplicates - reapplied
            stale = settled.filter(status=RequestStatus.STALE).count()
        else:
            # A naive job writes every time it runs: a duplicate would be absorbed only if it wrote no row.
            absorbed = sum(1 for rows in finished_results(self.queue, duplicate_jobs) if not rows)
            stale = 0  # it has no way to tell a stale write from a fresh one
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

    def _done(self) -> int:
        """The demo's jobs that ran to an end (its own jobs keep their result; safeupdates' do not)."""
        finished = self.queue.finished_job_registry.get_job_count(cleanup=False)
        return int(finished + self.queue.failed_job_registry.get_job_count(cleanup=False))

    def _progress(self, bar: tqdm[Any]) -> int:
        done = self._done()
        bar.update(max(0, min(done, bar.total) - bar.n))
        return done

    def _drain(self, bar: tqdm[Any], expected: int, pool: Workers, killer: _Killer, started: float) -> None:
        """Wait until every delivered job ran, or the queue is empty and nothing moved (a job was lost)."""
        last, quiet_since = -1, time.monotonic()
        while True:
            done = self._progress(bar)
            killer.check(done)
            now = time.monotonic()
            if done != last:
                last, quiet_since = done, now
            # The job the killed worker had taken, if any, never finishes: one job fewer to wait for.
            finished = done >= expected - 1 or now - quiet_since > QUIET_SECONDS
            if finished and killer.done and self.queue.count == 0 and not any(pool.busy(i) for i in pool.running()):
                return
            if not pool.alive():
                raise CommandError("every worker died; run with -v 2 to see their output.")
            if now - started > ROUND_TIMEOUT:
                raise CommandError(f"the round did not settle within {ROUND_TIMEOUT:.0f} s.")
            time.sleep(0.05)

    def _wait_ready(self, pool: Workers) -> None:
        """Wait until every worker of ``pool`` has registered with Redis: it then listens to the queue."""
        names = {pool.worker_name(index) for index in range(len(pool.procs))}

        def ready() -> bool:
            registered = {w.name for w in Worker.all(queue=self.queue)}
            return names <= registered

        if not wait_until(ready, timeout=60.0, interval=0.1):
            raise CommandError("the workers did not start within 60 s; run with -v 2 to see their output.")

    def _relay(self, pool: Workers, profiles: Sequence[Profile], started: float) -> int:
        """Deliver again whatever is still pending (as ``safeupdates_relay`` does), until nothing is."""
        pending = self.requests_of(profiles).filter(status=RequestStatus.PENDING)
        relayed = 0
        while pending.exists():
            relayed += relay_pending(older_than=0)
            wait_until(lambda: not pending.exists(), timeout=5.0)
            if time.monotonic() - started > ROUND_TIMEOUT:
                raise CommandError(f"requests still pending after {ROUND_TIMEOUT:.0f} s: {pending.count()}.")
        return relayed


class _Killer:
    """SIGKILLs worker 0 once ``at`` jobs are done, catching it in the middle of a job if it can."""

    #: How long to keep waiting for worker 0 to be busy before killing it anyway.
    PATIENCE = 3.0

    def __init__(self, pool: Workers, redis: Any, *, at: int) -> None:
        self.pool, self.redis, self.at = pool, redis, at
        self.done = False
        self.busy = False
        self._since: float | None = None

    def check(self, jobs_done: int) -> None:
        """Kill now if it is time and worker 0 is running a job (cheap: one Redis read); never blocks."""
        if self.done or jobs_done < self.at or not self.pool.procs:
            return
        self._since = self._since or time.monotonic()
        state = self.redis.hget(Worker.redis_worker_namespace_prefix + self.pool.worker_name(0), "state")
        if as_text(state or b"") == "busy":
            # RQ marks the worker busy just before it forks the work horse that runs the job.
            wait_until(lambda: self.pool.busy(0), timeout=0.2, interval=0.005)
        elif time.monotonic() - self._since < self.PATIENCE:
            return
        self.busy = self.pool.kill(0)
        self.done = True


def finished_results(queue: Queue, job_ids: Sequence[str]) -> list[Any]:
    """Return values of those of the jobs ``job_ids`` that finished (a lost job has none)."""
    jobs = Job.fetch_many(list(job_ids), connection=queue.connection)
    return [job.return_value() for job in jobs if job is not None and job.get_status(refresh=False) == "finished"]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
