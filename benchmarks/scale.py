#!/usr/bin/env python
"""Benchmark of safeupdates at production size: what each operation costs over a request log of 0, 100k
and 1M requests (100k records), side by side in one run, and the maintenance commands at that size.

Run from the repository root (``make bench-scale`` does)::

    .venv/bin/python benchmarks/scale.py [--sizes 0,100k,1M] [--records 100k] [--rounds 3] [--quick]
                                         [--explain] [--only ops,verify,purge] [--purge-pause SECONDS]

Each size is a database of its own on the benchmark's server (``<BENCH_DATABASE_URL's name>_<size>``,
copied from the migrated template database and seeded with ``generate_series``, never row by row).
The per-operation costs are measured in short slices that take turns between the sizes, in an order that
rotates, so that load from other processes slows every size alike; each ratio (largest size / empty log)
is the median of the per-round ratios. Then, per size: ``safeupdates_verify`` of one model in a process
of its own (time and peak RSS), and ``safeupdates_purge`` of the whole log while a writer calls
``enqueue_update()`` (its worst latency). ``--explain`` prints ``EXPLAIN (ANALYZE, BUFFERS)`` of each hot
query at the largest size. Exit status 0 if every target and check passes, 1 otherwise. See
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_size(text: str) -> int:
    """``"100k"`` -> 100000, ``"1M"`` -> 1000000, ``"2500"`` -> 2500."""
    text = text.strip()
    factor = {"k": 1_000, "K": 1_000, "m": 1_000_000, "M": 1_000_000}.get(text[-1:], 1)
    number = text[:-1] if factor > 1 else text
    try:
        value = int(float(number) * factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 0, 5000, 100k, 1M)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a size is zero or more, not {text!r}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--sizes",
        type=lambda text: [parse_size(part) for part in text.split(",")],
        default=None,
        help="logged requests per database, the first is the reference (default 0,100k,1M; --quick: 0,10k,100k)",
    )
    parser.add_argument("--records", type=parse_size, default=None, help="records (default 100k; --quick: 10k)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the per-operation costs (default 3)")
    parser.add_argument("--slices", type=int, default=None, help="slices per round (default 6; --quick: 3)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI-sized machines")
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN (ANALYZE, BUFFERS) of the hot queries")
    parser.add_argument(
        "--purge-pause",
        type=float,
        default=None,
        metavar="SECONDS",
        help="safeupdates_purge --pause: seconds after each full batch of the purge (default: the command's)",
    )
    parser.add_argument(
        "--only", default="ops,verify,purge", help="parts to run: ops, verify, purge (default all three)"
    )
    args = parser.parse_args(argv)
    args.sizes = args.sizes or ([0, 10_000, 100_000] if args.quick else [0, 100_000, 1_000_000])
    args.records = args.records or (10_000 if args.quick else 100_000)
    args.slices = args.slices or (3 if args.quick else 6)
    if len(set(args.sizes)) != len(args.sizes):
        parser.error("--sizes: each size once")
    return args


ARGS = parse_args(None if __name__ == "__main__" else [])
# The settings build one database alias per size, from this variable.
os.environ["BENCH_SCALE_SIZES"] = ",".join(map(str, ARGS.sizes))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.scale_settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.contrib.contenttypes.models import ContentType  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from benchmarks.bench import Report, bench_queue, empty_queue  # noqa: E402
from benchmarks.scale_settings import current, size_alias  # noqa: E402
from safeupdates import audit, status  # noqa: E402
from safeupdates.database import statements  # noqa: E402
from safeupdates.jobs import apply_update, enqueue_update, relay  # noqa: E402
from safeupdates.models import ProcessedRequest, RequestStatus  # noqa: E402
from safeupdates.versions import SEQUENCE_NAME  # noqa: E402
from tests.testapp.models import Profile  # noqa: E402

FIELDS = ("active", "newsletter", "dark_mode")
#: How far back the seeded log reaches: its requests are spread evenly over this many seconds.
LOG_SPAN = 90 * 86400
#: Task rows (``@idempotent``) seeded beside the requests: the purge must keep them.
TASKS = 1000
#: Records of the verify check whose stored value is changed behind the app's back (QuerySet.update).
DRIFTED = 5
#: Pending requests among the log for the relay pass.
RELAY_PENDING = 100
#: Requests of the record whose timeline is timed, the same at every size: the page then lists as many
#: rows whatever the log holds (a seeded record holds none at 0 and about ten at 1M).
TIMELINE_REQUESTS = 10


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _label(size: int) -> str:
    if size >= 1_000_000 and size % 1_000_000 == 0:
        return f"{size // 1_000_000}M"
    if size >= 1_000 and size % 1_000 == 0:
        return f"{size // 1_000}k"
    return str(size)


@contextmanager
def on(alias: str) -> Iterator[None]:
    """Route every query of this context to database ``alias`` (see ``SizeRouter``)."""
    token = current.set(alias)
    try:
        yield
    finally:
        current.reset(token)


# --- set-up --------------------------------------------------------------------------------------------


@dataclass
class Size:
    """One log size: its database, its records and what the measurements need of it."""

    size: int
    index: int
    records: int
    content_type_id: int = 0
    client: Client | None = None
    #: Records whose requests were all applied: enqueue_update() finds no pending request there.
    idle: list[int] = field(default_factory=list)
    #: The record of the timed timeline (:meth:`Operations.timeline_record`), once made.
    timeline: int | None = None

    @property
    def alias(self) -> str:
        return size_alias(self.size)

    @property
    def offset(self) -> int:
        # Primary keys of each database in a range of their own: apply jobs are named after the record,
        # and the sizes share one RQ queue.
        return self.index * 1_000_000_000

    @property
    def label(self) -> str:
        return _label(self.size)

    def pk(self, record: int) -> int:
        """The primary key of record ``record`` (1-based)."""
        return self.offset + record


def prepare_template() -> str:
    """Create (if needed) and migrate the template database; refuse one not named for benchmarks."""
    connection = connections["default"]
    name = connection.settings_dict["NAME"]
    if connection.vendor != "postgresql":
        sys.exit(f"The benchmark needs PostgreSQL; BENCH_DATABASE_URL points at {connection.vendor}.")
    if "bench" not in name:
        sys.exit(f"Refusing database {name!r}: the benchmark drops and creates databases named after it.")
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if cursor.fetchone() is None:
            cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
    call_command("migrate", verbosity=0, interactive=False, run_syncdb=True)
    # The schema only: `make bench` runs on the same database by default and leaves its records and
    # requests there; copied into each size, they would collide with the seeded keys and make the empty
    # log not empty.
    tables = ", ".join(connection.ops.quote_name(model._meta.db_table) for model in (Profile, ProcessedRequest))
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables} CASCADE")
    connection.close()
    return str(name)


def create_database(size: Size, template: str) -> None:
    """(Re)create the size's database as a copy of the migrated template."""
    connections[size.alias].close()
    name = connections[size.alias].settings_dict["NAME"]
    qn = connections["default"].ops.quote_name
    with connections["default"]._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {qn(name)}")
        cursor.execute(f"CREATE DATABASE {qn(name)} TEMPLATE {qn(template)}")


# The seeded log, per record r (1..R), request k (0..n_r-1) is request i = k*R + r, version R + i: field
# FIELDS[k % 3], value (k // 3) % 2 = 0. Every request is applied (a few older ones are stale), and each
# record holds, per field, the value and version of its newest request on it: no drift. The profile's
# own base version ("*") is r, below every request's.
SEED_PROFILES = """
INSERT INTO testapp_profile (id, lock_version, field_versions, last_synced_at, name, active, newsletter,
                             dark_mode, score, note)
SELECT %(offset)s + r, GREATEST(r, v0, v1, v2),
       jsonb_build_object('*', r) || jsonb_strip_nulls(jsonb_build_object('active', v0, 'newsletter', v1,
                                                                           'dark_mode', v2)),
       NULL, 'scale ' || r, COALESCE((v0 - %(records)s - r) / %(records)s / 3 %% 2 = 0, false),
       COALESCE((v1 - %(records)s - r) / %(records)s / 3 %% 2 = 0, false),
       COALESCE((v2 - %(records)s - r) / %(records)s / 3 %% 2 = 0, false), 0, ''
FROM (
    SELECT r, %(records)s + %(records)s * k0 + r AS v0, %(records)s + %(records)s * k1 + r AS v1,
           %(records)s + %(records)s * k2 + r AS v2
    FROM (
        SELECT r, CASE WHEN n >= 1 THEN (n - 1) - (n - 1) %% 3 END AS k0,
               CASE WHEN n >= 2 THEN (n - 1) - (n - 2) %% 3 END AS k1,
               CASE WHEN n >= 3 THEN (n - 1) - (n - 3) %% 3 END AS k2
        FROM (SELECT r, CASE WHEN r <= %(size)s THEN (%(size)s - r) / %(records)s + 1 ELSE 0 END AS n
              FROM generate_series(1, %(records)s) r) counted
    ) newest
) versions
"""

SEED_REQUESTS = """
INSERT INTO safeupdates_processedrequest (request_id, kind, object_id, key, version, changes, status, error,
                                          attempts, queue, created_at, processed_at, synced_at, content_type_id)
SELECT gen_random_uuid(), 'update', (%(offset)s + r)::text, '', %(records)s + i,
       jsonb_build_object((ARRAY['active', 'newsletter', 'dark_mode'])[k %% 3 + 1], (k / 3) %% 2 = 0),
       CASE WHEN k %% 7 = 3 AND k < (%(size)s - r) / %(records)s + 1 - 3 THEN 'stale' ELSE 'applied' END,
       '', 1, %(queue)s, at, at, NULL, %(content_type)s
FROM (SELECT i, (i - 1) %% %(records)s + 1 AS r, (i - 1) / %(records)s AS k,
             now() - make_interval(secs => (%(size)s - i + 1) * %(span)s::float8 / %(size)s) AS at
      FROM generate_series(1, %(size)s) i) requests
"""

SEED_TASKS = """
INSERT INTO safeupdates_processedrequest (request_id, kind, object_id, key, version, changes, status, error,
                                          attempts, queue, created_at, processed_at, synced_at, content_type_id)
SELECT gen_random_uuid(), 'task', '', 'scale-task-' || t, NULL, '{}', 'applied', '', 1, '',
       now() - interval '100 days', now() - interval '100 days', NULL, NULL
FROM generate_series(1, %(tasks)s) t
"""


def seed(size: Size) -> None:
    """Fill the size's database: its records, its logged requests, task rows; then VACUUM ANALYZE."""
    connection = connections[size.alias]
    with on(size.alias):
        size.content_type_id = ContentType.objects.get_for_model(Profile).pk
        User.objects.create_superuser("scale", "scale@example.com", "scale")
    params = {
        "offset": size.offset,
        "records": size.records,
        "size": size.size,
        "span": LOG_SPAN,
        "queue": settings.SAFEUPDATES_QUEUE,
        "content_type": size.content_type_id,
        "tasks": TASKS,
    }
    with connection.cursor() as cursor:
        cursor.execute(SEED_PROFILES, params)
        if size.size:
            cursor.execute(SEED_REQUESTS, params)
        cursor.execute(SEED_TASKS, params)
        cursor.execute("SELECT setval(%s, %s)", [SEQUENCE_NAME, size.records + size.size + 1])
        # What autovacuum would have done on a log that grew over months.
        for table in (Profile._meta.db_table, ProcessedRequest._meta.db_table):
            cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(table)}")
    size.idle = [size.pk(record) for record in range(1, size.records + 1)]
    random.Random(size.size).shuffle(size.idle)


def drift(size: Size) -> None:
    """Change ``active`` of the first records behind the app's back: verify must find exactly these."""
    if not size.size:
        return
    with on(size.alias):
        pks = [size.pk(record) for record in range(1, DRIFTED + 1)]
        for profile in Profile.objects.filter(pk__in=pks):
            Profile.objects.filter(pk=profile.pk).update(active=not profile.active)


# --- per-operation costs -----------------------------------------------------------------------------


OPERATIONS = [
    ("update_if_newer", "update_if_newer(pk, version=, request_id=, active=)", "ms/call", 1.2),
    ("enqueue_update", "enqueue_update(Profile, pk, active=), new job", "ms/call", 1.2),
    ("apply", "one apply job: apply_update(request_id), in process", "ms/job", 1.2),
    ("relay", f"relay pass, {RELAY_PENDING} pending, their jobs lost", "ms/pass", 1.2),
    ("relay_scan", f"  (relay pass --dry-run: the scan of {RELAY_PENDING} pending)", "ms/pass", None),
    ("admin_first", "request-log admin: first page", "ms/page", 1.2),
    ("admin_filter", "request-log admin: filter status=applied", "ms/page", 1.2),
    ("admin_search", "request-log admin: search by request id", "ms/page", 1.2),
    ("timeline", "a record's request timeline (admin, filtered)", "ms/page", 1.2),
    ("status", "safeupdates_status: the database's part (status.collect)", "ms/call", 1.2),
    ("metrics", "metrics: the gauges' query (status.backlog)", "ms/call", 1.2),
]
#: Absolute targets, at every size (milliseconds).
LIMITS = {"relay": 50.0, "admin_first": 200.0, "admin_filter": 200.0, "admin_search": 200.0, "timeline": 200.0}


def versions(alias: str, count: int) -> list[int]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT nextval(%s) FROM generate_series(1, %s)", [SEQUENCE_NAME, count])
        return [row[0] for row in cursor.fetchall()]


def take_idle(size: Size, count: int) -> list[int]:
    taken, size.idle = size.idle[:count], size.idle[count:]
    return taken


class Operations:
    """The timed operations of one size; each returns seconds per call."""

    def __init__(self, size: Size, calls: int) -> None:
        self.size = size
        self.calls = calls
        self.rng = random.Random(size.size + 7)
        self.queue = bench_queue()

    def update_if_newer(self) -> float:
        size = self.size
        work = [
            (size.pk(self.rng.randint(1, size.records)), version, uuid.uuid4(), self.rng.random() < 0.5)
            for version in versions(size.alias, self.calls)
        ]
        manager = Profile.objects
        start = time.perf_counter()
        for pk, version, request_id, value in work:
            manager.update_if_newer(pk, version=version, request_id=request_id, active=value)
        return (time.perf_counter() - start) / len(work)

    def enqueue_and_apply(self) -> tuple[float, float]:
        """``enqueue_update()`` on records with nothing pending, then their apply jobs, in process."""
        pks = take_idle(self.size, self.calls)
        values = [self.rng.random() < 0.5 for _ in pks]
        empty_queue(self.queue)
        start = time.perf_counter()
        requests = [enqueue_update(Profile, pk, active=value) for pk, value in zip(pks, values, strict=True)]
        enqueued = time.perf_counter() - start
        empty_queue(self.queue)
        start = time.perf_counter()
        for request in requests:
            apply_update(str(request.request_id))
        applied = time.perf_counter() - start
        self.size.idle += pks
        return enqueued / len(pks), applied / len(pks)

    def relay(self) -> tuple[float, float]:
        """A relay pass with ``RELAY_PENDING`` requests pending whose jobs were lost, then a dry run."""
        pks = take_idle(self.size, RELAY_PENDING)
        pending = [enqueue_update(Profile, pk, newsletter=True).pk for pk in pks]
        empty_queue(self.queue)  # lost: the relay must deliver every one of them
        start = time.perf_counter()
        report = relay(0)
        delivering = time.perf_counter() - start
        start = time.perf_counter()
        relay(0, dry_run=True)
        scanning = time.perf_counter() - start
        if report.due != RELAY_PENDING or report.enqueued != RELAY_PENDING:
            sys.exit(f"relay pass on {self.size.label}: {report.summary()}, expected {RELAY_PENDING} due and enqueued")
        empty_queue(self.queue)
        ProcessedRequest.objects.filter(pk__in=pending).delete()
        self.size.idle += pks
        return delivering, scanning

    def admin(self, url: str) -> float:
        assert self.size.client is not None
        start = time.perf_counter()
        response = self.size.client.get(url)
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            sys.exit(f"{url} on {self.size.label}: HTTP {response.status_code}")
        return elapsed

    def timeline_record(self) -> int:
        """A record of its own, beyond the seeded ones, with :data:`TIMELINE_REQUESTS` applied requests:
        made once per size, before anything is timed."""
        size = self.size
        if size.timeline is None:
            profile = Profile.objects.create(pk=size.pk(size.records + 1), name="timeline")
            ProcessedRequest.objects.bulk_create(
                ProcessedRequest(
                    request_id=uuid.uuid4(),
                    content_type_id=size.content_type_id,
                    object_id=str(profile.pk),
                    version=version,
                    changes={"active": n % 2 == 0},
                    status=RequestStatus.APPLIED,
                    attempts=1,
                    processed_at=timezone.now(),
                )
                for n, version in enumerate(versions(size.alias, TIMELINE_REQUESTS))
            )
            size.timeline = profile.pk
        return size.timeline

    def admin_urls(self) -> dict[str, str]:
        changelist = reverse("admin:safeupdates_processedrequest_changelist")
        size = self.size
        record, timeline = size.pk(self.rng.randint(1, size.records)), self.timeline_record()
        request_id = (
            ProcessedRequest.objects.filter(content_type_id=size.content_type_id, object_id=str(record))
            .values_list("request_id", flat=True)
            .first()
        ) or uuid.uuid4()
        return {
            "admin_first": changelist,
            "admin_filter": f"{changelist}?status__exact=applied",
            "admin_search": f"{changelist}?q={request_id}",
            "timeline": f"{changelist}?content_type__id__exact={size.content_type_id}&object_id={timeline}",
        }

    def slice(self) -> dict[str, float]:
        """One slice of every operation on this size: seconds per call, by operation."""
        with on(self.size.alias):
            result = {"update_if_newer": self.update_if_newer()}
            result["enqueue_update"], result["apply"] = self.enqueue_and_apply()
            result["relay"], result["relay_scan"] = self.relay()
            for name, url in self.admin_urls().items():
                result[name] = self.admin(url)
            result["status"] = self.timed(lambda: status.collect(using=self.size.alias, ask_rq=False))
            result["metrics"] = self.timed(lambda: status.backlog(self.size.alias))
        return result

    def timed(self, call: Callable[[], Any], times: int = 5) -> float:
        """Seconds per call of ``call``, over ``times`` calls (the request log's summary: no Redis)."""
        start = time.perf_counter()
        for _ in range(times):
            call()
        return (time.perf_counter() - start) / times


def bench_operations(report: Report, sizes: list[Size], rounds: int, slices: int, calls: int) -> None:
    """The per-operation costs of every size, side by side; ratios of the largest size to the first."""
    for size in sizes:
        with on(size.alias):
            size.client = Client()
            size.client.force_login(User.objects.get(username="scale"))
    ops = {size.alias: Operations(size, calls) for size in sizes}
    per_round: list[dict[str, dict[str, float]]] = []

    def contender(size: Size) -> Callable[[int], dict[str, float]]:
        return lambda _index: ops[size.alias].slice()

    for size in sizes:
        contender(size)(0)  # warm-up: connections, caches, prepared statements
    for round_ in range(rounds):
        figures: dict[str, dict[str, list[float]]] = {size.alias: {} for size in sizes}
        for index in range(slices):
            order = [*sizes[(round_ + index) % len(sizes) :], *sizes[: (round_ + index) % len(sizes)]]
            for size in order:
                for name, seconds in contender(size)(index).items():
                    figures[size.alias].setdefault(name, []).append(seconds)
        per_round.append({alias: {n: statistics.median(v) for n, v in f.items()} for alias, f in figures.items()})
        _progress(f"  per-operation costs: round {round_ + 1}/{rounds} done")

    first, last = sizes[0], sizes[-1]
    for name, label, unit, _target in OPERATIONS:
        for size in sizes:
            row = report.row("1", f"{label} @ {size.label}", unit)
            row.figures = [r[size.alias][name] * 1000 for r in per_round]
    for name, label, _unit, target in OPERATIONS:
        ratios = [r[last.alias][name] / r[first.alias][name] for r in per_round]
        if target is None:
            report.ratio("1", f"{label}: {last.label} / {first.label}", ratios)
        else:
            report.ratio("1", f"{label}: {last.label} / {first.label}", ratios, f"<= {target}x", _at_most(target))
    for name, limit in LIMITS.items():
        label = next(label for n, label, _u, _t in OPERATIONS if n == name)
        worst = max(statistics.median(r[size.alias][name] for r in per_round) * 1000 for size in sizes)
        report.check(f"{label}: under {limit:g} ms at every size", worst < limit, f"slowest size: {worst:.1f} ms")


def _at_most(target: float) -> Callable[[float], bool]:
    return lambda value: value <= target


# --- verify --------------------------------------------------------------------------------------------


def run_measured(command: list[str], env: dict[str, str]) -> tuple[float, int, int, str]:
    """Run ``command``; return (seconds, exit status, peak RSS in MB, output)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    output = proc.stdout.read().decode(errors="replace")
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, proc.returncode, usage.ru_maxrss // 1024, output


def bench_verify(report: Report, sizes: list[Size], records: int) -> None:
    """``safeupdates_verify testapp.Profile`` of each size, in a process of its own: time, peak RSS, and
    exactly the drift made behind the app's back found."""
    rss: dict[str, int] = {}
    for size in sizes:
        db = connections[size.alias].settings_dict
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "benchmarks.settings",
            "BENCH_DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}",
            "PYTHONPATH": str(ROOT),
        }
        command = [sys.executable, str(ROOT / "manage.py"), "safeupdates_verify", "testapp.Profile"]
        seconds, status, peak, output = run_measured(command, env)
        expected = DRIFTED if size.size else 0
        found = int(m.group(1)) if (m := re.search(r"testapp\.Profile: (\d+) field\(s\) drifted", output)) else -1
        report.row("2", f"safeupdates_verify testapp.Profile, {records:,} records @ {size.label}", "s").figures = [
            seconds
        ]
        report.row("2", f"  (its peak RSS @ {size.label})", "MB").figures = [peak]
        rss[size.label] = peak
        report.check(
            f"verify @ {size.label}: finds exactly the {expected} field(s) changed behind the app's back",
            found == expected and status == (1 if expected else 0),
            f"found {found}, exit status {status}" + ("" if found >= 0 else f"; output: {output[-500:]}"),
        )
        if size is sizes[-1]:
            report.check(f"verify @ {size.label}: under 10 s", seconds < 10, f"{seconds:.1f} s")
    if len(rss) > 1:
        low, high = min(rss.values()), max(rss.values())
        report.check(
            "verify: constant memory (peak RSS of the largest size within 1.2x of the smallest)",
            high <= 1.2 * low,
            ", ".join(f"{label}: {mb} MB" for label, mb in rss.items()),
        )


# --- purge ---------------------------------------------------------------------------------------------


class Writer:
    """A thread that calls ``enqueue_update()`` in autocommit, one every few milliseconds, on one size's
    database, and keeps each call's latency."""

    def __init__(self, size: Size, pause: float = 0.005) -> None:
        self.size = size
        self.pause = pause
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        rng = random.Random(3)
        try:
            with on(self.size.alias):
                while not self.stop.is_set():
                    pk = self.size.pk(rng.randint(1, self.size.records))
                    start = time.perf_counter()
                    enqueue_update(Profile, pk, dark_mode=rng.random() < 0.5)
                    self.latencies.append(time.perf_counter() - start)
                    time.sleep(self.pause)
        finally:
            connections.close_all()

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join()


#: Seconds the writer runs alone before the purge, for its latencies without a purge.
QUIET = 5.0


def _latencies(seconds: list[float]) -> tuple[float, float, float]:
    """Worst, 99th percentile and median of ``seconds``, in milliseconds."""
    ordered = sorted(seconds) or [0.0]
    return ordered[-1] * 1000, ordered[int(0.99 * (len(ordered) - 1))] * 1000, statistics.median(ordered) * 1000


def bench_purge(report: Report, sizes: list[Size], pause: float | None, batch_size: int = 1000) -> None:
    """``safeupdates_purge --older-than 0 --pause PAUSE`` of each size's whole log while a writer enqueues:
    the purge's time and longest batch, the writer's worst latency; pending requests and task rows kept."""
    queue = bench_queue()
    for size in sizes:
        with on(size.alias):
            terminal = ProcessedRequest.objects.exclude(status=RequestStatus.PENDING).exclude(kind="task").count()
            with Writer(size) as quiet:
                time.sleep(QUIET)
            out = StringIO()
            with Writer(size) as writer:
                start = time.perf_counter()
                call_command(
                    "safeupdates_purge",
                    *("--older-than", "0", "--batch-size", str(batch_size)),
                    *(("--pause", str(pause)) if pause is not None else ()),
                    stdout=out,
                )
                seconds = time.perf_counter() - start
            empty_queue(queue)
            left = dict(
                tasks=ProcessedRequest.objects.filter(kind="task").count(),
                pending=ProcessedRequest.objects.filter(status=RequestStatus.PENDING).count(),
                terminal=ProcessedRequest.objects.exclude(status=RequestStatus.PENDING).exclude(kind="task").count(),
            )
        written = len(quiet.latencies) + len(writer.latencies)
        how = "" if pause is None else f" --pause {pause:g}"
        purged = f"safeupdates_purge{how} of {terminal:,} requests @ {size.label}"
        report.row("3", purged, "s").figures = [seconds]
        for label, latencies in (("purge running", writer.latencies), (f"{QUIET:g} s without purge", quiet.latencies)):
            worst, p99, median = _latencies(latencies)
            report.row("3", f"  (enqueue_update, {label} @ {size.label}: worst)", "ms").figures = [worst]
            report.row("3", f"  (enqueue_update, {label} @ {size.label}: p99)", "ms").figures = [p99]
            report.row("3", f"  (enqueue_update, {label} @ {size.label}: median)", "ms").figures = [median]
        longest = re.search(r"longest batch ([\d.]+) ms", out.getvalue())
        if longest:
            report.row("3", f"  (longest batch statement @ {size.label})", "ms").figures = [float(longest.group(1))]
        if size is sizes[-1]:
            worst, p99, _median = _latencies(writer.latencies)
            quiet_worst = _latencies(quiet.latencies)[0]
            report.check(
                f"purge @ {size.label}: writer's worst latency under 100 ms",
                worst < 100,
                f"{worst:.1f} ms (p99 {p99:.1f} ms; worst without a purge {quiet_worst:.1f} ms)",
            )
            if longest:
                report.check(
                    f"purge @ {size.label}: no batch statement over 1 s",
                    float(longest.group(1)) < 1000,
                    longest.group(0),
                )
        report.check(
            f"purge @ {size.label}: every terminal request deleted, {TASKS} task rows and "
            f"{written} pending requests kept",
            left == {"tasks": TASKS, "pending": written, "terminal": 0},
            str(left),
        )


# --- EXPLAIN -------------------------------------------------------------------------------------------


class _Rollback(Exception):
    pass


def explain(alias: str, sql: str, params: Any = None) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of ``sql`` on ``alias``, in a transaction rolled back."""
    lines: list[str] = []
    try:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
            lines = [row[0] for row in cursor.fetchall()]
            raise _Rollback
    except _Rollback:
        pass
    return "\n".join(lines)


def captured(alias: str, action: Callable[[], Any]) -> list[str]:
    """The SQL that ``action`` ran on ``alias``, as sent."""
    with CaptureQueriesContext(connections[alias]) as queries:
        action()
    return [query["sql"] for query in queries.captured_queries]


def print_explains(size: Size) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of the hot queries at ``size``."""
    log = ProcessedRequest._meta.db_table
    ops = Operations(size, 1)
    plans: list[tuple[str, str]] = []

    def pick(title: str, queries: list[str], pattern: str) -> None:
        for sql in queries:
            if re.search(pattern, sql, re.S):
                plans.append((title, sql))
                return
        plans.append((title, f"-- not found: {pattern}"))

    with on(size.alias):
        pk = take_idle(size, 1)[0]
        version = versions(size.alias, 1)[0]
        pick(
            "update_if_newer(request_id=): the recorded statement",
            captured(
                size.alias,
                lambda: Profile.objects.update_if_newer(pk, version=version, request_id=uuid.uuid4(), active=True),
            ),
            r"^WITH upd AS",
        )
        request: list[ProcessedRequest] = []
        pick(
            "enqueue_update(): the pending INSERT",
            captured(size.alias, lambda: request.append(enqueue_update(Profile, pk, active=False))),
            rf'^INSERT INTO "{log}"',
        )
        empty_queue(ops.queue)
        queries = captured(size.alias, lambda: apply_update(str(request[0].request_id)))
        pick("apply job: the record's pending requests", queries, r"FOR UPDATE SKIP LOCKED")
        pick("apply job: the guarded UPDATE", queries, r'^UPDATE "testapp_profile"')
        pick("apply job: the requests marked applied", queries, rf'^UPDATE "{log}"')
        pending = [enqueue_update(Profile, pk, newsletter=True) for pk in take_idle(size, RELAY_PENDING)]
        pick("relay pass: the scan", captured(size.alias, lambda: relay(0, dry_run=True)), r"'pending'")
        empty_queue(ops.queue)
        ProcessedRequest.objects.filter(pk__in=[p.pk for p in pending]).delete()
        client = Client()
        client.force_login(User.objects.get(username="scale"))
        for name, url in ops.admin_urls().items():
            queries = [q for q in captured(size.alias, lambda url=url: client.get(url)) if f'"{log}"' in q]
            for index, sql in enumerate(queries):
                plans.append((f"{name} ({index + 1}/{len(queries)})", sql))
    with connections[size.alias].cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
    purge = statements.purge_batch("postgresql", statements.PURGE_REQUESTS)
    middle = (now - timedelta(seconds=LOG_SPAN / 2), 0)
    for title, sql, params in (
        ("purge: the first batch", purge.first, purge.params(now, 1000)),
        ("purge: a batch half-way", purge.after, purge.params(now, 1000, middle)),
    ):
        with connections[size.alias].cursor() as cursor:
            plans.append((title, cursor.mogrify(sql, params)))
    with on(size.alias):
        records = Profile.objects.order_by("pk").values_list("pk", "field_versions")[:1000]
        versions_by_id = {str(pk): field_versions for pk, field_versions in records}
        queries = captured(size.alias, lambda: audit._derived(Profile, versions_by_id, size.alias))
    pick("verify: the requests of one batch of 1,000 records", queries, r"jsonb_agg")
    for title, sql in plans:
        print(f"\n--- {title} @ {size.label}\n{sql}\n")
        if not sql.startswith("-- not found"):
            print(explain(size.alias, sql))


# --- main ----------------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    template = prepare_template()
    queue = bench_queue()
    empty_queue(queue)
    sizes = [Size(size, index, args.records) for index, size in enumerate(args.sizes)]
    db = connections["default"].settings_dict
    names = ", ".join(connections[size.alias].settings_dict["NAME"] for size in sizes)
    _progress(
        f"safeupdates scale benchmark: PostgreSQL {connections['default'].pg_version // 10000} on "
        f"{db.get('HOST') or 'localhost'}, databases {names}, "
        f"{args.records:,} records, Redis {settings.REDIS_URL} queue {queue.name!r}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    for size in sizes:
        seed_start = time.perf_counter()
        create_database(size, template)
        seed(size)
        drift(size)
        _progress(
            f"  seeded {size.label} requests over {size.records:,} records in {time.perf_counter() - seed_start:.0f} s"
        )
    report = Report()
    parts = {part.strip() for part in args.only.split(",")}
    try:
        if "verify" in parts:
            bench_verify(report, sizes, args.records)
        if "ops" in parts:
            bench_operations(report, sizes, args.rounds, args.slices, calls=20 if args.quick else 40)
        if "purge" in parts:
            bench_purge(report, sizes, args.purge_pause)
    finally:
        empty_queue(queue)
    ok = report.print()
    if args.explain:
        # The largest size again, purged above: seeded anew.
        largest = sizes[-1]
        create_database(largest, template)
        seed(largest)
        print_explains(largest)
    connections.close_all()
    print(f"\n   total time {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
