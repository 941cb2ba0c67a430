#!/usr/bin/env python
"""Latency of a toggle, from commit to visible: the app's path against the naive job it replaces.

Run from the repository root (``make bench-latency`` does)::

    .venv/bin/python benchmarks/latency.py [--cells rq-200,rq-5,celery-200,celery-5] [--seconds 60]

Per cell, one delivery and one set of records: an open-loop stream of toggles at a fixed rate (toggle
``i`` is issued at ``start + i / rate``, whatever is still in flight), alternating every ``--slice``
seconds between the two contenders, on the same queue and the same workers:

- *app*: ``enqueue_update(Profile, pk, score=n)`` inside ``transaction.atomic()``; its moment of commit
  is taken by an ``on_commit`` callback registered before the call (so it runs first, before the job is
  sent);
- *naive*: one job per toggle that loads the row, sets the field and calls ``save()``
  (``benchmarks.jobs.naive_save`` on RQ, ``benchmarks.celery_jobs.naive_toggle`` on Celery), on a plain
  table of the same shape (``saveapp.PlainRow``); its moment is the send of the job (nothing to commit).

Each toggle writes its own number (a counter across the run) to its record's ``score``, so toggles can be
told apart: a toggle is visible at the commit that wrote its number or a higher one on its record (a newer
toggle of the same record supersedes it: the app coalesces a record's pending toggles into one write),
stamped by a deferred trigger (:func:`commit_stamps`), or with ``--observe read`` at the first read that
shows it of a separate process that reads every record of both tables every 5 ms (:func:`poll`; the
read's moment is the middle of its round trip). Latency = visible - commit, p50/p95/p99 per contender,
and the ratios app / naive, printed side by side.

Cells: ``rq-200`` and ``rq-5`` (2 ``rqworker --with-scheduler`` processes, 20 toggles/s, 200 or 5
records; their worker class is ``safeupdates.delivery.rq_worker.Worker``, the one docs/deployment.md
tells projects to use: the apply jobs in the worker's own process, the naive jobs in a work horse each),
``rq-200-simple`` and ``rq-5-simple`` (the same with RQ's ``SimpleWorker``, which runs every job, the naive
ones too, in the worker's own process), ``rq-200-plain`` and ``rq-5-plain`` (the same with RQ's own
``Worker``: every job in a work horse), ``celery-200`` and ``celery-5`` (2 prefork workers ``-c 2`` on a
RabbitMQ vhost of the benchmark's own, 40 toggles/s). Timings are never asserted: the exit status is 1
only if a toggle never became visible or a record of the app ended without its newest toggle. Every
process's connections have ``CONN_MAX_AGE = 60`` (``--conn-max-age``), as docs/deployment.md advises, and the
Celery workers ``CELERY_DB_REUSE_MAX = 1000`` (without it Celery closes the connections around every task).

It uses its own PostgreSQL database (``BENCH_DATABASE_URL``, default ``.../safeupdates_bench_latency``),
which it creates, migrates and empties, and its own RQ queue (``safeupdates-bench-latency``) on
``BENCH_REDIS_URL`` (else ``REDIS_URL``). See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/safeupdates_bench_latency")

#: The worker class of the RQ cells (``rq-*-plain``: RQ's own).
WORKER_CLASS = "safeupdates.delivery.rq_worker.Worker"
PLAIN_WORKER_CLASS = "rq.Worker"
SIMPLE_WORKER_CLASS = "rq.SimpleWorker"
APP, NAIVE = "app", "naive"
#: The poller's period (seconds).
POLL_EVERY = 0.005


@dataclass(frozen=True)
class Cell:
    name: str
    delivery: str  # "rq" or "celery"
    records: int
    rate: float
    worker_class: str = WORKER_CLASS

    @property
    def label(self) -> str:
        workers = "2 rqworkers" if self.delivery == "rq" else "2 prefork -c 2, RabbitMQ"
        plain = {PLAIN_WORKER_CLASS: ", RQ's own Worker", SIMPLE_WORKER_CLASS: ", RQ's SimpleWorker"}.get(
            self.worker_class, ""
        )
        return f"{self.delivery}, {workers}{plain}, {self.rate:g}/s, {self.records} records"


def cells(rq_rate: float, celery_rate: float) -> dict[str, Cell]:
    found = {}
    for records in (200, 5):
        found[f"rq-{records}"] = Cell(f"rq-{records}", "rq", records, rq_rate)
        found[f"rq-{records}-plain"] = Cell(f"rq-{records}-plain", "rq", records, rq_rate, PLAIN_WORKER_CLASS)
        found[f"rq-{records}-simple"] = Cell(f"rq-{records}-simple", "rq", records, rq_rate, SIMPLE_WORKER_CLASS)
        found[f"celery-{records}"] = Cell(f"celery-{records}", "celery", records, celery_rate)
    return found


DEFAULT_CELLS = "rq-200,rq-5,celery-200,celery-5"


# --- the poller (a process of its own) --------------------------------------------------------------


def poll(dsn: str, tables: Sequence[str], pks: Sequence[Sequence[int]], pipe: Connection) -> None:
    """Read ``score`` of rows ``pks[i]`` of ``tables[i]`` every :data:`POLL_EVERY` seconds until ``pipe``
    says stop; send back when each (table index, pk, score) was first seen, and the reads' periods.

    A process of its own (started with ``spawn``), on a connection of its own in autocommit: it shares
    nothing with the process that issues the toggles but the machine's monotonic clock."""
    import psycopg

    sql = " UNION ALL ".join(f"SELECT {i}, id, score FROM {table} WHERE id = ANY(%s)" for i, table in enumerate(tables))
    params = [list(ids) for ids in pks]
    seen: dict[tuple[int, int, int], float] = {}
    periods: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as connection, connection.cursor() as cursor:
        pipe.send("ready")
        due = last = time.monotonic()
        while not pipe.poll():
            before = time.monotonic()
            rows = cursor.execute(sql, params, prepare=True).fetchall()
            moment = (before + time.monotonic()) / 2
            for side, pk, score in rows:
                seen.setdefault((side, pk, score), moment)
            periods.append(before - last)
            last = before
            due += POLL_EVERY
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                due = time.monotonic()  # behind (a busy machine): read again at once, and count it
    pipe.send((seen, periods[1:]))


@contextmanager
def poller(dsn: str, tables: Sequence[str], pks: Sequence[Sequence[int]]) -> Iterator[Callable[[], Any]]:
    """A running :func:`poll` process; yields the function that stops it and returns what it saw."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=poll, args=(dsn, tables, pks, theirs), daemon=True)
    process.start()
    if not ours.poll(60) or ours.recv() != "ready":
        process.kill()
        sys.exit("The poller did not start.")
    result: list[Any] = []

    def stop() -> Any:
        if not result:
            ours.send("stop")
            result.append(ours.recv())
        return result[0]

    try:
        yield stop
    finally:
        if process.is_alive() and not result:
            ours.send("stop")
        process.join(10)
        if process.is_alive():
            process.kill()


@contextmanager
def commit_stamps(tables: Sequence[str]) -> Iterator[Callable[[], dict[tuple[int, int, int], float]]]:
    """Deferred constraint triggers on ``tables`` that note, at the commit of every transaction that
    changed a row's ``score`` (a statement in autocommit is one), ``(table index, pk, score)`` and the
    database's clock; yields the function that reads them back as :func:`poll`'s ``seen``, in this
    process's monotonic clock (the server runs on this machine: one clock). Both contenders pay the same
    trigger on their write."""
    from django.db import connection

    offset = time.time() - time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE UNLOGGED TABLE IF NOT EXISTS latency_commits (side int, id bigint, score bigint, at float8);"
            "TRUNCATE latency_commits"
        )
        for index, table in enumerate(tables):
            cursor.execute(
                f"CREATE OR REPLACE FUNCTION latency_commit_{index}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"INSERT INTO latency_commits VALUES ({index}, NEW.id, NEW.score, "
                "extract(epoch FROM clock_timestamp())); RETURN NULL; END $$;"
                f"DROP TRIGGER IF EXISTS latency_commit ON {table};"
                f"CREATE CONSTRAINT TRIGGER latency_commit AFTER UPDATE ON {table} DEFERRABLE INITIALLY DEFERRED "
                f"FOR EACH ROW WHEN (OLD.score IS DISTINCT FROM NEW.score) EXECUTE FUNCTION latency_commit_{index}()"
            )

    def read() -> dict[tuple[int, int, int], float]:
        seen: dict[tuple[int, int, int], float] = {}
        with connection.cursor() as cursor:
            cursor.execute("SELECT side, id, score, min(at) FROM latency_commits GROUP BY side, id, score")
            for side, pk, score, at in cursor.fetchall():
                seen[(side, pk, score)] = at - offset
        return seen

    try:
        yield read
    finally:
        with connection.cursor() as cursor:
            for index, table in enumerate(tables):
                cursor.execute(f"DROP TRIGGER IF EXISTS latency_commit ON {table}")
                cursor.execute(f"DROP FUNCTION IF EXISTS latency_commit_{index}()")
            cursor.execute("DROP TABLE IF EXISTS latency_commits")


# --- the stream -------------------------------------------------------------------------------------


@dataclass
class Toggle:
    side: str
    pk: int
    number: int
    scheduled: float
    turn: int  # the index of the slice it was sent in
    committed: float = 0.0


@dataclass
class Side:
    """What a contender needs: its table's records and how it sends one toggle."""

    name: str
    pks: list[int]
    send: Callable[[Toggle], None]
    latencies: list[float] = field(default_factory=list)


def stream(
    sides: dict[str, Side], rate: float, seconds: float, slice_: float, numbers: Iterator[int], seed: int
) -> list[Toggle]:
    """Issue toggles at ``rate`` per second for ``seconds``, open loop, the contenders taking turns every
    ``slice_`` seconds (who starts alternates with ``seed``); return them with their moments of commit."""
    rng = random.Random(seed)
    order = [APP, NAIVE] if seed % 2 else [NAIVE, APP]
    issued: list[Toggle] = []
    start = time.monotonic() + 0.05
    for index in itertools.count():
        at = start + index / rate
        if at - start >= seconds:
            break
        turn = int((at - start) // slice_)
        side = sides[order[turn % 2]]
        toggle = Toggle(side.name, rng.choice(side.pks), next(numbers), at, turn)
        pause = at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        side.send(toggle)
        issued.append(toggle)
    return issued


def visible_moments(seen: dict[tuple[int, int, int], float], side_index: int, pk: int) -> list[tuple[int, float]]:
    """``(score, first seen)`` of one record, by score, each moment the earliest of its own and of every
    higher score's (a higher number seen means this one is applied or superseded)."""
    values = sorted((score, moment) for (side, key, score), moment in seen.items() if side == side_index and key == pk)
    earliest = float("inf")
    out = []
    for score, moment in reversed(values):
        earliest = min(earliest, moment)
        out.append((score, earliest))
    return out[::-1]


def latencies(
    toggles: Sequence[Toggle], seen: dict[tuple[int, int, int], float], index_of: dict[str, int]
) -> tuple[dict[str, list[float]], dict[int, dict[str, list[float]]], int]:
    """Milliseconds from commit to visible per contender and per slice, and how many toggles were never
    seen."""
    by_record: dict[tuple[int, int], list[tuple[int, float]]] = {}
    out: dict[str, list[float]] = {APP: [], NAIVE: []}
    turns: dict[int, dict[str, list[float]]] = {}
    missing = 0
    for toggle in toggles:
        key = (index_of[toggle.side], toggle.pk)
        if key not in by_record:
            by_record[key] = visible_moments(seen, *key)
        moment = next((m for score, m in by_record[key] if score >= toggle.number), None)
        if moment is None:
            missing += 1
            continue
        waited = max(0.0, moment - toggle.committed) * 1000
        out[toggle.side].append(waited)
        turns.setdefault(toggle.turn, {}).setdefault(toggle.side, []).append(waited)
    return out, turns, missing


def paired_ratios(turns: dict[int, dict[str, list[float]]], q: float) -> list[float]:
    """Percentile ``q`` of each app slice over that of the naive slice it ran beside (slices ``2k`` and
    ``2k + 1`` ran one right after the other and shared whatever load the machine had then)."""
    ratios = []
    for turn in range(0, max(turns, default=-1), 2):
        pair = {**turns.get(turn, {}), **turns.get(turn + 1, {})}
        if pair.get(APP) and pair.get(NAIVE):
            ratios.append(percentile(pair[APP], q) / percentile(pair[NAIVE], q))
    return ratios


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass
class Result:
    cell: Cell
    figures: dict[str, list[float]]
    missing: int
    wrong: int
    lag: float  # the stream's largest delay behind its schedule (ms)
    periods: list[float]
    load: str
    toggles: int
    turns: dict[int, dict[str, list[float]]]
    job_times: JobTimes  # RQ only: each job's run in its work horse (ms)

    def p(self, side: str, q: float) -> float:
        return percentile(self.figures[side], q)

    def ratio(self, q: float) -> float:
        naive = self.p(NAIVE, q)
        return self.p(APP, q) / naive if naive else float("nan")

    def paired(self, q: float) -> float:
        """The median over the pairs of slices of :func:`paired_ratios`."""
        ratios = paired_ratios(self.turns, q)
        return statistics.median(ratios) if ratios else float("nan")


Send = Callable[[Toggle], None]
JobTimes = dict[str, list[float]]


# --- the deliveries ---------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], what: str, timeout: float, poll_every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"Timed out after {timeout:g}s waiting for {what}.")
        time.sleep(poll_every)


@contextmanager
def rq_cell(cell: Cell) -> Iterator[tuple[Send, Send, Callable[[], bool], Callable[[], JobTimes]]]:
    """2 rqworkers ``--with-scheduler`` of ``cell``'s worker class on the latency queue; yields the app's
    and the naive send, whether the queue is idle, and the run times of the jobs so far (ms, timed in the
    work horse by :class:`benchmarks.jobs.TimedJob`; reading them empties the list)."""
    import django_rq
    from django.conf import settings
    from django.db import transaction
    from django.test.utils import override_settings
    from rq import Worker

    from benchmarks import bench
    from benchmarks.jobs import JOB_TIMES_KEY, naive_save
    from safeupdates.jobs import enqueue_update
    from tests.testapp.models import Profile

    queue = django_rq.get_queue(settings.LATENCY_QUEUE)
    try:
        queue.connection.ping()
    except Exception as exc:
        sys.exit(f"Redis is not reachable at {settings.REDIS_URL} ({exc}); start it or set BENCH_REDIS_URL.")
    bench.empty_queue(queue)

    def app(toggle: Toggle) -> None:
        with transaction.atomic():
            transaction.on_commit(lambda: setattr(toggle, "committed", time.monotonic()))
            enqueue_update(Profile, toggle.pk, score=toggle.number)

    def naive(toggle: Toggle) -> None:
        toggle.committed = time.monotonic()
        queue.enqueue(naive_save, toggle.pk, "score", toggle.number)

    def job_times() -> JobTimes:
        pushed = queue.connection.lrange(JOB_TIMES_KEY, 0, -1)
        queue.connection.delete(JOB_TIMES_KEY)
        times: JobTimes = {APP: [], NAIVE: []}
        for line in pushed:
            function, ms = line.decode().split()
            times[NAIVE if function.endswith("naive_save") else APP].append(float(ms))
        return times

    job_times()
    options = ["--with-scheduler", "--worker-class", cell.worker_class, "--job-class", "benchmarks.jobs.TimedJob"]
    options += ["-v", "0"]
    with override_settings(SAFEUPDATES_QUEUE=queue.name), bench.workers(queue, 2, options) as pool:
        wait_until(lambda: len(Worker.all(queue=queue)) >= 2, "the rqworkers", 120)
        pool.check_alive()
        yield app, naive, lambda: queue.count == 0 and queue.started_job_registry.count == 0, job_times
        pool.check_alive()
    bench.empty_queue(queue)


@contextmanager
def celery_cell(cell: Cell) -> Iterator[tuple[Send, Send, Callable[[], bool], Callable[[], JobTimes]]]:
    """2 prefork Celery workers ``-c 2`` on the benchmark's vhost; yields the app's and the naive send, and
    whether every naive task sent has run."""
    from celery import current_app
    from django.db import transaction
    from django.test.utils import override_settings

    from benchmarks.celery_bench import CeleryWorkers, tasks_run
    from benchmarks.celery_jobs import naive_toggle
    from safeupdates.jobs import enqueue_update
    from tests.testapp.models import Profile

    app = current_app._get_current_object()
    queue = "celery-bench-latency"

    def safe(toggle: Toggle) -> None:
        with transaction.atomic():
            transaction.on_commit(lambda: setattr(toggle, "committed", time.monotonic()))
            enqueue_update(Profile, toggle.pk, score=toggle.number)

    sent = [0]

    def naive(toggle: Toggle) -> None:
        toggle.committed = time.monotonic()
        naive_toggle.apply_async((toggle.pk, "score", toggle.number), queue=queue)
        sent[0] += 1

    pool = CeleryWorkers(2, queue)
    try:
        with override_settings(SAFEUPDATES_DELIVERY="celery", SAFEUPDATES_CELERY_QUEUE=queue):
            wait_until(lambda: len(app.control.inspect(timeout=1.0).ping() or {}) >= 2, "the Celery workers", 180, 0.5)
            yield safe, naive, lambda: tasks_run(app, (naive_toggle.name,)) >= sent[0], lambda: {APP: [], NAIVE: []}
    finally:
        pool.stop()
    Path(pool.log.name).unlink(missing_ok=True)


class Vhost:
    """The RabbitMQ vhost of the Celery cells (``benchmarks.celery_bench.Vhost``), made only if one runs."""

    def __init__(self) -> None:
        from benchmarks.celery_bench import Vhost as Made

        try:
            self.vhost = Made().create()
        except (OSError, subprocess.CalledProcessError) as exc:
            sys.exit(f"Cannot create a RabbitMQ vhost (rabbitmqctl, RabbitMQ at 127.0.0.1:5672): {exc}")
        os.environ["CELERY_BROKER_URL"] = self.vhost.url()

    def delete(self) -> None:
        self.vhost.delete()


# --- a cell -----------------------------------------------------------------------------------------


def run_cell(cell: Cell, args: argparse.Namespace, numbers: Iterator[int], seed: int) -> Result:
    from django.conf import settings

    from benchmarks import bench
    from benchmarks.saveapp.models import PlainRow
    from tests.testapp.models import Profile

    bench._progress(f"  {cell.name}: {cell.label}, {args.seconds:g} s")
    pks = {
        APP: bench.make_profiles(cell.records),
        NAIVE: [
            row.pk for row in PlainRow.objects.bulk_create([PlainRow(name=f"latency {i}") for i in range(cell.records)])
        ],
    }
    tables = [Profile._meta.db_table, PlainRow._meta.db_table]
    index_of = {APP: 0, NAIVE: 1}
    dsn = os.environ["BENCH_DATABASE_URL"]
    assert settings.DATABASES["default"]["NAME"] in dsn
    delivery = rq_cell if cell.delivery == "rq" else celery_cell
    with commit_stamps(tables) as stamps, delivery(cell) as (app_send, naive_send, idle, job_times):
        sides = {APP: Side(APP, pks[APP], app_send), NAIVE: Side(NAIVE, pks[NAIVE], naive_send)}
        with poller(dsn, tables, [pks[APP], pks[NAIVE]]) as stop:
            # A few toggles each, not counted: the workers' and the queue's first use.
            warm = stream(sides, cell.rate, min(1.0, args.seconds), min(0.5, args.slice), numbers, seed)
            wait_until(idle, "the first toggles", args.drain_timeout)
            job_times()  # not counted either
            toggles = stream(sides, cell.rate, args.seconds, args.slice, numbers, seed + 1)

            def done() -> bool:
                # The app's newest toggle of each record is applied (it must be: last requested wins); the
                # naive one's too, or the queue is idle (two jobs of a record may land in either order).
                applied = {
                    side: dict(model.objects.filter(pk__in=pks[side]).values_list("pk", "score"))
                    for side, model in ((APP, Profile), (NAIVE, PlainRow))
                }
                newest = last_of(toggles)
                if any(applied[APP][t.pk] < t.number for model, t in newest if model is Profile):
                    return False
                return all(applied[NAIVE][t.pk] >= t.number for model, t in newest if model is PlainRow) or idle()

            wait_until(done, "every toggle to be applied", args.drain_timeout, 0.05)
            time.sleep(4 * POLL_EVERY)
            seen, periods = stop()
            timed = job_times()
        if args.observe == "commit":
            seen = stamps()
    del warm
    figures, turns, missing = latencies(toggles, seen, index_of)
    wrong = sum(
        not Profile.objects.filter(pk=t.pk, score=t.number).exists()
        for Model, t in last_of(toggles)
        if Model is Profile
    )
    lag = max((t.committed - t.scheduled for t in toggles), default=0.0) * 1000
    return Result(cell, figures, missing, wrong, lag, periods, load_average(), len(toggles), turns, timed)


def last_of(toggles: Sequence[Toggle]) -> list[tuple[Any, Toggle]]:
    """The newest toggle of each record, with its table's model."""
    from benchmarks.saveapp.models import PlainRow
    from tests.testapp.models import Profile

    newest: dict[tuple[str, int], Toggle] = {}
    for toggle in toggles:
        newest[(toggle.side, toggle.pk)] = toggle
    return [(Profile if side == APP else PlainRow, toggle) for (side, _pk), toggle in newest.items()]


def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


# --- the report -------------------------------------------------------------------------------------


def print_results(results: Sequence[Result]) -> None:
    print()
    print(f"{'cell':<58}{'side':<7}{'toggles':>8}{'p50':>8}{'p95':>8}{'p99':>8}  ms")
    for result in results:
        for side in (APP, NAIVE):
            values = result.figures[side]
            label = result.cell.label if side == APP else ""
            print(f"{label:<58}{side:<7}{len(values):>8}" + "".join(f"{result.p(side, q):>8.1f}" for q in (50, 95, 99)))
        print(f"{'':<58}{'app/naive':<15}" + "".join(f"{result.ratio(q):>7.2f}x" for q in (50, 95, 99)))
    print()
    header = f"{'cell':<12}{'app p50/p95/p99 ms':>22}{'naive p50/p95/p99 ms':>24}{'p50':>8}{'p95':>8}{'p99':>8}"
    print(f"{header}{'paired p50':>12}  targets: p50 <= 1.1x, p99 <= 1.3x")
    for result in results:
        app = "/".join(f"{result.p(APP, q):.0f}" for q in (50, 95, 99))
        naive = "/".join(f"{result.p(NAIVE, q):.0f}" for q in (50, 95, 99))
        verdict = (
            ("PASS" if result.ratio(50) <= 1.1 else "FAIL") + " " + ("PASS" if result.ratio(99) <= 1.3 else "FAIL")
        )
        print(
            f"{result.cell.name:<12}{app:>22}{naive:>24}"
            + "".join(f"{result.ratio(q):>7.2f}x" for q in (50, 95, 99))
            + f"{result.paired(50):>11.2f}x"
            + f"  {verdict}"
        )
    print("   (paired p50: the median over the pairs of slices that ran one after the other of app p50 / naive p50)")
    if any(result.job_times[APP] for result in results):
        print()
        print(f"{'each job, timed in its work horse (RQ)':<58}{'side':<7}{'jobs':>8}{'p50':>8}{'p95':>8}{'p99':>8}  ms")
        for result in results:
            for side in (APP, NAIVE):
                times = result.job_times[side]
                if times:
                    label = result.cell.name if side == APP else ""
                    figures = "".join(f"{percentile(times, q):>8.1f}" for q in (50, 95, 99))
                    print(f"{label:<58}{side:<7}{len(times):>8}{figures}")
    print()
    for result in results:
        periods = sorted(result.periods)
        print(
            f"   {result.cell.name}: {result.toggles} toggles, stream at most {result.lag:.1f} ms behind its schedule; "
            f"reads every {statistics.median(periods) * 1000:.1f} ms (p99 {percentile(periods, 99) * 1000:.1f} ms); "
            f"load average at the end {result.load}"
        )
    for result in results:
        if result.missing or result.wrong:
            print(
                f"   FAIL {result.cell.name}: {result.missing} toggle(s) never seen, {result.wrong} app record(s) wrong"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--cells",
        default=DEFAULT_CELLS,
        help=f"comma-separated (default {DEFAULT_CELLS}; also rq-200-plain, rq-5-plain, rq-200-simple, rq-5-simple)",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured stream of each cell (default 60)")
    parser.add_argument("--slice", type=float, default=2.5, help="seconds of each contender's turn (default 2.5)")
    parser.add_argument("--rq-rate", type=float, default=20.0, help="toggles per second on RQ (default 20)")
    parser.add_argument("--celery-rate", type=float, default=40.0, help="toggles per second on Celery (default 40)")
    parser.add_argument("--drain-timeout", type=float, default=60.0, help="seconds to wait for the last toggles")
    parser.add_argument(
        "--observe",
        choices=("commit", "read"),
        default="commit",
        help="when a toggle is visible: at the commit that wrote it, stamped by a deferred trigger (default), or "
        "at the poller's first read that shows it (every 5 ms)",
    )
    parser.add_argument(
        "--conn-max-age",
        type=int,
        default=60,
        help="CONN_MAX_AGE of every process's connections, both contenders' (default 60, as docs/deployment.md "
        "advises a worker; 0 is Django's default: a connection per job)",
    )
    args = parser.parse_args(argv)
    os.environ["BENCH_CONN_MAX_AGE"] = str(args.conn_max_age)  # before Django is set up; the workers inherit it
    if args.conn_max_age:
        # Celery's Django fix-up closes every connection around every task unless this is set (tests/settings.py
        # reads it): a pool process then keeps its connection, for both contenders.
        os.environ["CELERY_DB_REUSE_MAX"] = "1000"
    known = cells(args.rq_rate, args.celery_rate)
    chosen = [name.strip() for name in args.cells.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown:
        parser.error(f"unknown cell(s) {', '.join(unknown)}; known: {', '.join(known)}")
    with ExitStack() as stack:
        if any(known[name].delivery == "celery" for name in chosen):
            vhost = Vhost()  # before Django is set up: the project's Celery app reads its broker then
            stack.callback(vhost.delete)
        from benchmarks import bench  # sets Django up

        bench.prepare_database()
        started = time.monotonic()
        numbers = itertools.count(1)
        results = []
        for seed, name in enumerate(chosen):
            results.append(run_cell(known[name], args, numbers, seed * 2))
            bench.empty_tables()
        print(
            f"\ncommand: {' '.join(sys.argv)}; CONN_MAX_AGE {args.conn_max_age}; visible at the {args.observe}; "
            f"{time.monotonic() - started:.0f} s"
        )
        print_results(results)
    return 1 if any(result.missing or result.wrong for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
