"""Settings of benchmarks/topology_bench.py's measuring processes: the benchmark's, with what
docs/deployment.md asks for behind PgBouncer in transaction mode when ``SAFEUPDATES_BENCH_TOPOLOGY`` is
``pgbouncer-transaction`` (``BENCH_DATABASE_URL`` then names the pooler's port)."""

from __future__ import annotations

import os

from benchmarks.settings import *  # noqa: F403

if os.environ.get("SAFEUPDATES_BENCH_TOPOLOGY") == "pgbouncer-transaction":
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True  # noqa: F405
    SAFEUPDATES_PREPARED_STATEMENTS = False
