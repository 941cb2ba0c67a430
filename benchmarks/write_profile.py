#!/usr/bin/env python
"""The Python around ``update_if_newer(pk, version=, request_id=, active=)``'s statement (or, with ``--save``,
``LockVersionMixin.save()``'s): what it costs, where.

    .venv/bin/python benchmarks/write_profile.py [--calls 2000] [--repeats 5] [--baseline REF] [--profile] [--save]

Three figures per call, in microseconds, each the median of ``--repeats`` runs of ``--calls`` calls with
fresh request ids, in autocommit, on the benchmark's database (``BENCH_DATABASE_URL``, as ``bench.py``):

- ``call``: the whole call, statement included (real PostgreSQL);
- ``python``: the same calls with psycopg's ``execute`` and ``fetchone`` replaced by stand-ins that return
  the row the statement returned for real: what the library costs around the statement, nothing else
  (CPU time of the thread, which other processes on a busy machine disturb less than the wall clock);
- ``hand``: the statement alone, through a bare prepared psycopg cursor (bench.py's ``recorded_by_hand``).

``--save``: the same three figures for ``LockVersionMixin.save()`` of a loaded row of section 5's table
(``benchmarks.saveapp.LockVersionRow``, flipping ``active``, saving the whole row), ``hand`` being its
checked UPDATE on a bare prepared cursor (section 7's ``hand_save``); and ``plain``, plain Django's
``save()`` of the same shape of row (``PlainRow``), for comparison (wall clock, statement included).

``--baseline REF`` runs the same measurement on ``safeupdates/`` as committed at ``REF`` (a git export in a
temporary directory) in a second process, taking turns with this tree's, and prints both side by side.
``--profile``: the cProfile of ``--calls`` calls without their round trips (as ``python``), of this tree
and of the baseline if given, by own time.
A measuring tool, not a test: no figure here is asserted anywhere.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    sys.path.append(str(ROOT))  # after a baseline's safeupdates/ (PYTHONPATH)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    if "bench" not in connection.settings_dict["NAME"]:
        sys.exit("BENCH_DATABASE_URL must name a database whose name contains 'bench'.")
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [connection.settings_dict["NAME"]])
        if cursor.fetchone() is None:
            cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(connection.settings_dict['NAME'])}")
    call_command("migrate", verbosity=0, interactive=False, run_syncdb=True)


def _measure(calls: int, what: str) -> float:
    """Microseconds per call of ``what`` (``call``, ``python`` or ``hand``; ``save-call``, ``save-python``,
    ``save-hand`` and ``save-plain``) over ``calls`` fresh requests (saves)."""
    if what.startswith("save-"):
        return _measure_save(calls, what[len("save-") :])

    from benchmarks.bench import make_profiles, recorded_by_hand, versions
    from tests.testapp.models import Profile

    pks = _measure.__dict__.setdefault("pks", make_profiles(200))  # type: ignore[attr-defined]
    work = [(pks[i % len(pks)], i % 2 == 0, v, uuid.uuid4()) for i, v in enumerate(versions(calls))]
    if what == "hand":
        return recorded_by_hand(work) / calls * 1e6
    update = Profile.objects.update_if_newer
    if what == "call":
        start = time.perf_counter()
        for pk, value, version, request_id in work:
            update(pk, version=version, request_id=request_id, active=value)
        return (time.perf_counter() - start) / calls * 1e6
    with _without_round_trips(work[0]):
        # CPU time of this thread: nothing here waits, and on a busy machine the wall clock also counts
        # the time other processes held the CPU.
        start = time.thread_time()
        for pk, value, version, request_id in work:
            update(pk, version=version, request_id=request_id, active=value)
        return (time.thread_time() - start) / calls * 1e6


@contextmanager
def _without_round_trips(sample: tuple[int, bool, int, uuid.UUID]) -> Iterator[None]:
    """psycopg's ``execute`` does nothing and ``fetchone`` returns the row that the statement of ``sample``
    (a ``(pk, value, version, request_id)``; a fresh request id is used) returned for real, once, with the
    version of ``active`` each call sends (its write applied)."""
    from django.db import connection

    from tests.testapp.models import Profile

    pk, value, version, _request_id = sample
    canned = _row_returned_by(
        lambda: Profile.objects.update_if_newer(pk, version=version, request_id=uuid.uuid4(), active=value)
    )
    # The row's field_versions as PostgreSQL sends them (text: Django loads no JSON in psycopg).
    assert canned[0] == "applied" and list(json.loads(canned[1])) == ["active"], canned
    connection.ensure_connection()
    status = canned[0]
    sent: list[Any] = [None]

    def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        sent[0] = params
        return self

    def fetchone(self: Any) -> Any:
        # Written at this call's version, as the real statement's row says when it applies.
        return status, f'{{"active": {sent[0]["version"]}}}'

    with _psycopg_replaced(execute, fetchone):
        yield


def _saved_rows(model: Any, who: str = "") -> list[Any]:
    """200 loaded rows of ``model`` for ``who`` (made once per process, model and ``who``)."""
    made: dict[Any, list[Any]] = _saved_rows.__dict__.setdefault("made", {})  # type: ignore[attr-defined]
    if (model, who) not in made:
        created = [model(name=f"profile {i}") for i in range(200)]
        for obj in created:
            obj.save()
        made[model, who] = list(model.objects.filter(pk__in=[obj.pk for obj in created]).order_by("pk"))
    return made[model, who]


def _measure_save(calls: int, what: str) -> float:
    """Microseconds per ``save()`` of ``what``: ``call``, ``python`` (CPU time, without round trips) or
    ``hand`` (``LockVersionRow``'s checked UPDATE on a bare prepared cursor), or ``plain`` (``PlainRow``)."""
    from benchmarks.bench import checked_save_by_hand, hand_cursor, save_by_hand
    from benchmarks.saveapp.models import LockVersionRow, PlainRow

    # Rows of their own for the hand-written saves and for those without round trips (whose instances
    # then carry versions the rows do not).
    rows = _saved_rows(PlainRow if what == "plain" else LockVersionRow, what if what in ("hand", "python") else "")
    work = [rows[i % len(rows)] for i in range(calls)]
    for obj in work:
        obj.active = not obj.active
    if what == "hand":
        columns, sql = checked_save_by_hand()
        cursor = hand_cursor()
        start = time.perf_counter()
        save_by_hand(cursor, columns, sql, work)
        return (time.perf_counter() - start) / calls * 1e6
    if what in ("call", "plain"):
        start = time.perf_counter()
        for obj in work:
            obj.save()
        return (time.perf_counter() - start) / calls * 1e6
    with _save_without_round_trips(work[0]):
        start = time.thread_time()
        for obj in work:
            obj.save()
        return (time.thread_time() - start) / calls * 1e6


@contextmanager
def _save_without_round_trips(sample: Any) -> Iterator[None]:
    """psycopg's ``execute`` does nothing and ``fetchone`` returns a row as the checked UPDATE returns it
    (a fresh ``lock_version``, counted up from the one a real save of ``sample``'s row, loaded again,
    returned)."""
    fresh = type(sample)._default_manager.get(pk=sample.pk)
    fresh.active = not fresh.active
    canned = _row_returned_by(fresh.save)
    assert isinstance(canned[0], int), canned
    counter = [canned[0]]

    def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        return self

    def fetchone(self: Any) -> Any:
        counter[0] += 1
        return (counter[0], *canned[1:])

    with _psycopg_replaced(execute, fetchone):
        yield


def _row_returned_by(action: Callable[[], Any]) -> Any:
    """The last row psycopg's ``fetchone`` returned while ``action`` ran, for real."""
    import psycopg

    row: list[Any] = []
    real_fetchone = psycopg.Cursor.fetchone

    def keep(self: Any) -> Any:
        got = real_fetchone(self)
        row.append(got)
        return got

    psycopg.Cursor.fetchone = keep  # type: ignore[method-assign]
    try:
        action()
    finally:
        psycopg.Cursor.fetchone = real_fetchone  # type: ignore[method-assign]
    return row[-1]


@contextmanager
def _psycopg_replaced(execute: Callable[..., Any], fetchone: Callable[..., Any]) -> Iterator[None]:
    """psycopg's ``Cursor.execute`` and ``fetchone`` replaced by these within the block."""
    import psycopg

    real_execute, real_fetchone = psycopg.Cursor.execute, psycopg.Cursor.fetchone
    psycopg.Cursor.execute = execute  # type: ignore[method-assign,assignment]
    psycopg.Cursor.fetchone = fetchone  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        psycopg.Cursor.execute = real_execute  # type: ignore[method-assign]
        psycopg.Cursor.fetchone = real_fetchone  # type: ignore[method-assign]


def _profile(calls: int, top: int, save: bool = False) -> str:
    import cProfile
    import io
    import pstats

    from benchmarks.bench import make_profiles, versions
    from tests.testapp.models import Profile

    profiler = cProfile.Profile()
    if save:
        from benchmarks.saveapp.models import LockVersionRow

        rows = _saved_rows(LockVersionRow, "python")
        objs = [rows[i % len(rows)] for i in range(calls)]
        with _save_without_round_trips(objs[0]):
            profiler.enable()
            for obj in objs:
                obj.active = not obj.active
                obj.save()
            profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
        return out.getvalue()
    pks = make_profiles(200)
    work = [(pks[i % len(pks)], i % 2 == 0, v, uuid.uuid4()) for i, v in enumerate(versions(calls))]
    update = Profile.objects.update_if_newer
    with _without_round_trips(work[0]):
        profiler.enable()
        for pk, value, version, request_id in work:
            update(pk, version=version, request_id=request_id, active=value)
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def _child(args: argparse.Namespace) -> None:
    """One measuring process: read commands (``call``/``python``/``hand``/``profile``) on stdin, answer each."""
    _setup()
    for warm_up in ("save-call", "save-plain", "save-hand") if args.save else ("call", "hand"):
        _measure(200, warm_up)  # connection, caches, prepared statements
    import safeupdates

    print(json.dumps(str(Path(safeupdates.__file__).parent)), flush=True)  # ready: which safeupdates it runs
    for line in sys.stdin:
        what = line.strip()
        if what == "profile":
            print(json.dumps(_profile(args.calls, args.top, args.save)), flush=True)
        elif what:
            print(json.dumps(_measure(args.calls, what)), flush=True)


class _Process:
    def __init__(self, label: str, pythonpath: str | None, args: argparse.Namespace) -> None:
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        command = [sys.executable, __file__, "--child", "--calls", str(args.calls), "--top", str(args.top)]
        if args.save:
            command.append("--save")
        self.label = label
        # Run from the directory whose safeupdates/ is measured: Celery's Django fix-up puts the working
        # directory first on sys.path.
        cwd = pythonpath or ROOT
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd
        )
        # One at a time: each migrates the database first.
        assert self.process.stdout is not None
        self.package = json.loads(self.process.stdout.readline())
        print(f"{label}: {self.package}", file=sys.stderr)
        if pythonpath:
            assert self.package.startswith(pythonpath), "the baseline's safeupdates/ was not the one imported"

    def ask(self, what: str) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(what + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", help="a git ref: measure safeupdates/ as committed there too")
    parser.add_argument("--profile", action="store_true", help="print the cProfile of --calls calls")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--save", action="store_true", help="LockVersionMixin.save() instead of update_if_newer()")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        processes = []
        if args.baseline:
            archive = subprocess.run(
                ["git", "archive", args.baseline, "safeupdates"], cwd=ROOT, check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            processes.append(_Process(f"baseline {args.baseline}", tmp, args))
        processes.append(_Process("this tree", None, args))
        figures: dict[tuple[str, str], list[float]] = {}
        kinds: tuple[str, ...] = ("call", "python", "hand")
        if args.save:
            kinds = ("save-call", "save-python", "save-hand", "save-plain")
        for repeat in range(args.repeats):
            order = processes if repeat % 2 == 0 else processes[::-1]
            for what in kinds:
                for process in order:
                    figures.setdefault((process.label, what), []).append(process.ask(what))
        profiles = {p.label: p.ask("profile") for p in processes} if args.profile else {}
        for process in processes:
            process.close()
    what = "LockVersionMixin.save() of a loaded row" if args.save else "update_if_newer(pk, version=, request_id=)"
    print(f"{what}: us per call, median of {args.repeats} x {args.calls}")
    plain = f"{'plain':>10}{'plain/call':>11}" if args.save else ""
    print(f"{'':<28}{'call':>10}{'python':>10}{'(min)':>8}{'hand':>10}{'hand/call':>11}{plain}")
    for process in processes:
        m = {what.removeprefix("save-"): statistics.median(figures[(process.label, what)]) for what in kinds}
        least = min(figures[(process.label, kinds[1])])  # on a busy machine, the least disturbed run
        share = m["hand"] / m["call"]
        line = f"{process.label:<28}{m['call']:>10.1f}{m['python']:>10.1f}{least:>8.1f}"
        line += f"{m['hand']:>10.1f}{share:>10.2f}x"
        if args.save:
            line += f"{m['plain']:>10.1f}{m['plain'] / m['call']:>10.2f}x"
        print(line)
    for label, text in profiles.items():
        print(f"\n--- cProfile, {label}, {args.calls} calls without round trips, by own time ---")
        print(text)


if __name__ == "__main__":
    main()
