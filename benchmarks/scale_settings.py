"""Settings of the production-size benchmark (``benchmarks/scale.py``): the benchmark's settings, and one
database per log size, side by side on the same server.

``BENCH_DATABASE_URL`` names the template database (migrated once); each size gets a copy of it named
``<name>_<size>`` (``BENCH_SCALE_SIZES``, set by the script from ``--sizes``). :class:`SizeRouter` sends
every query of the current context to the size being measured, so that the library's own routing
(``router.db_for_write``) finds it as a project's router would.
"""

from __future__ import annotations

import contextvars
from typing import Any

from benchmarks.settings import *  # noqa: F403
from benchmarks.settings import DATABASES, env

SIZES = [int(size) for size in env.list("BENCH_SCALE_SIZES", default=["0", "100000", "1000000"])]


def size_alias(size: int) -> str:
    """The database alias of log size ``size``."""
    return f"size_{size}"


for _size in SIZES:
    DATABASES[size_alias(_size)] = {**DATABASES["default"], "NAME": f"{DATABASES['default']['NAME']}_{_size}"}

DATABASE_ROUTERS = ["benchmarks.scale_settings.SizeRouter"]
# The request-log admin is read through the test client.
ALLOWED_HOSTS = ["testserver"]

#: The database of the size being measured in this context (thread); "default" outside a measurement.
current: contextvars.ContextVar[str] = contextvars.ContextVar("safeupdates_scale_database", default="default")


class SizeRouter:
    """Reads and writes of every model go to :data:`current`'s database."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return current.get()

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return current.get()

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True
