"""The engine of ``manage.py race_demo``, whatever the delivery: the seeds' race, then a stress round, naive
jobs against safeupdates.

:class:`RaceDemo` runs both and writes the report; an adapter for each delivery says how to send a job,
start, kill and stop workers, replay two jobs in reverse order and count what ran:
:mod:`~demo_project.toggles.race_rq` (RQ: ``manage.py rqworker`` processes) and
:mod:`~demo_project.toggles.race_celery` (Celery prefork workers). :mod:`~demo_project.toggles.race_tasks`
(Django tasks) tells a shorter story of its own on :class:`RaceBase`.

Everything runs for real: jobs go through the broker to workers started here, and write to the demo
database. Where the demo forces an order or a failure it says how: the reverse order of the story is set up
while no worker runs; the stress round's deliveries are delayed and duplicated by the plan, and one worker
is SIGKILLed.

The demo works on profiles of its own users (``race-demo-*``) and on its own queue (``race_demo``), which it
empties freely; the rest of the database and of the broker is left alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import F, QuerySet, Sum
from redis import Redis
from tqdm import tqdm

from demo_project.processes import Workers, wait_until
from demo_project.toggles.models import Profile
from demo_project.toggles.plan import FIELDS, Plan, RoundResult, summary_line, what_the_kill_did
from safeupdates.jobs import enqueue_update, relay_pending
from safeupdates.models import ProcessedRequest, RequestStatus

#: The queue of the demo; only workers started by the demo listen to it.
RACE_QUEUE = "race_demo"
USER_PREFIX = "race-demo-"
#: Give up (and say so) if a round has not settled after this many seconds.
ROUND_TIMEOUT = 300.0
#: A round is considered drained when nothing moved for this long with an empty queue and idle workers.
QUIET_SECONDS = 2.0

Write = Callable[[str], None]


def redis_url() -> str:
    """The Redis of the demo's queue, as configured."""
    return str(settings.RQ_QUEUES[RACE_QUEUE].get("URL", "?"))


class RaceBase:
    """What the race demo of every delivery has: its profiles and their reset, and what ``race_demo`` calls
    (:meth:`check`, :meth:`header`, :meth:`run`)."""

    def __init__(
        self, *, workers: int, write: Write, progress: bool | None = None, show_worker_output: bool = False
    ) -> None:
        self.workers = workers
        self.write = write
        self.show_worker_output = show_worker_output
        self.worker_output: Any = None if show_worker_output else subprocess.DEVNULL
        # None: tqdm shows bars only on a terminal.
        self.progress_disabled = None if progress is None else not progress
        self.content_type = ContentType.objects.get_for_model(Profile)

    def check(self) -> None:
        """Raise :class:`CommandError` saying what to do if what the demo needs (its broker) does not answer."""

    def header(self, database: str) -> str:
        """The report's first line: the delivery, ``database`` (its vendor and name) and the broker."""
        raise NotImplementedError

    def run(self, plan: Plan) -> str:
        """Run the story and the stress round of ``plan``; return the summary line."""
        raise NotImplementedError

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
        """Empty the demo's queue, deleting its jobs (this queue is the demo's alone)."""
        raise NotImplementedError


class RaceDemo(RaceBase):
    """Runs the story and the stress round on a delivery whose adapter (a subclass) provides the methods
    under "what a delivery provides", writing a report through ``write`` (progress bars to stderr)."""

    #: What the delivery calls the unit of work it carries, and sending one.
    noun = "job"
    sent = "enqueued"
    #: The Redis where :meth:`exclusive` keeps its lock.
    redis: Redis[Any]

    def run(self, plan: Plan) -> str:
        with self.exclusive():
            self.story()
            naive, safe = self.stress(plan)
        return summary_line(naive, safe)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Refuse to run twice at once against the same Redis: both would empty the same queue."""
        key, token = f"{RACE_QUEUE}:running", uuid.uuid4().hex
        if not self.redis.set(key, token, nx=True, ex=int(ROUND_TIMEOUT * 3)):
            raise CommandError(
                f"another race_demo is running against this Redis ({redis_url()}); wait for it, "
                f"or delete the Redis key {key!r} if it was killed."
            )
        try:
            yield
        finally:
            if self.redis.get(key) in (token, token.encode()):
                self.redis.delete(key)

    # -- what a delivery provides ---------------------------------------------------------------

    def how_reversed(self) -> list[str]:
        """Lines 2 to 4 of the story: how the demo forces the reverse order."""
        raise NotImplementedError

    def send_naive(self, pk: int, field: str, value: bool) -> str:
        """Send a naive job (``update(field=value)`` of profile ``pk``) to the demo queue; return its id."""
        raise NotImplementedError

    def send_apply(self, request: ProcessedRequest) -> str:
        """Send safeupdates' apply job of ``request`` (a delivery of its own); return its id."""
        raise NotImplementedError

    def second_click(self, second: ProcessedRequest) -> list[str]:
        """The story's second click with safeupdates (request ``second``): what becomes of its job, and what
        the demo does so that the queue holds one job per click."""
        raise NotImplementedError

    @contextmanager
    def reversed_queue(self) -> Iterator[Callable[[], None]]:
        """With no worker running, put the two jobs waiting in the queue in reverse order; yield a function
        that runs the next one and returns once it ran."""
        raise NotImplementedError
        yield

    def pool(self, name: str) -> Workers:
        """A pool of workers on the demo's queue."""
        raise NotImplementedError

    def start(self, pool: Workers, count: int) -> None:
        """Start ``count`` workers of ``pool``; return once they listen to the queue."""
        raise NotImplementedError

    def stop(self, pool: Workers) -> None:
        """Stop the pool's workers (and forget those killed)."""
        raise NotImplementedError

    def jobs_done(self) -> int:
        """The demo's own jobs that ran to an end (not the ones ``enqueue_update()`` and the relay send)."""
        raise NotImplementedError

    def first_worker_busy(self, pool: Workers) -> bool:
        """Whether worker 0 of ``pool`` runs a job now (cheap: the killer asks it often)."""
        raise NotImplementedError

    def kill_first(self, pool: Workers, busy: bool) -> bool:
        """SIGKILL worker 0 of ``pool`` (``busy``: it said it ran a job); return whether it cut a job off."""
        raise NotImplementedError

    def drained(self, done: int, expected: int, quiet: bool, pool: Workers) -> bool:
        """Whether the round is over, the killer having struck: ``done`` of the ``expected`` jobs ran,
        ``quiet``: nothing moved for :data:`QUIET_SECONDS` (jobs were lost with the killed worker)."""
        raise NotImplementedError

    def absorbed(self, duplicate_ids: Sequence[str]) -> int:
        """How many of the naive path's duplicate jobs wrote no row."""
        raise NotImplementedError

    # -- (a) the story --------------------------------------------------------------------------

    def story(self) -> tuple[bool, bool]:
        """The seeds' story; return the final ``active`` of the naive path and of safeupdates."""
        w, noun = self.write, self.noun
        (profile,) = self.profiles(["story"])
        w('(a) The story from the seeds: a user switches "active" on, then off, and the queue runs the two')
        for line in self.how_reversed():
            w(line)
        w("")
        w(f"  naive: one {noun} per click, each doing Profile.objects.filter(pk=...).update(active=...)")
        self.reset([profile])
        self.send_naive(profile.pk, "active", True)
        w(f"    click 1  active=True    {noun} 1 {self.sent}")
        self.send_naive(profile.pk, "active", False)
        w(f"    click 2  active=False   {noun} 2 {self.sent}")
        with self.reversed_queue() as run_next:
            w(f"    queue reversed: {noun} 2, {noun} 1")
            for label in (f"{noun} 2", f"{noun} 1"):
                run_next()
                profile.refresh_from_db()
                w(f"    worker ran {label:<6}       active={profile.active}")
        naive_active = profile.active
        verdict = "WRONG: the last click said False" if naive_active else "right"
        w(f"    result: active={naive_active}  {verdict}")
        w("")

        w(f"  safeupdates: enqueue_update(profile, active=...); the {noun} apply_update(request_id) carries ids only")
        self.reset([profile])
        profile.refresh_from_db()
        first = enqueue_update(profile, queue=RACE_QUEUE, active=True)
        w(f"    click 1  active=True    request v{first.version} pending; {noun} 1 {self.sent} on commit")
        second = enqueue_update(profile, queue=RACE_QUEUE, active=False)
        for line in self.second_click(second):
            w(line)
        requests = [first, second]
        with self.reversed_queue() as run_next:
            w(f"    queue reversed: {noun} 2, {noun} 1")
            for label in (f"{noun} 2", f"{noun} 1"):
                before = self._statuses(requests)
                run_next()
                profile.refresh_from_db()
                after = self._statuses(requests)
                changed = [f"v{r.version} {after[r.pk]}" for r in requests if after[r.pk] != before[r.pk]]
                what = ", ".join(changed) if changed else "nothing pending: writes nothing"
                w(f"    worker ran {label:<6}       active={profile.active}   {what}")
        w(f"    result: active={profile.active}  {'right' if profile.active is False else 'WRONG'}")
        job = noun.capitalize()
        w(f"    {job} 2 applied the profile's pending requests by version: v{second.version} set active=False;")
        w(f"    v{first.version} is older, so it was marked stale. {job} 1 then found its request settled.")
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
        pool = self.pool(name)
        requests: dict[int, ProcessedRequest] = {}
        duplicate_ids: list[str] = []
        delivered: set[int] = set()
        expected_jobs = plan.deliveries
        bar = tqdm(
            total=expected_jobs, desc=f"    {name:<12}", unit=self.noun, file=sys.stderr, disable=self.progress_disabled
        )
        killer = _Killer(self, pool, at=expected_jobs // 2)
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
                job_id = self.send_apply(requests[index]) if safe else self.send_naive(pk, toggle.field, toggle.value)
                if index in delivered:
                    duplicate_ids.append(job_id)
                delivered.add(index)
                done = self._progress(bar) if count % 8 == 0 else done
                killer.check(done)
            self._drain(bar, expected_jobs, pool, killer, started)
            if safe:
                relayed = self._relay(profiles, started)
            seconds = time.monotonic() - started
        finally:
            self.stop(pool)
            bar.close()
        jobs = self.jobs_done()
        # A naive job writes every time it runs: a duplicate would be absorbed only if it wrote no row.
        naive_absorbed = 0 if safe else self.absorbed(duplicate_ids)
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
            # Every settling of a request beyond the first would be a duplicate applied twice.
            reapplied = settled.filter(attempts__gt=1).aggregate(n=Sum(F("attempts") - 1))["n"] or 0
            absorbed = plan.duplicates - reapplied
            stale = settled.filter(status=RequestStatus.STALE).count()
        else:
            absorbed = naive_absorbed
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

    def _progress(self, bar: tqdm[Any]) -> int:
        done = self.jobs_done()
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
            if killer.done and self.drained(done, expected, now - quiet_since > QUIET_SECONDS, pool):
                return
            if not pool.alive():
                raise CommandError("every worker died; run with -v 2 to see their output.")
            if now - started > ROUND_TIMEOUT:
                raise CommandError(f"the round did not settle within {ROUND_TIMEOUT:.0f} s.")
            time.sleep(0.05)

    def _relay(self, profiles: Sequence[Profile], started: float) -> int:
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

    def __init__(self, demo: RaceDemo, pool: Workers, *, at: int) -> None:
        self.demo, self.pool, self.at = demo, pool, at
        self.done = False
        self.busy = False
        self._since: float | None = None

    def check(self, jobs_done: int) -> None:
        """Kill now if it is time and worker 0 is running a job (cheap: one read of the broker); never blocks."""
        if self.done or jobs_done < self.at or not self.pool.procs:
            return
        self._since = self._since or time.monotonic()
        busy = self.demo.first_worker_busy(self.pool)
        if not busy and time.monotonic() - self._since < self.PATIENCE:
            return
        self.busy = self.demo.kill_first(self.pool, busy)
        self.done = True


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
