#!/usr/bin/env python
"""Benchmark of SAFEUPDATES_DELIVERY = "celery" against hand-written Celery, side by side in one run, on
one broker (a RabbitMQ vhost of its own, or a Redis database) and one database.

Run from the repository root::

    .venv/bin/python benchmarks/celery_bench.py [--broker rabbitmq|redis] [--rounds 3] [--toggles 2000]
        [--records 20] [--calls 600]

``--broker redis`` uses the Redis database of ``BENCH_REDIS_URL``, which must be given: it is flushed first.

1. Drain: a burst of toggles piled up behind gates (one per pool process), then drained by 2 prefork
   workers (``-c 2``): one naive Celery task per toggle (load, set, ``save()``) against ``enqueue_update()``
   with Celery delivery, which publishes one message per record in flight (a toggle whose record has a
   message waiting publishes none). "all applied" is the moment no request is pending any more; "every
   message run" the moment every message published has been run (Celery's own counters,
   ``inspect().stats()``, against the apply tasks this process published, counted by Celery's
   ``after_task_publish`` signal).
2. Enqueue: ``enqueue_update()`` against the same durable work by hand (an outbox INSERT and
   ``transaction.on_commit(lambda: task.apply_async(...))``), beside a bare ``apply_async()``; no worker.

Ratios are printed per round and as medians; nothing here is a pass/fail threshold. It uses its own
PostgreSQL database (``BENCH_DATABASE_URL``, default ``.../safeupdates_bench_celery``) and deletes its vhost
at the end. See docs/delivery.md for the figures of a run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/safeupdates_bench_celery")


class Vhost:
    """A RabbitMQ vhost of the benchmark's own (``safeupdates_bench_<random>``), deleted at the end."""

    def __init__(self) -> None:
        self.name = f"safeupdates_bench_{uuid.uuid4().hex[:8]}"

    def ctl(self, *args: str) -> None:
        subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)

    def create(self) -> Vhost:
        self.ctl("add_vhost", self.name)
        self.ctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")
        return self

    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:5672/{self.name}"

    def delete(self) -> None:
        self.ctl("delete_vhost", self.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--toggles", type=int, default=2000)
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--calls", type=int, default=600, help="enqueue calls per contender and round")
    parser.add_argument("--broker", choices=["rabbitmq", "redis"], default="rabbitmq")
    args = parser.parse_args()
    if args.broker == "redis":
        url = os.environ.get("BENCH_REDIS_URL")
        if not url:
            sys.exit("--broker redis needs BENCH_REDIS_URL: a Redis database of the benchmark's own (it is flushed).")
        import redis

        redis.Redis.from_url(url).flushdb()
        os.environ["CELERY_BROKER_URL"] = url
        run(args, f"Redis {url}")
        return
    try:
        vhost = Vhost().create()
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"Cannot create a RabbitMQ vhost (rabbitmqctl, RabbitMQ at 127.0.0.1:5672): {exc}")
    # The project's Celery app (tests.celery_app, Celery's current app) reads its broker from the settings.
    os.environ["CELERY_BROKER_URL"] = vhost.url()
    try:
        run(args, f"RabbitMQ vhost {vhost.name}")
    finally:
        vhost.delete()


def run(args: argparse.Namespace, broker: str) -> None:
    from benchmarks import bench  # sets Django up

    bench.prepare_database()
    from django.test.utils import override_settings

    report = bench.Report()
    with override_settings(SAFEUPDATES_DELIVERY="celery"):
        bench_drain(report, args.rounds, args.toggles, args.records)
        bench_enqueue(report, args.rounds, args.calls)
    print(f"\nbroker: {broker}; command: {' '.join(sys.argv)}")
    report.print()


class CeleryWorkers:
    """``count`` prefork workers (``-c 2``) of the project's app on ``queue``, also importing ``include``."""

    def __init__(self, count: int, queue: str, include: str = "benchmarks.celery_jobs") -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="safeupdates-celery-bench-", suffix=".log", delete=False)  # noqa: SIM115
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SAFEUPDATES_DELIVERY": "celery"}
        args = [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker", "-I", include]
        args += ["--pool", "prefork", "-c", "2", "-Q", queue, "-l", "WARNING"]
        args += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        self.procs = [
            subprocess.Popen(
                [*args, "-n", f"bench-{queue}-{index}-{os.getpid()}@%h"],
                cwd=ROOT,
                env=env,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for index in range(count)
        ]

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        self.log.close()


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 600, poll: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"Timed out after {timeout}s waiting for {what}.")
        time.sleep(poll)


def tasks_run(app: Any, names: tuple[str, ...], workers: int = 2) -> int:
    """Tasks of ``names`` the workers have run so far (their own counters), once all ``workers`` answer: each
    ask waits 0.3 s for answers, and a worker that answers late (on a loaded machine, on Redis) would make the
    count too low, and a drain look done before it is."""
    deadline = time.monotonic() + 120
    while True:
        stats = app.control.inspect(timeout=0.3).stats() or {}
        if len(stats) >= workers:
            return sum(worker.get("total", {}).get(name, 0) for worker in stats.values() for name in names)
        if time.monotonic() > deadline:
            sys.exit(f"Only {len(stats)} of {workers} workers answer inspect().stats().")


#: The contenders of the drain, the naive task and enqueue_update, share one queue and one pool of workers.
DRAIN_QUEUE = "celery-bench"
GATE_WAITERS = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s"


def bench_drain(report: Any, rounds: int, toggle_count: int, records: int) -> None:
    from celery import current_app
    from celery.signals import after_task_publish
    from django.db import connection
    from django.test.utils import override_settings

    from benchmarks import bench
    from benchmarks.celery_jobs import GATE_LOCK, gate, naive_toggle
    from benchmarks.saveapp.models import PlainRow
    from safeupdates.delivery.celery import APPLY_TASK
    from safeupdates.jobs import enqueue_update
    from safeupdates.models import ProcessedRequest, RequestStatus
    from tests.testapp.models import Profile

    app = current_app._get_current_object()
    pks = bench.make_profiles(records)
    plain = [row.pk for row in PlainRow.objects.bulk_create([PlainRow(name=f"bench {i}") for i in range(records)])]
    by_profile = dict(zip(pks, plain, strict=True))
    label = f"drain {toggle_count} toggles/{records} records"
    rows = {
        "naive": report.row("C1", f"{label}: naive task per toggle", "s"),
        "safe": report.row("C1", f"{label}: enqueue_update, all applied", "s"),
        "safe_run": report.row("C1", f"{label}: enqueue_update, every message run", "s"),
        "messages": report.row("C1", f"  (enqueue_update: apply messages published for {toggle_count} toggles)", ""),
        "naive_publish": report.row("C1", f"  (publish the burst: {toggle_count} naive apply_async)", "s"),
        "safe_publish": report.row("C1", f"  (publish the burst: {toggle_count} enqueue_update)", "s"),
    }
    wrong: list[int] = []
    slots = 4  # 2 workers, 2 pool processes each
    pools = [CeleryWorkers(2, DRAIN_QUEUE)]
    published: list[str] = []

    def count_publish(sender: Any = None, headers: Any = None, **kwargs: Any) -> None:
        if sender == APPLY_TASK:
            published.append(str((headers or {}).get("id")))

    after_task_publish.connect(count_publish, weak=False)

    def gates_waiting() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(GATE_WAITERS, [GATE_LOCK])
            return int(cursor.fetchone()[0]) >= slots

    def drain(kind: str, round_: int) -> None:
        queue = DRAIN_QUEUE
        plan, wanted = bench.toggles(pks, toggle_count, seed=round_)
        Profile.objects.filter(pk__in=pks).update(active=False, newsletter=False, dark_mode=False)
        PlainRow.objects.filter(pk__in=plain).update(active=False, newsletter=False, dark_mode=False)
        before = tasks_run(app, (naive_toggle.name, APPLY_TASK))
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [GATE_LOCK])
        try:
            for _ in range(slots):
                gate.apply_async(queue=queue)
            wait_for(gates_waiting, "the gates", 120)
            first = ProcessedRequest.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            published.clear()
            if kind == "naive":
                publish = [(by_profile[pk], name, value) for pk, name, value in plan]
                seconds = bench.timed(lambda: [naive_toggle.apply_async(args, queue=queue) for args in publish])
                rows["naive_publish"].figures.append(seconds)
            else:
                with override_settings(SAFEUPDATES_CELERY_QUEUE=queue):
                    seconds = bench.timed(lambda: [enqueue_update(Profile, pk, **{n: v}) for pk, n, v in plan])
                rows["safe_publish"].figures.append(seconds)
            start = time.perf_counter()
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [GATE_LOCK])
        if kind != "naive":
            pending = ProcessedRequest.objects.filter(pk__gt=first, status=RequestStatus.PENDING)
            wait_for(lambda: not pending.exists(), "every request applied")
            rows[kind].figures.append(time.perf_counter() - start)
            wrong.append(bench.wrong_fields(wanted))
        messages = toggle_count if kind == "naive" else len(published)
        total = before + messages
        wait_for(lambda: tasks_run(app, (naive_toggle.name, APPLY_TASK)) >= total, "every message run", poll=0)
        rows["naive" if kind == "naive" else f"{kind}_run"].figures.append(time.perf_counter() - start)
        if kind != "naive":
            rows["messages"].figures.append(float(messages))

    try:
        wait_for(lambda: len(app.control.inspect(timeout=1.0).ping() or {}) == 2, "the workers to start", 180, 0.5)
        for round_ in range(rounds):
            for kind in bench._rotate(["naive", "safe"], round_):
                drain(kind, round_)
            bench._progress(f"  C1. drain: round {round_ + 1}/{rounds} done")
    finally:
        for pool in pools:
            pool.stop()
    naive = rows["naive"].figures
    for kind, what in (("safe", "all applied"), ("safe_run", "every message run")):
        report.ratio(
            "C1",
            f"drain: naive / enqueue_update, {what}",
            [n / s for n, s in zip(naive, rows[kind].figures, strict=True)],
            ">= 10x (issue 54)",
            lambda ratio: ratio >= 10,
        )
    after_task_publish.disconnect(count_publish)
    report.check("drain: enqueue_update final state = newest request per field", not any(wrong), f"{wrong}")
    for pool in pools:
        Path(pool.log.name).unlink(missing_ok=True)


def bench_enqueue(report: Any, rounds: int, calls: int) -> None:
    from celery import current_app
    from django.contrib.contenttypes.models import ContentType
    from django.db import transaction

    from benchmarks import bench
    from benchmarks.celery_jobs import naive_toggle
    from safeupdates import conf
    from safeupdates.delivery.celery import apply_update
    from safeupdates.jobs import enqueue_update
    from safeupdates.models import ProcessedRequest
    from tests.testapp.models import Profile

    app = current_app._get_current_object()
    queue = conf.celery_queue()
    slices = 10
    per_slice = calls // slices
    pks = bench.make_profiles(per_slice * slices)
    content_type = ContentType.objects.get_for_model(Profile)

    def chunk(index: int) -> list[int]:
        return pks[index * per_slice : (index + 1) * per_slice]

    def safe(index: int) -> float:
        records = chunk(index)
        return bench.timed(lambda: [enqueue_update(Profile, pk, active=True) for pk in records])

    def by_hand(index: int) -> float:
        records = chunk(index)

        def one(pk: int) -> None:
            with transaction.atomic():
                row = ProcessedRequest.objects.create(
                    request_id=uuid.uuid4(), content_type=content_type, object_id=str(pk), changes={"active": True}
                )
                kwargs = {"content_type_id": content_type.pk, "object_id": str(pk), "using": "default"}
                transaction.on_commit(lambda: apply_update.apply_async((str(row.request_id),), kwargs, queue=queue))

        return bench.timed(lambda: [one(pk) for pk in records])

    def bare(index: int) -> float:
        records = chunk(index)
        return bench.timed(lambda: [naive_toggle.apply_async((pk, "active", True), queue=queue) for pk in records])

    contenders = [("safe", safe), ("by_hand", by_hand), ("bare", bare)]
    rows = {
        "safe": report.row("C2", "enqueue_update(Profile, pk, active=), autocommit", "us/call"),
        "by_hand": report.row("C2", "by hand: outbox INSERT + on_commit(apply_async)", "us/call"),
        "bare": report.row("C2", "bare apply_async (no outbox)", "us/call"),
    }
    bench.interleaved(contenders, 1, 0)  # warm-up: connections, producer pool
    per_round = []
    for round_ in range(rounds):
        seconds = bench.interleaved(contenders, slices, round_)
        for name, total in seconds.items():
            rows[name].figures.append(total / (per_slice * slices) * 1e6)
        per_round.append(seconds)
        with app.connection_for_write() as connection:
            connection.default_channel.queue_purge(queue)
        bench._progress(f"  C2. enqueue cost: round {round_ + 1}/{rounds} done")
    report.ratio("C2", "enqueue: enqueue_update / by hand", [s.ratio("safe", "by_hand") for s in per_round])
    report.ratio("C2", "enqueue: enqueue_update / bare apply_async", [s.ratio("safe", "bare") for s in per_round])
    report.ratio("C2", "  (by hand / bare apply_async)", [s.ratio("by_hand", "bare") for s in per_round])


if __name__ == "__main__":
    main()
