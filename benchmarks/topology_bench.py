#!/usr/bin/env python
"""The write path directly and through PgBouncer in transaction mode, side by side in one run.

Run from the repository root (``make bench-topologies`` does)::

    .venv/bin/python benchmarks/topology_bench.py [--rounds 3] [--ops 1500] [--toggles 1000] [--records 200]

It starts a PgBouncer of its own (tests/pooler.py: Debian's 1.18, installed if missing) in transaction
mode in front of the PostgreSQL of ``BENCH_DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/safeupdates_bench``; its name must contain ``bench``: its tables are
emptied), then measures each topology in a process of its own (``--child``) with the settings
docs/deployment.md asks for there: direct with prepared statements; through PgBouncer with
``DISABLE_SERVER_SIDE_CURSORS = True`` and ``SAFEUPDATES_PREPARED_STATEMENTS = False``. Each ratio is
safeupdates' throughput over its naive ORM equivalent through the same topology (higher is better, 1.00x:
as fast), the median of its rounds:

- ``update_if_newer(request_id)`` / ``Profile.objects.filter(pk=).update()``;
- ``LockVersionMixin.save()`` / plain ``Model.save()`` of an existing row;
- the drain: ``enqueue_update`` + ``apply_update`` by real rqworkers / one naive RQ job per toggle.

Within a round the contenders run in short slices taking turns (benchmarks/bench.py's ``interleaved``);
the drains hold the workers on a gate job while the burst is enqueued, as ``make bench`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOPOLOGIES = ("direct", "pgbouncer-transaction")
RATIOS = (
    ("update_if_newer", "update_if_newer(request_id) / naive ORM update"),
    ("save", "LockVersionMixin.save() / plain Model.save()"),
    ("drain", "drain: enqueue_update+apply_update / naive job per toggle"),
)


def child(args: argparse.Namespace) -> dict[str, list[float]]:
    """Measure the three ratios per round on the database this process's settings name."""
    from benchmarks import bench
    from benchmarks.jobs import gate, naive_toggle
    from benchmarks.saveapp.models import LockVersionRow, PlainRow
    from safeupdates.jobs import enqueue_update
    from safeupdates.models import ProcessedRequest, RequestStatus
    from tests.testapp.models import Profile

    bench.prepare_database()
    queue = bench.bench_queue()
    bench.empty_queue(queue)
    ratios: dict[str, list[float]] = {key: [] for key, _label in RATIOS}
    slices = 10
    per_slice = max(1, args.ops // slices)

    # update_if_newer(request_id) against the naive ORM update, on the same rows.
    pks = bench.make_profiles(200)
    position = iter(range(10**9))

    def todo() -> list[tuple[int, bool, int]]:
        start = next(position) * per_slice
        return [(pks[(start + i) % len(pks)], (start + i) % 2 == 0, v) for i, v in enumerate(bench.versions(per_slice))]

    def naive(_index: int) -> float:
        work = todo()
        start = time.perf_counter()
        for pk, value, _version in work:
            Profile.objects.filter(pk=pk).update(active=value)
        return time.perf_counter() - start

    def guarded(_index: int) -> float:
        work = [(pk, value, version, uuid.uuid4()) for pk, value, version in todo()]
        start = time.perf_counter()
        for pk, value, version, rid in work:
            Profile.objects.update_if_newer(pk, version=version, request_id=rid, active=value)
        return time.perf_counter() - start

    # save() of a loaded, existing row: plain Django against LockVersionMixin.
    saved = {
        model.__name__: list(model.objects.bulk_create([model(name=f"bench {i}") for i in range(200)]))
        for model in (PlainRow, LockVersionRow)
    }
    saved = {name: list(type(rows[0]).objects.order_by("pk")) for name, rows in saved.items()}
    turn = dict.fromkeys(saved, 0)

    def saver(name: str) -> Any:
        rows = saved[name]

        def run(_index: int) -> float:
            first = turn[name]
            turn[name] += per_slice
            work = [rows[(first + i) % len(rows)] for i in range(per_slice)]
            for obj in work:
                obj.active = not obj.active
            start = time.perf_counter()
            for obj in work:
                obj.save()
            return time.perf_counter() - start

        return run

    bench.interleaved([("naive", naive), ("guarded", guarded)], 1, 0)  # warm-up
    bench.interleaved([("plain", saver("PlainRow")), ("lock", saver("LockVersionRow"))], 1, 0)
    for round_ in range(args.rounds):
        seconds = bench.interleaved([("naive", naive), ("guarded", guarded)], slices, round_)
        ratios["update_if_newer"].append(seconds.ratio("naive", "guarded"))
        seconds = bench.interleaved([("plain", saver("PlainRow")), ("lock", saver("LockVersionRow"))], slices, round_)
        ratios["save"].append(seconds.ratio("plain", "lock"))
        print(f"  {args.topology}: single-row writes and saves, round {round_ + 1}/{args.rounds}", file=sys.stderr)

    # The drain: the same burst of toggles, naive jobs against enqueue_update + apply_update.
    records = bench.make_profiles(args.records)
    timeout = max(300.0, args.toggles * 0.5)  # a liveness bound on a shared machine, not a target
    with bench.workers(queue, args.workers) as pool:

        def drain(kind: str, round_: int) -> float:
            plan, wanted = bench.toggles(records, args.toggles, seed=round_)
            Profile.objects.filter(pk__in=records).update(**dict.fromkeys(bench.TOGGLE_FIELDS, False))
            bench.empty_queue(queue)
            started, release = f"safeupdates-bench:gate:{uuid.uuid4()}", f"safeupdates-bench:release:{uuid.uuid4()}"
            for _ in range(args.workers):
                queue.enqueue(gate, started, release, int(timeout), result_ttl=600, job_timeout=int(timeout) + 60)
            bench.wait_for(lambda: int(queue.connection.get(started) or 0) >= args.workers, "the workers", pool)
            first_request = ProcessedRequest.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            if kind == "naive":
                for toggle in plan:
                    queue.enqueue(naive_toggle, *toggle, result_ttl=600)
            else:
                for pk, name, value in plan:
                    enqueue_update(Profile, pk, **{name: value})
            finished = queue.finished_job_registry
            start = time.perf_counter()
            queue.connection.rpush(release, *["go"] * args.workers)
            if kind == "naive":
                total = args.toggles + args.workers
                bench.wait_for(lambda: finished.get_job_count(cleanup=False) >= total, "the naive drain", pool, timeout)
            else:
                pending = ProcessedRequest.objects.filter(pk__gt=first_request, status=RequestStatus.PENDING)
                bench.wait_for(lambda: not pending.exists(), "the safeupdates drain", pool, timeout)
            elapsed = time.perf_counter() - start
            if bench.wrong_fields(wanted):
                sys.exit(f"{args.topology}: the {kind} drain left fields other than the last toggle wanted")
            idle = lambda: queue.count == 0 and queue.started_job_registry.get_job_count() == 0  # noqa: E731
            bench.wait_for(idle, "idle workers", pool, timeout)
            queue.connection.delete(started, release)
            return elapsed

        for round_ in range(args.drain_rounds):
            seconds = {kind: drain(kind, round_) for kind in bench._rotate(["naive", "safe"], round_)}
            ratios["drain"].append(seconds["naive"] / seconds["safe"])
            print(f"  {args.topology}: drain, round {round_ + 1}/{args.drain_rounds}", file=sys.stderr)
    bench.empty_queue(queue)
    return ratios


def with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    host = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=host))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the single-row writes and saves")
    parser.add_argument("--drain-rounds", type=int, default=1, help="rounds of the drain (default 1)")
    parser.add_argument("--ops", type=int, default=1500, help="writes and saves per contender per round")
    parser.add_argument("--toggles", type=int, default=1000, help="toggles in the drain's burst")
    parser.add_argument("--records", type=int, default=200, help="records the toggles spread over")
    parser.add_argument("--workers", type=int, default=2, help="rqworker processes for the drain")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--topology", default="direct", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        Path(args.out).write_text(json.dumps(child(args)))
        return 0

    from tests.pooler import PgBouncer

    url = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/safeupdates_bench")
    passed = [a for a in (argv if argv is not None else sys.argv[1:]) if a not in ("--child",)]
    results: dict[str, dict[str, list[float]]] = {}
    started = time.perf_counter()
    with PgBouncer("transaction") as pooler:
        for topology in TOPOLOGIES:
            env = {
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "benchmarks.topology_settings",
                "SAFEUPDATES_BENCH_TOPOLOGY": topology,
                "BENCH_DATABASE_URL": url if topology == "direct" else with_port(url, pooler.port),
                "PYTHONPATH": str(ROOT),
            }
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                command = [sys.executable, __file__, *passed, "--child", "--topology", topology, "--out", out.name]
                status = subprocess.run(command, env=env, cwd=ROOT, check=False).returncode
                if status != 0:
                    print(f"the {topology} run failed (exit status {status})", file=sys.stderr)
                    return 1
                results[topology] = json.loads(Path(out.name).read_text())
    print()
    print(f"{'ratio (safeupdates / naive ORM, throughput)':<60}" + "".join(f"{t:>24}" for t in TOPOLOGIES))
    for key, label in RATIOS:
        cells = "".join(f"{statistics.median(results[t][key]):>23.2f}x" for t in TOPOLOGIES)
        print(f"{label:<60}{cells}")
    print(f"{'  (rounds)':<60}" + "".join(f"{len(results[t]['update_if_newer']):>24}" for t in TOPOLOGIES))
    print(f"\n   total time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
