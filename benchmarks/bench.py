#!/usr/bin/env python
"""Benchmark of safeupdates against naive baselines, side by side in one run on one table.

Run from the repository root (``make bench`` does)::

    .venv/bin/python benchmarks/bench.py [--rounds 3] [--drain-rounds 1] [--quick] [--only 1,2,3,4,5]

It creates and migrates its own PostgreSQL database (``BENCH_DATABASE_URL``, default
``postgres://postgres@127.0.0.1:5432/safeupdates_bench``), empties its tables, uses one RQ queue of its
own on ``BENCH_REDIS_URL`` (else ``REDIS_URL``), and starts real ``rqworker`` processes for the drain.
Every figure is the median of its rounds; within a round the contenders run in short slices, taking
turns in an order that rotates. A round's ratio is the median of its slice-by-slice ratios, and the table
shows the median of the rounds' ratios.
Exit status: 0 if every target and every correctness check passes, 1 otherwise. See
docs/benchmarks.md for what each row measures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402

django.setup()

import django_rq  # noqa: E402
import psycopg  # noqa: E402
from concurrency.exceptions import RecordModifiedError  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.contenttypes.models import ContentType  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from django_tasks_db.models import DBTaskResult  # noqa: E402  (SAFEUPDATES_DELIVERY = "tasks")
from rq import Queue, Worker  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.results import Result  # noqa: E402

from benchmarks.jobs import GATE_LOCK, gate, naive_toggle, task_gate  # noqa: E402
from benchmarks.saveapp.models import ConcurrencyRow, LockVersionRow, PlainRow  # noqa: E402
from demo_project.processes import TaskWorkers  # noqa: E402
from safeupdates import conf, delivery  # noqa: E402
from safeupdates.database import statements  # noqa: E402
from safeupdates.exceptions import StaleObjectError  # noqa: E402
from safeupdates.jobs import enqueue_update  # noqa: E402
from safeupdates.lifecycle import _RECORDED as RECORDED  # noqa: E402
from safeupdates.models import (  # noqa: E402
    ProcessedRequest,
    RequestKind,
    RequestStatus,
)
from safeupdates.versions import SEQUENCE_NAME  # noqa: E402
from safeupdates.write.validation import MANAGED_FIELDS  # noqa: E402
from tests.testapp.models import Profile  # noqa: E402

TOGGLE_FIELDS = ("active", "newsletter", "dark_mode")
#: SAFEUPDATES_DELIVERY = "tasks" on django-tasks-db's database backend: the third contender of sections 2 and 3.
TASKS_DELIVERY = override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="db")


# --- results ---------------------------------------------------------------------------------------


@dataclass
class Row:
    """One measured contender: its per-round figures (a rate, or seconds)."""

    section: str
    label: str
    unit: str
    figures: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.figures)


@dataclass
class Ratio:
    """A ratio between two contenders, per round, and its target."""

    section: str
    label: str
    figures: list[float]
    target: str
    passes: Callable[[float], bool] | None
    #: The name of one of issue 48's targets this ratio is measured against (the closing table), or "".
    headline: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.figures)

    @property
    def verdict(self) -> str:
        if self.passes is None:
            return "info"
        return "PASS" if self.passes(self.median) else "FAIL"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def row(self, section: str, label: str, unit: str) -> Row:
        row = Row(section, label, unit)
        self.rows.append(row)
        return row

    def ratio(
        self,
        section: str,
        label: str,
        figures: list[float],
        target: str = "",
        passes: Callable[[float], bool] | None = None,
        *,
        headline: str = "",
    ) -> None:
        self.ratios.append(Ratio(section, label, figures, target, passes, headline))

    def check(self, label: str, ok: bool, detail: str = "") -> None:
        self.checks.append((label, ok, detail))

    def print(self) -> bool:
        """Print the tables; return True if every target and check passed."""
        print()
        print(f"{'':3}{'measurement':<58}{'median':>12}  {'unit':<12}{'rounds'}")
        for row in self.rows:
            rounds = ", ".join(_fmt(f) for f in row.figures)
            print(f"{row.section:<3}{row.label:<58}{_fmt(row.median):>12}  {row.unit:<12}{rounds}")
        print()
        print(f"{'':3}{'ratio':<58}{'median':>12}  {'target':<12}{'result':<8}rounds")
        for ratio in self.ratios:
            rounds = ", ".join(f"{f:.2f}" for f in ratio.figures)
            median = f"{ratio.median:.2f}x"
            print(f"{ratio.section:<3}{ratio.label:<58}{median:>12}  {ratio.target:<12}{ratio.verdict:<8}{rounds}")
        if self.checks:
            print()
            for label, ok, detail in self.checks:
                print(f"   {'ok  ' if ok else 'FAIL'} {label}{': ' + detail if detail else ''}")
        self.print_targets()
        return all(r.verdict != "FAIL" for r in self.ratios) and all(ok for _l, ok, _d in self.checks)

    def print_targets(self) -> None:
        """The closing table: one row per target of the write path (issue 48), measured or not run."""
        measured = {ratio.headline: ratio for ratio in self.ratios if ratio.headline}
        print()
        print(f"   {'target':<80}{'measured':>10}  pass")
        for name, section in TARGETS:
            ratio = measured.get(name)
            if ratio is None:
                print(f"   {name:<80}{'-':>10}  not run (section {section})")
            else:
                print(f"   {name:<80}{ratio.median:>9.2f}x  {ratio.verdict}")


#: The targets of the closing table, and the section that measures each (issue 48).
TARGETS = (
    ("update_if_newer(request_id=) >= 0.9x its own statement prepared through psycopg", "1"),
    ("update_if_newer(request_id=) >= 1.2x the naive ORM update", "1"),
    ("save() >= 1.3x plain Django save()", "5"),
    ("save() >= 3x django-concurrency's save()", "5"),
    ("enqueue_update() <= 1.1x the same durable work by hand", "3"),
    ("drain >= 10x one naive job per toggle", "2"),
    ("drain >= the raw one-row UPDATE rate (requests applied/s)", "2"),
    ("save(update_fields=) checked per field >= 0.95x the row-level checked save()", "5"),
)


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.4f}"


def _rotate(items: Sequence[Any], by: int) -> list[Any]:
    by %= len(items)
    return [*items[by:], *items[:by]]


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- set-up ----------------------------------------------------------------------------------------


def prepare_database() -> None:
    """Create (if needed) and migrate the benchmark's PostgreSQL database; refuse any other database."""
    name = connection.settings_dict["NAME"]
    if connection.vendor != "postgresql":
        sys.exit(f"The benchmark needs PostgreSQL; BENCH_DATABASE_URL points at {connection.vendor}.")
    if "bench" not in name:
        sys.exit(
            f"Refusing to run on database {name!r}: the benchmark empties its tables. Point BENCH_DATABASE_URL "
            "at a database whose name contains 'bench' (default: safeupdates_bench)."
        )
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if cursor.fetchone() is None:
            cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
    # run_syncdb: the tables of benchmarks.saveapp, an app without migrations.
    call_command("migrate", verbosity=0, interactive=False, run_syncdb=True)
    empty_tables()


def empty_tables() -> None:
    models = [Profile, ProcessedRequest, PlainRow, ConcurrencyRow, LockVersionRow, DBTaskResult]
    tables = [model._meta.db_table for model in models]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(connection.ops.quote_name(t) for t in tables)}")


def bench_queue() -> Queue:
    """The benchmark's own queue; refuse to start if Redis is unreachable."""
    name = conf.queue_name()
    if name not in settings.RQ_QUEUES:
        sys.exit(f"RQ_QUEUES has no queue {name!r}: run with DJANGO_SETTINGS_MODULE=benchmarks.settings.")
    queue = django_rq.get_queue(name)
    try:
        queue.connection.ping()
    except Exception as exc:
        sys.exit(f"Redis is not reachable at {settings.REDIS_URL} ({exc}); start it or set BENCH_REDIS_URL.")
    return queue


def empty_queue(queue: Queue) -> None:
    """Drop the jobs of the benchmark's queue, its registries and their jobs (only this queue's keys)."""
    queue.empty()  # type: ignore[no-untyped-call]
    for registry in (queue.finished_job_registry, queue.failed_job_registry, queue.started_job_registry):
        ids = registry.get_job_ids(cleanup=False)
        keys = [key for job_id in ids for key in (Job.key_for(job_id), Result.get_key(job_id))]  # type: ignore[no-untyped-call]
        queue.connection.delete(registry.key, *keys)


def make_profiles(count: int) -> list[int]:
    return [p.pk for p in Profile.objects.bulk_create([Profile(name=f"bench {i}") for i in range(count)])]


def versions(count: int) -> list[int]:
    """Allocate ``count`` versions from the version source in one query (outside the timed code)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(%s) FROM generate_series(1, %s)", [SEQUENCE_NAME, count])
        return [row[0] for row in cursor.fetchall()]


def timed(function: Callable[[], Any]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


Slice = Callable[[int], float]


class Timings(dict[str, float]):
    """One round: the seconds each contender took in all (the dict), and in each slice (:attr:`slices`)."""

    def __init__(self) -> None:
        super().__init__()
        self.slices: dict[str, list[float]] = {}

    def add(self, name: str, seconds: float) -> None:
        self[name] = self.get(name, 0.0) + seconds
        self.slices.setdefault(name, []).append(seconds)

    def ratio(self, numerator: str, denominator: str) -> float:
        """``numerator``'s seconds over ``denominator``'s: the median of the ratios of their slices of the
        same index, which ran one right after the other (:func:`interleaved`).

        Side by side, two slices share whatever load the machine had at that moment; a burst from
        another process that slows one slice of one contender moves one ratio of the round, not the
        round's total. The ratio of the totals is the rate rows' (``self[name]``)."""
        pairs = list(zip(self.slices.get(numerator, ()), self.slices.get(denominator, ()), strict=True))
        if not pairs:
            raise ValueError(f"no slices of {numerator!r} and {denominator!r} ran side by side")
        return statistics.median(top / bottom for top, bottom in pairs)


def interleaved(contenders: Sequence[tuple[str, Slice]], slices: int, round_: int) -> Timings:
    """Run ``slices`` slices of every contender, alternating between them; return the seconds of each.

    Each slice function prepares its slice (untimed), runs it and returns the seconds it took. Slices
    are short (a tenth of a second or so) and their order rotates, so that a burst of load from
    another process on this machine slows every contender alike instead of one whole measurement;
    ratios are taken slice by slice (:meth:`Timings.ratio`).
    """
    timings = Timings()
    for index in range(slices):
        for name, function in _rotate(contenders, round_ + index):
            timings.add(name, function(index))
    return timings


# --- 1. single-row writes --------------------------------------------------------------------------


def bench_single_row(report: Report, rounds: int, ops: int, slices: int) -> None:
    """Raw autocommit UPDATE vs naive ORM update vs update_if_newer, on the same rows of one table."""
    pks = make_profiles(500)
    table = connection.ops.quote_name(Profile._meta.db_table)
    raw_sql = f'UPDATE {table} SET "active" = %s WHERE "id" = %s'
    manager = Profile.objects
    per_slice = ops // slices
    counter = iter(range(10**9))

    def todo() -> list[tuple[int, bool, int]]:
        start = next(counter) * per_slice
        return [
            (pks[(start + i) % len(pks)], (start + i) // len(pks) % 2 == 0, v)
            for i, v in enumerate(versions(per_slice))
        ]

    def raw(_index: int) -> float:
        work = todo()
        start = time.perf_counter()
        with connection.cursor() as cursor:
            for pk, value, _version in work:
                cursor.execute(raw_sql, (value, pk))
        return time.perf_counter() - start

    def naive(_index: int) -> float:
        work = todo()
        start = time.perf_counter()
        for pk, value, _version in work:
            manager.filter(pk=pk).update(active=value)
        return time.perf_counter() - start

    def guarded_request(_index: int) -> float:
        work = [(pk, value, version, uuid.uuid4()) for pk, value, version in todo()]
        start = time.perf_counter()
        for pk, value, version, request_id in work:
            manager.update_if_newer(pk, version=version, request_id=request_id, active=value)
        return time.perf_counter() - start

    def guarded(_index: int) -> float:
        work = todo()
        start = time.perf_counter()
        for pk, value, version in work:
            manager.update_if_newer(pk, version=version, active=value)
        return time.perf_counter() - start

    def hand_recorded(_index: int) -> float:
        """What any code that records the request and writes the row in one statement can reach at best."""
        return recorded_by_hand([(pk, value, version, uuid.uuid4()) for pk, value, version in todo()])

    contenders: list[tuple[str, Slice]] = [
        ("raw", raw),
        ("naive", naive),
        ("guarded_request", guarded_request),
        ("guarded", guarded),
        ("hand_recorded", hand_recorded),
    ]
    rows = {
        "raw": report.row("1", "raw UPDATE, autocommit (cursor.execute)", "writes/s"),
        "naive": report.row("1", "naive Profile.objects.filter(pk=).update()", "writes/s"),
        "guarded_request": report.row("1", "update_if_newer(pk, version=, request_id=, active=)", "writes/s"),
        "guarded": report.row("1", "  (update_if_newer(pk, version=, active=), no request_id)", "writes/s"),
        "hand_recorded": report.row("1", "  (its statement hand-written, prepared psycopg cursor)", "writes/s"),
    }
    interleaved(contenders, 1, 0)  # warm-up: connections, caches, prepared statements
    per_round = []
    for round_ in range(rounds):
        seconds = interleaved(contenders, slices, round_)
        for name, total in seconds.items():
            rows[name].figures.append(per_slice * slices / total)
        per_round.append(seconds)
        _progress(f"  1. single-row writes: round {round_ + 1}/{rounds} done")
    report.ratio(
        "1",
        "update_if_newer(request_id) / naive ORM update",
        [s.ratio("naive", "guarded_request") for s in per_round],
        ">= 1.2x",
        lambda x: x >= 1.2,
        headline=TARGETS[1][0],
    )
    report.ratio(
        "1",
        "update_if_newer(request_id) / its statement via psycopg",
        [s.ratio("hand_recorded", "guarded_request") for s in per_round],
        ">= 0.9x",
        lambda x: x >= 0.9,
        headline=TARGETS[0][0],
    )
    report.ratio(
        "1",
        "  (the most it can be: its statement hand-written / naive)",
        [s.ratio("naive", "hand_recorded") for s in per_round],
    )
    report.ratio(
        "1",
        "update_if_newer(request_id) / raw UPDATE",
        [s.ratio("raw", "guarded_request") for s in per_round],
        ">= 0.5x",
        lambda x: x >= 0.5,
    )


# --- 2. drain of a burst of toggles by real workers ------------------------------------------------


class Workers:
    """``rqworker`` processes started by the benchmark, each in a session of its own."""

    def __init__(self, queue: str, count: int, options: Sequence[str] = ()) -> None:
        # Closed in stop(); kept after a failure so that its path can be reported.
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="safeupdates-bench-workers-", suffix=".log", delete=False
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "rqworker", queue, *options],
                cwd=ROOT,
                env=env,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for _ in range(count)
        ]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # Our own session: the worker and its work horse, nothing else.
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.log.close()

    def remove_log(self) -> None:
        Path(self.log.name).unlink(missing_ok=True)

    def check_alive(self) -> None:
        if any(proc.poll() is not None for proc in self.procs):
            sys.exit(f"An rqworker process exited; see {self.log.name}.")


@contextmanager
def workers(queue: Queue, count: int, options: Sequence[str] = ()) -> Iterator[Workers]:
    """``count`` rqworker processes on ``queue``, with ``options`` (``--with-scheduler`` ...)."""
    pool = Workers(queue.name, count, options)
    try:
        yield pool
    finally:
        pool.stop()
    pool.remove_log()  # only after a clean run: a failure reports the log's path


@contextmanager
def task_workers(count: int) -> Iterator[TaskWorkers]:
    """``count`` db_worker processes (django-tasks-db) on the benchmark's queue, for SAFEUPDATES_DELIVERY
    = "tasks"; their output in a log file whose path a failure reports."""
    log_dir = Path(tempfile.mkdtemp(prefix="safeupdates-bench-db-workers-"))
    pool = TaskWorkers(log_dir, backend="db", name="bench")
    pool.start(count, (conf.queue_name(),), verbosity=0)
    try:
        yield pool
    finally:
        pool.stop()


def _jobs_run(queue: Queue) -> int:
    """Jobs the queue's workers have finished or failed so far (RQ's own counters)."""
    return sum(w.successful_job_count + w.failed_job_count for w in Worker.all(queue=queue))


def wait_for(
    predicate: Callable[[], bool], what: str, pool: Workers | TaskWorkers, timeout: float = 120, poll: float = 0.01
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            log = pool.log.name if isinstance(pool, Workers) else pool.log_dir
            sys.exit(f"Timed out after {timeout}s waiting for {what}; worker log: {log}.")
        if isinstance(pool, Workers):
            pool.check_alive()
        elif pool.alive() < len(pool.procs):
            sys.exit(f"A db_worker process exited; see {pool.log_dir}.")
        time.sleep(poll)


Toggle = tuple[int, str, bool]


def toggles(pks: Sequence[int], count: int, seed: int) -> tuple[list[Toggle], dict[tuple[int, str], bool]]:
    """``count`` toggles on ``pks`` (each flips the last requested value) and the final state they ask for."""
    rng = random.Random(seed)
    wanted: dict[tuple[int, str], bool] = {(pk, name): False for pk in pks for name in TOGGLE_FIELDS}
    plan = []
    for _ in range(count):
        key = (rng.choice(pks), rng.choice(TOGGLE_FIELDS))
        wanted[key] = not wanted[key]
        plan.append((*key, wanted[key]))
    return plan, wanted


def raw_updates(plan: Sequence[Toggle]) -> None:
    """Each toggle of ``plan`` as one raw autocommit UPDATE (the database's rate for single-row writes)."""
    qn = connection.ops.quote_name
    table = qn(Profile._meta.db_table)
    # Built before the loop: the loop times the database, not the building of its SQL.
    sql = {name: f"UPDATE {table} SET {qn(name)} = %s WHERE {qn('id')} = %s" for name in TOGGLE_FIELDS}
    with connection.cursor() as cursor:
        for pk, name, value in plan:
            cursor.execute(sql[name], (value, pk))


def one_change(name: str, value: bool) -> dict[str, Any]:
    return {name: value}


def wrong_fields(wanted: dict[tuple[int, str], bool]) -> int:
    records = Profile.objects.filter(pk__in={pk for pk, _n in wanted}).values("pk", *TOGGLE_FIELDS)
    rows = {row["pk"]: row for row in records}
    return sum(rows[pk][name] is not value for (pk, name), value in wanted.items())


def bench_drain(report: Report, queue: Queue, rounds: int, toggle_count: int, records: int, worker_count: int) -> None:
    """One RQ job per toggle (naive) vs enqueue_update + coalescing apply_update, drained by real workers.

    Both workers are first held by a gate job each; the whole burst is enqueued behind them; the clock
    starts when the gates are released and stops when the last toggle is applied.
    """
    pks = make_profiles(records)
    naive_row = report.row("2", f"drain {toggle_count} toggles/{records} records: naive 1 job per toggle", "s")
    safe_row = report.row("2", f"drain {toggle_count} toggles/{records} records: enqueue_update+apply_update", "s")
    naive_enqueue = report.row("2", f"  (enqueue the burst: {toggle_count} naive queue.enqueue())", "s")
    safe_enqueue = report.row("2", f"  (enqueue the burst: {toggle_count} enqueue_update())", "s")
    jobs_row = report.row("2", "  (apply_update jobs queued for the burst)", "jobs")
    ran_row = report.row("2", "  (... of which ran: the others were swept by a running job)", "jobs")
    raw_row = report.row("2", f"  (the same {toggle_count} toggles as raw single-row UPDATEs, after the drain)", "s")
    tasks_row = report.row("2", f"drain {toggle_count} toggles/{records} records: Django tasks (db_worker)", "s")
    tasks_enqueue = report.row("2", f"  (enqueue the burst: {toggle_count} enqueue_update(), tasks)", "s")
    tasks_jobs = report.row("2", "  (apply_update tasks run for the burst, django-tasks-db)", "tasks")
    naive_wrong: list[int] = []
    safe_wrong: list[int] = []
    tasks_wrong: list[int] = []
    held: list[bool] = []

    # A drain's time grows with the burst: 120 s at least, a generous 100 ms per toggle beyond.
    timeout = max(120.0, toggle_count * 0.1)

    with workers(queue, worker_count) as pool:

        def run(kind: str, round_: int) -> None:
            if kind == "tasks":
                run_tasks(round_)
                return
            plan, wanted = toggles(pks, toggle_count, seed=round_)
            Profile.objects.filter(pk__in=pks).update(**dict.fromkeys(TOGGLE_FIELDS, False))
            empty_queue(queue)
            started, release = f"safeupdates-bench:gate:{uuid.uuid4()}", f"safeupdates-bench:release:{uuid.uuid4()}"
            for _ in range(worker_count):
                # Held for as long as enqueueing the burst takes (minutes at 20,000 on a busy machine):
                # RQ's job timeout would otherwise kill a gate, and the drain would start early.
                queue.enqueue(gate, started, release, int(timeout), result_ttl=600, job_timeout=int(timeout) + 60)
            wait_for(lambda: int(queue.connection.get(started) or 0) >= worker_count, "the workers to start", pool)
            first_request = ProcessedRequest.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            if kind == "naive":
                naive_enqueue.figures.append(
                    timed(lambda: [queue.enqueue(naive_toggle, *toggle, result_ttl=600) for toggle in plan])
                )
            else:
                safe_enqueue.figures.append(
                    timed(lambda: [enqueue_update(Profile, pk, **one_change(name, value)) for pk, name, value in plan])
                )
                jobs_row.figures.append(queue.count)
            ran_before = _jobs_run(queue)
            finished = queue.finished_job_registry
            held.append(finished.get_job_count(cleanup=False) == 0)
            start = time.perf_counter()
            queue.connection.rpush(release, *["go"] * worker_count)
            if kind == "naive":
                total = toggle_count + worker_count
                wait_for(lambda: finished.get_job_count(cleanup=False) >= total, "the naive drain", pool, timeout)
            else:
                pending = ProcessedRequest.objects.filter(pk__gt=first_request, status=RequestStatus.PENDING)
                wait_for(lambda: not pending.exists(), "the safeupdates drain", pool, timeout)
            elapsed = time.perf_counter() - start
            (naive_row if kind == "naive" else safe_row).figures.append(elapsed)
            (naive_wrong if kind == "naive" else safe_wrong).append(wrong_fields(wanted))
            wait_for(
                lambda: queue.count == 0 and queue.started_job_registry.get_job_count() == 0,
                "idle workers",
                pool,
                timeout,
            )
            if kind != "naive":
                ran_row.figures.append(_jobs_run(queue) - ran_before - worker_count)  # not the gates
                # The database's own rate for the same writes at the same moment: one autocommit UPDATE
                # per toggle, from one connection (section 1's raw contender).
                raw_row.figures.append(timed(lambda: raw_updates(plan)))
            queue.connection.delete(started, release)

        def run_tasks(round_: int) -> None:
            """The burst through SAFEUPDATES_DELIVERY = "tasks": db_workers (started for this run only: idle,
            they poll the database) held by a gate task each (an advisory lock of ours), the burst enqueued
            behind them, the clock from the release."""
            with task_workers(worker_count) as task_pool:
                drain_tasks(round_, task_pool)

        def drain_tasks(round_: int, task_pool: TaskWorkers) -> None:
            plan, wanted = toggles(pks, toggle_count, seed=round_)
            Profile.objects.filter(pk__in=pks).update(**dict.fromkeys(TOGGLE_FIELDS, False))
            DBTaskResult.objects.all().delete()
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_lock(%s)", [GATE_LOCK])
            try:
                for _ in range(worker_count):
                    task_gate.enqueue()
                running = DBTaskResult.objects.filter(status="RUNNING")
                wait_for(lambda: running.count() >= worker_count, "the db_workers to start", task_pool)
                first_request = ProcessedRequest.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
                with TASKS_DELIVERY:
                    burst = [(pk, one_change(name, value)) for pk, name, value in plan]
                    tasks_enqueue.figures.append(timed(lambda: [enqueue_update(Profile, pk, **c) for pk, c in burst]))
                tasks_jobs.figures.append(DBTaskResult.objects.filter(status="READY").count())
                start = time.perf_counter()
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [GATE_LOCK])
            pending = ProcessedRequest.objects.filter(pk__gt=first_request, status=RequestStatus.PENDING)
            wait_for(lambda: not pending.exists(), "the Django tasks drain", task_pool, timeout)
            tasks_row.figures.append(time.perf_counter() - start)
            tasks_wrong.append(wrong_fields(wanted))
            busy = DBTaskResult.objects.filter(status__in=["READY", "RUNNING"])
            wait_for(lambda: not busy.exists(), "idle db_workers", task_pool, timeout)

        for round_ in range(rounds):
            for kind in _rotate(["naive", "safe", "tasks"], round_):
                run(kind, round_)
            _progress(f"  2. drain: round {round_ + 1}/{rounds} done")
    report.ratio(
        "2",
        "drain: naive time / enqueue_update+apply_update time",
        [n / s for n, s in zip(naive_row.figures, safe_row.figures, strict=True)],
        ">= 10x",
        lambda x: x >= 10.0,
        headline=TARGETS[5][0],
    )
    # Coalescing writes many requests at once: the drain applies requests at least as fast as single
    # UPDATEs of the same toggles run, timed right after it (a busy machine moves both alike).
    report.ratio(
        "2",
        "drain: requests applied/s / raw single-row UPDATE/s, same toggles",
        [raw / safe for raw, safe in zip(raw_row.figures, safe_row.figures, strict=True)],
        ">= 1.0x",
        lambda x: x >= 1.0,
        headline=TARGETS[6][0],
    )
    report.check("drain: the gates held every burst until it was queued (no job ran before)", all(held), f"{held}")
    report.ratio(
        "2",
        "drain: Django tasks (db_worker) time / RQ time",
        [t / s for t, s in zip(tasks_row.figures, safe_row.figures, strict=True)],
    )
    report.check(
        "drain: enqueue_update+apply_update final state = newest request per field",
        not any(safe_wrong),
        f"wrong fields per round: {safe_wrong}",
    )
    report.check(
        "drain: Django tasks final state = newest request per field",
        not any(tasks_wrong),
        f"wrong fields per round: {tasks_wrong}",
    )
    report.check(
        "drain: naive final state (informational: no ordering guarantee)",
        True,
        f"wrong fields per round: {naive_wrong}",
    )


# --- 3. enqueue cost -------------------------------------------------------------------------------


def bench_enqueue(report: Report, queue: Queue, rounds: int, calls: int, slices: int) -> None:
    """enqueue_update (request row + version + job on commit) vs a plain queue.enqueue() of a naive job.

    No worker runs. Every slice takes records that have no queued job and no pending request, so each
    enqueue_update call enqueues a job, as every naive call does; the same records are then toggled
    again while their job is queued (the burst path, informational). Before each round the queue is
    emptied and the pending requests deleted, as if a worker had applied them.
    """
    per_slice = calls // slices
    pks = make_profiles(per_slice * slices)
    naive_row = report.row("3", "naive queue.enqueue(naive_toggle, ...) (queue reused)", "us/call")
    django_rq_row = report.row("3", "  (django_rq.get_queue(name).enqueue(...), per call)", "us/call")
    safe_row = report.row("3", "enqueue_update(Profile, pk, active=), autocommit, new job", "us/call")
    burst_row = report.row("3", "  (enqueue_update while the record's job is queued)", "us/call")
    tasks_row = report.row("3", "enqueue_update, Django tasks (django-tasks-db), new task", "us/call")
    tasks_burst_row = report.row("3", "  (enqueue_update, tasks, while the record's task waits)", "us/call")
    hand_row = report.row("3", "by hand: pending INSERT + on_commit(queue.enqueue)", "us/call")
    tasks_pks = make_profiles(per_slice * slices)
    hand_pks = make_profiles(per_slice * slices)

    def chunk(index: int) -> list[int]:
        return pks[index * per_slice : (index + 1) * per_slice]

    def naive(index: int) -> float:
        records = chunk(index)
        return timed(lambda: [queue.enqueue(naive_toggle, pk, "active", True) for pk in records])

    def naive_django_rq(index: int) -> float:
        records = chunk(index)
        return timed(
            lambda: [django_rq.get_queue(queue.name).enqueue(naive_toggle, pk, "active", True) for pk in records]
        )

    def safe(index: int) -> float:
        records = chunk(index)
        return timed(lambda: [enqueue_update(Profile, pk, active=True) for pk in records])

    def burst(index: int) -> float:
        records = chunk(index)
        return timed(lambda: [enqueue_update(Profile, pk, active=False) for pk in records])

    def tasks(index: int, value: bool = True) -> float:
        records = tasks_pks[index * per_slice : (index + 1) * per_slice]
        with TASKS_DELIVERY:
            return timed(lambda: [enqueue_update(Profile, pk, active=value) for pk in records])

    def by_hand(index: int) -> float:
        """The same durable work, hand-written: the outbox row (enqueue_update's own INSERT, on a bare
        prepared psycopg cursor, committed by itself in autocommit), then the job, on commit."""
        records = hand_pks[index * per_slice : (index + 1) * per_slice]
        cursor = hand_cursor()

        def enqueue_on_commit(pk: int) -> None:
            transaction.on_commit(functools.partial(queue.enqueue, naive_toggle, pk, "active", True))

        return timed(lambda: pending_by_hand(cursor, records, enqueue_on_commit))

    contenders: list[tuple[str, Slice]] = [
        ("naive", naive),
        ("django_rq", naive_django_rq),
        ("safe", safe),
        ("tasks", tasks),
        ("hand", by_hand),
    ]
    rows = {"naive": naive_row, "django_rq": django_rq_row, "safe": safe_row, "tasks": tasks_row, "hand": hand_row}
    interleaved(contenders, 1, 0)  # warm-up
    per_round = []
    for round_ in range(rounds):
        # As after a worker applied everything: no job queued and no request pending, for any record.
        empty_queue(queue)
        ProcessedRequest.objects.filter(status=RequestStatus.PENDING).delete()
        DBTaskResult.objects.all().delete()
        seconds = interleaved(contenders, slices, round_)
        # Every record now has a queued apply job: the same records again take the burst path.
        seconds["burst"] = sum(burst(index) for index in range(slices))
        rows["burst"] = burst_row
        seconds["tasks_burst"] = sum(tasks(index, False) for index in range(slices))
        rows["tasks_burst"] = tasks_burst_row
        for name, total in seconds.items():
            rows[name].figures.append(total / (per_slice * slices) * 1e6)
        per_round.append(seconds)
        _progress(f"  3. enqueue cost: round {round_ + 1}/{rounds} done")
    empty_queue(queue)
    ProcessedRequest.objects.filter(status=RequestStatus.PENDING).delete()
    DBTaskResult.objects.all().delete()
    report.ratio(
        "3",
        "enqueue_update / the same durable work by hand",
        [s.ratio("safe", "hand") for s in per_round],
        "<= 1.1x",
        lambda x: x <= 1.1,
        headline=TARGETS[4][0],
    )
    report.ratio(
        "3",
        "  (enqueue cost: enqueue_update / naive queue.enqueue())",
        [s.ratio("safe", "naive") for s in per_round],
    )
    report.ratio(
        "3",
        "enqueue cost: enqueue_update on Django tasks / on RQ",
        [s.ratio("tasks", "safe") for s in per_round],
    )


# --- 4. bulk ---------------------------------------------------------------------------------------


def bench_bulk(report: Report, rounds: int, count: int, slices: int) -> None:
    """bulk_update_if_newer(updates) vs a loop of update_if_newer over the same kind of updates."""
    pks = make_profiles(500)
    rng = random.Random(4)
    per_slice = count // slices
    loop_row = report.row("4", f"loop of update_if_newer, {per_slice} updates on {len(pks)} rows", "updates/s")
    bulk_row = report.row("4", f"bulk_update_if_newer, the same {per_slice} updates in one call", "updates/s")
    wrong: list[int] = []

    def plan() -> list[tuple[int, int, dict[str, Any]]]:
        fields = (*TOGGLE_FIELDS, "score")
        updates = []
        for version in versions(per_slice):
            names = rng.sample(fields, rng.choice((1, 1, 2)))
            changes = {name: rng.randrange(100) if name == "score" else rng.random() < 0.5 for name in names}
            updates.append((rng.choice(pks), version, changes))
        return updates

    def loop(_index: int) -> float:
        updates = plan()
        start = time.perf_counter()
        for pk, version, changes in updates:
            Profile.objects.update_if_newer(pk, version=version, **changes)
        return time.perf_counter() - start

    def bulk(_index: int) -> float:
        updates = plan()
        elapsed = timed(lambda: Profile.objects.bulk_update_if_newer(updates))
        newest = {(pk, name): value for pk, _v, changes in updates for name, value in changes.items()}
        state = {row["pk"]: row for row in Profile.objects.filter(pk__in=pks).values("pk", *TOGGLE_FIELDS, "score")}
        wrong.append(sum(state[pk][name] != value for (pk, name), value in newest.items()))
        return elapsed

    contenders: list[tuple[str, Slice]] = [("loop", loop), ("bulk", bulk)]
    interleaved(contenders, 1, 0)  # warm-up
    wrong.clear()
    per_round = []
    for round_ in range(rounds):
        seconds = interleaved(contenders, slices, round_)
        loop_row.figures.append(per_slice * slices / seconds["loop"])
        bulk_row.figures.append(per_slice * slices / seconds["bulk"])
        per_round.append(seconds)
        _progress(f"  4. bulk: round {round_ + 1}/{rounds} done")
    report.ratio(
        "4",
        "bulk_update_if_newer / loop of update_if_newer",
        [s.ratio("loop", "bulk") for s in per_round],
        ">= 5.0x",
        lambda x: x >= 5.0,
    )
    report.check(
        "bulk: final state = newest update per field",
        not any(wrong),
        f"{sum(wrong)} wrong fields in {len(wrong)} batches",
    )


# --- 5. save() of an existing row ------------------------------------------------------------------


#: The tables of section 5, one per contender, of one shape.
VERSIONED_CONTENDERS: dict[str, type[PlainRow | ConcurrencyRow | LockVersionRow]] = {
    "plain": PlainRow,
    "concurrency": ConcurrencyRow,
    "lock_version": LockVersionRow,
}


def timed_rounds(
    contenders: Sequence[tuple[str, Slice]],
    rows: dict[str, Row],
    rounds: int,
    slices: int,
    per_slice: int,
    what: str,
) -> list[Timings]:
    """A warm-up, then ``rounds`` interleaved rounds: each contender's rate per round goes to its row.
    Returns the seconds each contender took, per round."""
    interleaved(contenders, 1, 0)  # warm-up
    per_round = []
    for round_ in range(rounds):
        seconds = interleaved(contenders, slices, round_)
        for name, total in seconds.items():
            rows[name].figures.append(per_slice * slices / total)
        per_round.append(seconds)
        _progress(f"  {what}: round {round_ + 1}/{rounds} done")
    return per_round


def versioned_ratios(
    report: Report,
    what: str,
    per_round: Sequence[Timings],
    *,
    against_plain: float = 0.85,
    against_concurrency: float = 1.0,
    headlines: tuple[str, str] = ("", ""),
) -> None:
    """The targets of section 5: ``LockVersionMixin`` at least ``against_plain`` times plain Django's rate
    (0.85x by default), and ahead of django-concurrency (at least ``against_concurrency`` times its rate;
    by default strictly ahead). save() has issue 48's: 1.3x and 3x."""
    report.ratio(
        "5",
        f"{what}: LockVersionMixin / plain Django",
        [s.ratio("plain", "lock_version") for s in per_round],
        f">= {against_plain}x",
        lambda x: x >= against_plain,
        headline=headlines[0],
    )
    strictly = against_concurrency == 1.0
    report.ratio(
        "5",
        f"{what}: LockVersionMixin / django-concurrency",
        [s.ratio("concurrency", "lock_version") for s in per_round],
        "> 1.0x" if strictly else f">= {against_concurrency}x",
        (lambda x: x > 1.0) if strictly else (lambda x: x >= against_concurrency),
        headline=headlines[1],
    )


def bench_save(report: Report, rounds: int, ops: int, slices: int) -> None:
    """``save()`` of a loaded, existing row: plain Django vs django-concurrency vs ``LockVersionMixin``.

    Three tables of one shape (``benchmarks.saveapp``), 200 rows per contender, loaded once; each save
    flips ``active`` of the next instance (flipped before the clock starts) and saves the whole row in
    autocommit, as a view or a job would. Every instance stays current: a versioned save updates the
    instance's version, so none of the timed saves is a conflict. ``LockVersionMixin.save()`` runs
    twice: as installed (a prepared statement on PostgreSQL) and with
    ``SAFEUPDATES_PREPARED_STATEMENTS = False``, as behind a pooler without prepared statements.
    """
    count = 200
    contenders_models = {**VERSIONED_CONTENDERS, "unprepared": LockVersionRow, "hand": LockVersionRow}
    instances: dict[str, list[Any]] = {}
    for name, model in contenders_models.items():
        # One by one: django-concurrency sets the first version in save().
        created = [model(name=f"bench {i}") for i in range(count)]
        for obj in created:
            obj.save()
        instances[name] = list(model.objects.filter(pk__in=[obj.pk for obj in created]).order_by("pk"))
    per_slice = ops // slices
    position = dict.fromkeys(contenders_models, 0)

    columns, save_sql = checked_save_by_hand()

    def hand_save(_index: int) -> float:
        """``LockVersionMixin.save()``'s own checked UPDATE, as section 7 runs it: the most any
        one-statement checked save can reach."""
        rows = instances["hand"]
        first = position["hand"]
        position["hand"] += per_slice
        work = [rows[(first + i) % count] for i in range(per_slice)]
        for obj in work:
            obj.active = not obj.active
        cursor = hand_cursor()
        start = time.perf_counter()
        save_by_hand(cursor, columns, save_sql, work)
        return time.perf_counter() - start

    def saver(name: str) -> Slice:
        if name == "hand":
            return hand_save
        rows = instances[name]
        prepared = name != "unprepared"

        def run(_index: int) -> float:
            first = position[name]
            position[name] += per_slice
            work = [rows[(first + i) % count] for i in range(per_slice)]
            for obj in work:
                obj.active = not obj.active
            with override_settings(SAFEUPDATES_PREPARED_STATEMENTS=prepared):
                start = time.perf_counter()
                for obj in work:
                    obj.save()
                return time.perf_counter() - start

        return run

    contenders: list[tuple[str, Slice]] = [(name, saver(name)) for name in contenders_models]
    rows = {
        "plain": report.row("5", "plain Django Model.save() of an existing row", "saves/s"),
        "concurrency": report.row("5", "django-concurrency IntegerVersionField model save()", "saves/s"),
        "lock_version": report.row("5", "LockVersionMixin.save()", "saves/s"),
        "unprepared": report.row("5", "LockVersionMixin.save(), prepared statements off", "saves/s"),
        "hand": report.row("5", "  (its checked UPDATE hand-written, prepared psycopg cursor)", "saves/s"),
    }
    per_round = timed_rounds(contenders, rows, rounds, slices, per_slice, "5. save()")
    versioned_ratios(
        report,
        "save()",
        per_round,
        against_plain=1.3,
        against_concurrency=3.0,
        headlines=(TARGETS[2][0], TARGETS[3][0]),
    )
    report.ratio(
        "5",
        "  (the most it can be: its statement hand-written / plain)",
        [s.ratio("plain", "hand") for s in per_round],
    )
    report.ratio(
        "5",
        "  (save(): LockVersionMixin / its statement hand-written)",
        [s.ratio("hand", "lock_version") for s in per_round],
    )
    report.ratio(
        "5",
        "  (save(): LockVersionMixin unprepared / plain Django)",
        [s.ratio("plain", "unprepared") for s in per_round],
    )
    report.ratio(
        "5",
        "  (save(): django-concurrency / plain Django)",
        [s.ratio("plain", "concurrency") for s in per_round],
    )
    # Both versioned contenders really check: a save from an instance loaded before another save fails.
    for label, model, error in (
        ("django-concurrency", ConcurrencyRow, RecordModifiedError),
        ("LockVersionMixin", LockVersionRow, StaleObjectError),
    ):
        first = model.objects.order_by("pk").first()
        assert first is not None
        stale = model.objects.get(pk=first.pk)
        first.save()
        try:
            stale.save()
        except error:
            refused = True
        else:
            refused = False
        report.check(f"save(): {label} refuses the save of a stale instance", refused, error.__name__)


def bench_partial_save(report: Report, rounds: int, ops: int, slices: int) -> None:
    """``save(update_fields=["active"])`` checked per field (issue 53) beside the checked ``save()`` of the
    whole row (row-level, the rule every save had before) and plain Django's ``save(update_fields=...)``.

    The tables of section 5, 200 rows per contender; each save flips ``active`` of the next instance. Beside
    them the two checked statements of a one-field save hand-written on a prepared psycopg cursor, the
    per-field ``WHERE`` and the row-level one, so that the price of the per-field check itself shows.
    """
    count = 200
    contenders_models = {
        "plain": PlainRow,
        "row": LockVersionRow,
        "fields": LockVersionRow,
        "hand_row": LockVersionRow,
        "hand_fields": LockVersionRow,
    }
    instances: dict[str, list[Any]] = {}
    for name, model in contenders_models.items():
        created = model.objects.bulk_create([model(name=f"partial {i}") for i in range(count)])
        instances[name] = list(model.objects.filter(pk__in=[obj.pk for obj in created]).order_by("pk"))
    per_slice = ops // slices
    position = dict.fromkeys(contenders_models, 0)
    active = next(f for f in LockVersionRow._meta.concrete_fields if f.name == "active")
    table = statements.SaveTable.of(LockVersionRow, "postgresql")
    by_hand = {
        "hand_row": statements.checked_save(table, (active.column,), ("active",)),
        "hand_fields": statements.checked_save(table, (active.column,), ("active",), per_field=True),
    }

    def next_work(name: str) -> list[Any]:
        first = position[name]
        position[name] += per_slice
        work = [instances[name][(first + i) % count] for i in range(per_slice)]
        for obj in work:
            obj.active = not obj.active
        return work

    def hand(name: str) -> Slice:
        statement = by_hand[name]

        def run(_index: int) -> float:
            work = next_work(name)
            cursor = hand_cursor()
            start = time.perf_counter()
            for obj in work:
                values = [active.get_db_prep_save(obj.active, connection)]
                params = statement.params(values, obj.pk, [obj.lock_version], None, [obj.lock_version])
                cursor.execute(statement.sql, params, prepare=True)
                obj.lock_version = cursor.fetchone()[0]
            return time.perf_counter() - start

        return run

    def saver(name: str) -> Slice:
        if name in by_hand:
            return hand(name)
        update_fields = None if name == "row" else ["active"]

        def run(_index: int) -> float:
            work = next_work(name)
            start = time.perf_counter()
            for obj in work:
                obj.save(update_fields=update_fields)
            return time.perf_counter() - start

        return run

    contenders: list[tuple[str, Slice]] = [(name, saver(name)) for name in contenders_models]
    rows = {
        "plain": report.row("5", "plain Django save(update_fields=['active'])", "saves/s"),
        "row": report.row("5", "LockVersionMixin.save() (row-level check)", "saves/s"),
        "fields": report.row("5", "LockVersionMixin.save(update_fields=['active']) per field", "saves/s"),
        "hand_row": report.row("5", "  (one field, row-level check, hand-written prepared)", "saves/s"),
        "hand_fields": report.row("5", "  (one field, per-field check, hand-written prepared)", "saves/s"),
    }
    per_round = timed_rounds(contenders, rows, rounds, slices, per_slice, "5. save(update_fields=)")
    report.ratio(
        "5",
        "save(update_fields=) per field / save() row-level",
        [s.ratio("row", "fields") for s in per_round],
        ">= 0.95x",
        lambda x: x >= 0.95,
        headline=TARGETS[7][0],
    )
    report.ratio(
        "5",
        "  (save(update_fields=): per field / plain Django)",
        [s.ratio("plain", "fields") for s in per_round],
    )
    report.ratio(
        "5",
        "  (the statement alone: per-field check / row-level check)",
        [s.ratio("hand_row", "hand_fields") for s in per_round],
    )
    # The per-field check really checks: two copies saving one field, the second is refused.
    first = instances["fields"][0]
    stale = LockVersionRow.objects.get(pk=first.pk)
    first.save(update_fields=["active"])
    try:
        stale.save(update_fields=["active"])
    except StaleObjectError:
        refused = True
    else:
        refused = False
    other = LockVersionRow.objects.get(pk=instances["fields"][1].pk)
    copy_ = LockVersionRow.objects.get(pk=other.pk)
    other.save(update_fields=["active"])
    copy_.save(update_fields=["score"])  # a different field: no conflict
    report.check("save(update_fields=): per field, the same field refused, another one written", refused)


def bench_create(report: Report, rounds: int, ops: int, slices: int) -> None:
    """``Model.objects.create()`` of a new row: plain Django vs django-concurrency vs ``LockVersionMixin``.

    The three tables of section 5; each create inserts one row in autocommit and reads back its
    primary key (and, for the versioned contenders, its version).
    """
    per_slice = ops // slices

    def creator(model: type[PlainRow | ConcurrencyRow | LockVersionRow]) -> Slice:
        def run(_index: int) -> float:
            start = time.perf_counter()
            for i in range(per_slice):
                model.objects.create(name=f"new {i}")
            return time.perf_counter() - start

        return run

    contenders: list[tuple[str, Slice]] = [(name, creator(model)) for name, model in VERSIONED_CONTENDERS.items()]
    rows = {
        "plain": report.row("5", "plain Django Model.objects.create()", "creates/s"),
        "concurrency": report.row("5", "django-concurrency IntegerVersionField model create()", "creates/s"),
        "lock_version": report.row("5", "LockVersionMixin model create()", "creates/s"),
    }
    per_round = timed_rounds(contenders, rows, rounds, slices, per_slice, "5. create()")
    versioned_ratios(report, "create()", per_round)
    created = LockVersionRow.objects.create(name="check")
    stored = LockVersionRow.objects.values_list("lock_version", "field_versions").get(pk=created.pk)
    report.check(
        "create(): LockVersionMixin stores the version it returns",
        stored == (created.lock_version, {"*": created.lock_version}) and created.lock_version > 0,
        f"lock_version {created.lock_version}",
    )


def bench_delete(report: Report, rounds: int, ops: int, slices: int) -> None:
    """``delete()`` of a loaded row: plain Django vs ``LockVersionMixin`` (checked) vs django-concurrency.

    The three tables of section 5; the rows of a slice are created and loaded before the clock starts,
    then deleted one by one in autocommit. django-concurrency does not check deletes: its row is for
    information.
    """
    per_slice = ops // slices

    def deleter(model: type[PlainRow | ConcurrencyRow | LockVersionRow]) -> Slice:
        def run(_index: int) -> float:
            created = [model.objects.create(name=f"doomed {i}") for i in range(per_slice)]
            start = time.perf_counter()
            for obj in created:
                obj.delete()
            return time.perf_counter() - start

        return run

    contenders: list[tuple[str, Slice]] = [(name, deleter(model)) for name, model in VERSIONED_CONTENDERS.items()]
    rows = {
        "plain": report.row("5", "plain Django Model.delete()", "deletes/s"),
        "concurrency": report.row("5", "(django-concurrency model delete(), unchecked)", "deletes/s"),
        "lock_version": report.row("5", "LockVersionMixin.delete()", "deletes/s"),
    }
    per_round = timed_rounds(contenders, rows, rounds, slices, per_slice, "5. delete()")
    report.ratio(
        "5",
        "delete(): LockVersionMixin / plain Django",
        [s.ratio("plain", "lock_version") for s in per_round],
        ">= 0.85x",
        lambda x: x >= 0.85,
    )
    doomed = LockVersionRow.objects.create(name="doomed")
    stale = LockVersionRow.objects.get(pk=doomed.pk)
    doomed.save()
    try:
        stale.delete()
    except StaleObjectError:
        refused = LockVersionRow.objects.filter(pk=doomed.pk).exists()
    else:
        refused = False
    report.check("delete(): LockVersionMixin refuses the delete of a stale instance", refused, "StaleObjectError")


# --- 6. saves with conflicts inside transactions -----------------------------------------------------


def bench_stale_saves(report: Report, rounds: int, ops: int, slices: int) -> None:
    """``save()`` inside ``transaction.atomic()``, one save in ten stale: with and without a savepoint.

    Each slice saves its instances in one transaction; one in ten was made stale before the clock
    started (its row saved through another instance), and its ``StaleObjectError`` is caught, as a view
    that reports the conflict and goes on would. "savepoint per save" wraps each save in
    ``atomic()``: what every checked save inside a transaction did before, and what a caller that
    wants a database error of its own to leave the transaction usable does. psycopg deallocates every
    prepared statement of the connection on a ROLLBACK, ROLLBACK TO SAVEPOINT included: after each
    stale save the next save prepares its statement again; "savepoint, unprepared" runs the same
    without prepared statements, which tells that cost from the savepoints' round trips. "as
    installed": a stale save rolls nothing back (its UPDATE matched no row) and takes no savepoint.
    """
    count = 200
    created = [LockVersionRow(name=f"stale {i}") for i in range(count)]
    for obj in created:
        obj.save()
    pks = [obj.pk for obj in created]
    per_slice = ops // slices
    names = ("savepoint", "unprepared", "installed")
    position = dict.fromkeys(names, 0)
    refused = dict.fromkeys(names, 0)

    def saver(name: str) -> Slice:
        def run(_index: int) -> float:
            first = position[name]
            position[name] += per_slice
            chosen = [pks[(first + i) % count] for i in range(per_slice)]
            loaded = LockVersionRow.objects.in_bulk(chosen)
            work = [loaded[pk] for pk in chosen]
            for obj in work[::10]:  # one in ten: saved meanwhile through another instance
                LockVersionRow.objects.get(pk=obj.pk).save()
            for obj in work:
                obj.active = not obj.active
            with override_settings(SAFEUPDATES_PREPARED_STATEMENTS=name != "unprepared"):
                start = time.perf_counter()
                with transaction.atomic():
                    for obj in work:
                        try:
                            if name == "installed":
                                obj.save()
                            else:
                                with transaction.atomic():
                                    obj.save()
                        except StaleObjectError:
                            refused[name] += 1
                return time.perf_counter() - start

        return run

    contenders: list[tuple[str, Slice]] = [(name, saver(name)) for name in names]
    rows = {
        "savepoint": report.row("6", "save() in atomic(), 10% stale, a savepoint per save", "saves/s"),
        "unprepared": report.row("6", "  the same, prepared statements off", "saves/s"),
        "installed": report.row("6", "save() in atomic(), 10% stale, as installed", "saves/s"),
    }
    per_round = timed_rounds(contenders, rows, rounds, slices, per_slice, "6. stale saves")
    report.ratio(
        "6",
        "save() in atomic(), 10% stale: as installed / a savepoint each",
        [s.ratio("savepoint", "installed") for s in per_round],
    )
    report.ratio(
        "6",
        "  (a savepoint each: prepared / unprepared)",
        [s.ratio("unprepared", "savepoint") for s in per_round],
    )
    report.check(
        "stale saves: every contender refused the same share of saves",
        refused["savepoint"] == refused["unprepared"] == refused["installed"] > 0,
        f"{refused['installed']} refused each",
    )


# --- 7. the write path against the same SQL, hand-written -----------------------------------------


@contextmanager
def captured() -> Iterator[list[str]]:
    """The SQL of every statement run on the connection inside the block."""
    statements_run: list[str] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements_run.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        yield statements_run


@contextmanager
def no_delivery() -> Iterator[None]:
    """``enqueue_update()`` without its job: the on-commit delivery does nothing (section 3 has Redis)."""
    saved = delivery.deliver_or_leave_for_relay
    delivery.deliver_or_leave_for_relay = lambda *args, **kwargs: None  # type: ignore[assignment]
    try:
        yield
    finally:
        delivery.deliver_or_leave_for_relay = saved


def hand_cursor() -> Any:
    """A bare psycopg cursor on Django's connection, binding on the server; ``execute(..., prepare=True)``
    prepares each statement once per connection (Django turns preparing off: the threshold is set here)."""
    connection.ensure_connection()
    raw: Any = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = 2**62  # never by itself; prepare=True still prepares
    return psycopg.Cursor(raw)


def checked_save_by_hand() -> tuple[list[Any], Any]:
    """The columns ``save()`` writes of ``LockVersionRow`` (all but its key and the managed fields) and
    ``LockVersionMixin.save()``'s checked UPDATE of them on PostgreSQL, for :func:`save_by_hand`."""
    columns = [f for f in LockVersionRow._meta.concrete_fields if not f.primary_key and f.name not in MANAGED_FIELDS]
    return columns, statements.checked_save(
        statements.SaveTable.of(LockVersionRow, "postgresql"), tuple(f.column for f in columns), None
    )


def save_by_hand(cursor: Any, columns: list[Any], statement: Any, work: Sequence[Any]) -> None:
    """Save each ``LockVersionRow`` of ``work`` by the checked UPDATE (:func:`checked_save_by_hand`) on
    ``cursor`` (:func:`hand_cursor`): its values as its fields prepare them, its ``lock_version`` the one
    the row returns; no Python of the library's."""
    for obj in work:
        values = [f.get_db_prep_save(getattr(obj, f.attname), connection) for f in columns]
        cursor.execute(statement.sql, statement.params(values, obj.pk, [obj.lock_version], None), prepare=True)
        obj.lock_version = cursor.fetchone()[0]


def recorded_by_hand(work: Sequence[tuple[int, bool, int, uuid.UUID]]) -> float:
    """Seconds to run ``update_if_newer(pk, version=, request_id=, active=)``'s own statement (the
    UPDATE of ``Profile.active`` and the INSERT of its request) for each ``(pk, value, version,
    request_id)`` of ``work``, hand-written: a bare, prepared psycopg cursor and nothing else."""
    statement = statements.guarded_update(Profile, ("active",), connection)
    content_type = ContentType.objects.get_for_model(Profile).pk
    cursor = hand_cursor()
    start = time.perf_counter()
    for pk, value, version, request_id in work:
        params = statement.recorded_params(
            pk,
            [(value, version)],
            request_id=request_id,
            content_type_id=content_type,
            version=version,
            changes_json=json.dumps({"active": value}),
            recorded=RECORDED,
        )
        cursor.execute(statement.recorded_sql, params, prepare=True)
        cursor.fetchone()
    return time.perf_counter() - start


def pending_by_hand(cursor: Any, pks: Sequence[int], after: Callable[[int], Any] | None = None) -> None:
    """``enqueue_update(Profile, pk, active=True)``'s own INSERT of the pending request, for each of ``pks``,
    on ``cursor`` (:func:`hand_cursor`), each committed by itself in autocommit; then ``after(pk)``, if
    given (section 3 enqueues the job on commit there)."""
    content_type = ContentType.objects.get_for_model(Profile).pk
    changes = ProcessedRequest._meta.get_field("changes").get_db_prep_save({"active": True}, connection)
    queue_name = conf.queue_name()
    for pk in pks:
        sql, params = statements.insert_pending(
            request_id=uuid.uuid4(),
            content_type_id=content_type,
            object_id=str(pk),
            changes=changes,
            queue=queue_name,
            kind=RequestKind.UPDATE.value,
            status=RequestStatus.PENDING.value,
        )
        cursor.execute(sql, params, prepare=True)
        cursor.fetchone()
        if after is not None:
            after(pk)


def bench_write_path(report: Report, rounds: int, ops: int, slices: int) -> None:
    """Each write of the library against the very statement it runs, hand-written: the SQL text taken
    from :mod:`safeupdates.statements`, executed with a bare, prepared psycopg cursor and nothing else
    (no validation, no Django cursor wrapper). The hand-written side is the limit for that work.

    In autocommit, one statement per operation; every contender interleaved in one round. The SQL of
    each hand-written contender is checked to be the one the library ran.
    """
    pks = make_profiles(500)
    per_slice = ops // slices
    counter = iter(range(10**9))
    guarded_sql = statements.guarded_update(Profile, ("active",), connection)

    def todo() -> list[tuple[int, bool, int]]:
        start = next(counter) * per_slice
        return [
            (pks[(start + i) % len(pks)], (start + i) // len(pks) % 2 == 0, v)
            for i, v in enumerate(versions(per_slice))
        ]

    def guarded(_index: int) -> float:
        work = todo()
        start = time.perf_counter()
        for pk, value, version in work:
            Profile.objects.update_if_newer(pk, version=version, active=value)
        return time.perf_counter() - start

    def hand_guarded(_index: int) -> float:
        work = todo()
        cursor = hand_cursor()
        sql = guarded_sql.sql_returning_versions
        start = time.perf_counter()
        for pk, value, version in work:
            cursor.execute(sql, guarded_sql.params(pk, [(value, version)]), prepare=True)
            cursor.fetchone()
        return time.perf_counter() - start

    def guarded_request(_index: int) -> float:
        work = [(pk, value, version, uuid.uuid4()) for pk, value, version in todo()]
        start = time.perf_counter()
        for pk, value, version, request_id in work:
            Profile.objects.update_if_newer(pk, version=version, request_id=request_id, active=value)
        return time.perf_counter() - start

    def hand_recorded(_index: int) -> float:
        return recorded_by_hand([(pk, value, version, uuid.uuid4()) for pk, value, version in todo()])

    saved = [LockVersionRow(name=f"write path {i}") for i in range(400)]
    for obj in saved:
        obj.save()
    lib_rows = list(LockVersionRow.objects.filter(pk__in=[o.pk for o in saved[:200]]).order_by("pk"))
    hand_rows = list(LockVersionRow.objects.filter(pk__in=[o.pk for o in saved[200:]]).order_by("pk"))
    columns, save_sql = checked_save_by_hand()
    position = {"lib": 0, "hand": 0}

    def save(_index: int) -> float:
        first = position["lib"]
        position["lib"] += per_slice
        work = [lib_rows[(first + i) % len(lib_rows)] for i in range(per_slice)]
        for obj in work:
            obj.active = not obj.active
        start = time.perf_counter()
        for obj in work:
            obj.save()
        return time.perf_counter() - start

    def hand_save(_index: int) -> float:
        first = position["hand"]
        position["hand"] += per_slice
        work = [hand_rows[(first + i) % len(hand_rows)] for i in range(per_slice)]
        for obj in work:
            obj.active = not obj.active
        cursor = hand_cursor()
        start = time.perf_counter()
        save_by_hand(cursor, columns, save_sql, work)
        return time.perf_counter() - start

    def enqueue(_index: int) -> float:
        work = [pk for pk, _value, _version in todo()]
        with no_delivery():
            start = time.perf_counter()
            for pk in work:
                enqueue_update(Profile, pk, active=True)
            return time.perf_counter() - start

    def hand_insert(_index: int) -> float:
        work = [pk for pk, _value, _version in todo()]
        cursor = hand_cursor()
        return timed(lambda: pending_by_hand(cursor, work))

    # The hand-written statements are the library's: run each operation once and compare.
    with captured() as ran:
        Profile.objects.update_if_newer(pks[0], version=versions(1)[0], active=True)
    report.check("write path: hand-written guarded UPDATE is the library's", guarded_sql.sql_returning_versions in ran)
    with captured() as ran:
        Profile.objects.update_if_newer(pks[0], version=versions(1)[0], request_id=uuid.uuid4(), active=False)
    report.check("write path: hand-written recorded UPDATE is the library's", guarded_sql.recorded_sql in ran)
    with captured() as ran:
        lib_rows[0].save()
    report.check("write path: hand-written checked save is the library's", save_sql.sql in ran)
    with captured() as ran, no_delivery():
        enqueue_update(Profile, pks[0], active=True)
    insert_sql = statements.insert_pending(
        request_id=None, content_type_id=None, object_id="", changes=None, queue="", kind="update", status="pending"
    )[0]
    report.check("write path: hand-written pending INSERT is enqueue_update's", insert_sql in ran)

    contenders: list[tuple[str, Slice]] = [
        ("guarded", guarded),
        ("hand_guarded", hand_guarded),
        ("guarded_request", guarded_request),
        ("hand_recorded", hand_recorded),
        ("save", save),
        ("hand_save", hand_save),
        ("enqueue", enqueue),
        ("hand_insert", hand_insert),
    ]
    rows = {
        "guarded": report.row("7", "update_if_newer(pk, version=, active=)", "writes/s"),
        "hand_guarded": report.row("7", "  hand-written guarded UPDATE, prepared cursor", "writes/s"),
        "guarded_request": report.row("7", "update_if_newer(pk, version=, request_id=, active=)", "writes/s"),
        "hand_recorded": report.row("7", "  hand-written UPDATE+INSERT, prepared cursor", "writes/s"),
        "save": report.row("7", "LockVersionMixin.save() of a loaded row", "saves/s"),
        "hand_save": report.row("7", "  hand-written checked UPDATE, prepared cursor", "saves/s"),
        "enqueue": report.row("7", "enqueue_update(Profile, pk, active=), job not enqueued", "calls/s"),
        "hand_insert": report.row("7", "  hand-written pending INSERT, prepared cursor", "calls/s"),
    }
    per_round = timed_rounds(contenders, rows, rounds, slices, per_slice, "7. write path")
    ProcessedRequest.objects.filter(status=RequestStatus.PENDING).delete()
    for label, library, hand in (
        ("update_if_newer()", "guarded", "hand_guarded"),
        ("update_if_newer(request_id=)", "guarded_request", "hand_recorded"),
        ("LockVersionMixin.save()", "save", "hand_save"),
        ("enqueue_update()'s INSERT", "enqueue", "hand_insert"),
    ):
        if library == "guarded_request":  # its target (0.9x) is section 1's, against the same contender
            report.ratio("7", f"  ({label} / the same SQL hand-written)", [s.ratio(hand, library) for s in per_round])
            continue
        report.ratio(
            "7",
            f"{label} / the same SQL hand-written",
            [s.ratio(hand, library) for s in per_round],
            ">= 0.8x",
            lambda x: x >= 0.8,
        )


def commit_share(report: Report) -> None:
    """For information: enqueue_update's pending INSERT alone (section 7's hand-written one, commit
    included) against a whole plain ``queue.enqueue()`` (section 3). Where it is above section 3's
    target, no enqueue_update() that commits its request before enqueuing can meet that target."""
    rows = {(row.section, row.label.strip()): row for row in report.rows}
    insert = rows[("7", "hand-written pending INSERT, prepared cursor")]
    naive = rows[("3", "naive queue.enqueue(naive_toggle, ...) (queue reused)")]
    report.ratio(
        "7",
        "  (hand-written INSERT alone / plain queue.enqueue())",
        [1e6 / rate / us for rate, us in zip(insert.figures, naive.figures, strict=True)],
    )


# --- main ------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected sections, print the table and the ratios; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of sections 1, 3, 4, 5, 6 and 7 (default 3)")
    parser.add_argument("--drain-rounds", type=int, default=1, help="rounds of the drain, section 2 (default 1)")
    parser.add_argument(
        "--only", default="1,2,3,4,5,6,7", help="comma-separated sections to run (default 1,2,3,4,5,6,7)"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test (figures are noisy)")
    parser.add_argument("--workers", type=int, default=2, help="rqworker processes for the drain (default 2)")
    parser.add_argument("--toggles", type=int, default=20000, help="toggles in the drain burst (default 20000)")
    parser.add_argument("--records", type=int, default=2000, help="records the toggles spread over (default 2000)")
    args = parser.parse_args(argv)
    sections = {s.strip() for s in args.only.split(",")}
    scale = 5 if args.quick else 1

    started = time.perf_counter()
    prepare_database()
    queue = bench_queue()
    empty_queue(queue)
    report = Report()
    db = connection.settings_dict
    _progress(
        f"safeupdates benchmark: PostgreSQL {getattr(connection, 'pg_version', 0) // 10000} database {db['NAME']!r} on "
        f"{db.get('HOST') or 'localhost'}, Redis {settings.REDIS_URL} queue {queue.name!r}, {os.cpu_count()} CPUs, "
        f"{args.rounds} rounds ({args.drain_rounds} for the drain)"
    )
    try:
        if "1" in sections:
            bench_single_row(report, args.rounds, 3000 // scale, 30 // scale)
        if "3" in sections:
            bench_enqueue(report, queue, args.rounds, 500 // scale, 10 // scale)
        if "4" in sections:
            bench_bulk(report, args.rounds, 6000 // scale, 10 // scale)
        if "5" in sections:
            bench_save(report, args.rounds, 3000 // scale, 30 // scale)
            bench_partial_save(report, args.rounds, 3000 // scale, 30 // scale)
            bench_create(report, args.rounds, 1500 // scale, 30 // scale)
            bench_delete(report, args.rounds, 1500 // scale, 30 // scale)
        if "6" in sections:
            bench_stale_saves(report, args.rounds, 3000 // scale, 30 // scale)
        if "7" in sections:
            bench_write_path(report, args.rounds, 3000 // scale, 30 // scale)
        if "3" in sections and "7" in sections:
            commit_share(report)
        if "2" in sections:
            bench_drain(report, queue, args.drain_rounds, args.toggles // scale, args.records, args.workers)
    except BaseException:
        report.print()  # what the sections before the error measured, before the traceback
        raise
    finally:
        empty_queue(queue)
    ok = report.print()
    print(f"\n   total time {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
