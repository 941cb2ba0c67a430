"""``benchmarks/latency.py`` (``make bench-latency``) runs, with tiny durations: a smoke test, no timing is
asserted. Real rqworkers on a benchmark database of its own (``<DATABASE_URL's>_bench_latency``) and a queue
of its own on the test's Redis database; the RQ cell only (the Celery cells need RabbitMQ)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

# once: the benchmark uses a database of its own, the same in both passes of make test.
pytestmark = [pytest.mark.workers, pytest.mark.once]


def test_the_latency_benchmark_prints_its_table() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the benchmark needs PostgreSQL")
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/safeupdates")
    base, _, name = url.rpartition("/")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchmarks.settings",
        "BENCH_DATABASE_URL": f"{base}/{name.split('?')[0]}_bench_latency",
        "BENCH_REDIS_URL": settings.REDIS_URL,
    }
    command = [sys.executable, "benchmarks/latency.py", "--cells", "rq-5", "--seconds", "1.5", "--slice", "0.5"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "app/naive" in result.stdout
    assert "toggle(s) never seen" not in result.stdout
