#!/usr/bin/env python
"""What ``safeupdates_status`` and the Prometheus gauges cost on a large request log: plans and timings.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME .venv/bin/python benchmarks/status_cost.py [--rows N]

Creates (if needed), migrates and fills the database ``NAME`` (throwaway: every request row is deleted
first) with ``--rows`` logged requests (default 1,000,000) over 100,000 records, seeded in one
``INSERT ... SELECT generate_series`` statement: terminal requests spread over the last ~29 days (one
in 10,000 failed), and 100 pending ones. Then prints the ``EXPLAIN (ANALYZE, BUFFERS)`` of each query
of the status and the metrics, and the median time of ``status.collect()`` and of one metrics read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402
import psycopg  # noqa: E402

SEED = """
INSERT INTO safeupdates_processedrequest
    (request_id, kind, content_type_id, object_id, key, version, changes, status, error, attempts, queue,
     created_at, processed_at)
SELECT md5('r' || i)::uuid, 'update', %(ct)s, (i %% 100000)::text, '', i, '{"active": true}'::jsonb,
       CASE WHEN i %% 10000 = 0 THEN 'failed' WHEN i %% 3 = 0 THEN 'stale' ELSE 'applied' END,
       CASE WHEN i %% 10000 = 0 THEN 'OperationalError: gone' ELSE '' END, 1, 'default',
       now() - (%(rows)s - i) * interval '2.5 seconds',
       now() - (%(rows)s - i) * interval '2.5 seconds' + interval '40 milliseconds'
FROM generate_series(1, %(rows)s) AS i;
INSERT INTO safeupdates_processedrequest
    (request_id, kind, content_type_id, object_id, key, version, changes, status, error, attempts, queue,
     created_at)
SELECT md5('p' || i)::uuid, 'update', %(ct)s, (i * 997 %% 100000)::text, '', %(rows)s + i,
       '{"active": false}'::jsonb, 'pending', '', 0, CASE WHEN i %% 2 = 0 THEN 'default' ELSE 'fast' END,
       now() - i * interval '1 second'
FROM generate_series(1, 100) AS i;
"""


def create_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def median_ms(func, rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        func()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    create_database(os.environ["DATABASE_URL"])
    django.setup()
    from django.contrib.contenttypes.models import ContentType
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Count, DurationField, ExpressionWrapper, Min
    from django.db.models.functions import Now
    from django.test.utils import override_settings

    from safeupdates import status
    from safeupdates.contrib.prometheus.metrics import RequestLogCollector
    from safeupdates.database import clock as db
    from safeupdates.models import TERMINAL_STATUSES, ProcessedRequest, RequestStatus
    from tests.testapp.models import Profile

    call_command("migrate", verbosity=0)
    ct = ContentType.objects.get_for_model(Profile).pk
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE safeupdates_processedrequest")
        cursor.execute(SEED, {"ct": ct, "rows": args.rows})
        cursor.execute("VACUUM ANALYZE safeupdates_processedrequest")
    print(f"seeded {ProcessedRequest.objects.count():,} requests in {time.perf_counter() - started:.1f} s")

    # The queries of safeupdates.status, as it builds them.
    log = ProcessedRequest.objects.all()
    done = log.filter(status__in=sorted(TERMINAL_STATUSES)).exclude(status=RequestStatus.PENDING)
    age = ExpressionWrapper(Now() - Min("created_at"), output_field=DurationField())
    plans = {
        "backlog by model and queue (status, gauges)": log.filter(status=RequestStatus.PENDING)
        .values("content_type_id", "queue")
        .annotate(pending=Count("pk"), oldest_age=age)
        .order_by("content_type_id", "queue"),
        "outcomes of the last hour": done.filter(processed_at__gte=db.older_than(3600))
        .values("status")
        .annotate(count=Count("pk")),
        "failed requests, count": done.filter(status=RequestStatus.FAILED).values("status").annotate(n=Count("pk")),
        "failed requests, newest 20": done.filter(status=RequestStatus.FAILED).order_by("-processed_at")[:20],
    }
    for title, queryset in plans.items():
        print(f"\n--- {title}\n{queryset.explain(analyze=True, buffers=True)}")
    collector = RequestLogCollector()
    with override_settings(SAFEUPDATES_METRICS_CACHE=0):
        metrics_ms = median_ms(lambda: list(collector.collect()))
    status_ms = median_ms(lambda: status.collect(ask_rq=False))
    print(
        f"\nmedian of 7: status.collect() (database part) {status_ms:.1f} ms; metrics gauges read {metrics_ms:.1f} ms"
    )


if __name__ == "__main__":
    main()
