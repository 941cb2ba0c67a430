"""Count the Redis commands sent to the tests' database, whoever else uses the server.

``INFO commandstats`` counts every client of the server: a second test suite on the same Redis (CI runs
two at once) or a helper's workers made counts off by a few. ``MONITOR`` shows each command with the
database it ran on; :class:`RedisCommands` counts those of one database, sent by clients (not the commands
a Lua script runs inside EVALSHA).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from types import TracebackType
from typing import Any

from redis import Redis

from tests.workers import wait_until


class RedisCommands:
    """``with RedisCommands(redis) as sent: ...``; then ``sent["EVALSHA"]``: how many EVALSHA the block
    sent to ``redis``'s database. ``sent.reset()`` starts counting again from zero."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.db = int(redis.connection_pool.connection_kwargs.get("db", 0))
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._markers: set[str] = set()
        self._thread: threading.Thread | None = None
        self._monitor: Any = None
        self._running = False

    def __getitem__(self, command: str) -> int:
        if self._running:
            self._sync()  # what was sent before is counted
        with self._lock:
            return self.counts[command.upper()]

    def reset(self) -> None:
        self._sync()
        with self._lock:
            self.counts.clear()

    def _listen(self) -> None:
        for entry in self._monitor.listen():
            if entry.get("db") != self.db or entry.get("client_type") == "lua":
                continue
            words = entry["command"].split()
            name = words[0].upper() if words else ""
            with self._lock:
                if name == "ECHO" and len(words) > 1 and words[1].startswith("safeupdates-marker-"):
                    self._markers.add(words[1])
                    if words[1].endswith("-stop"):
                        return
                    continue
                self.counts[name] += 1

    def _sync(self, suffix: str = "") -> None:
        """Send a marker and wait until the monitor has seen it: every command sent before is counted."""
        marker = f"safeupdates-marker-{uuid.uuid4().hex}{suffix}"
        self.redis.echo(marker)
        assert wait_until(lambda: marker in self._markers, 10), "MONITOR did not see the marker"

    def __enter__(self) -> RedisCommands:
        self._monitor = self.redis.monitor().__enter__()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()
        self._running = True
        self._sync()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            self._sync("-stop")
            self._running = False
            assert self._thread is not None
            self._thread.join(10)
        finally:
            self._monitor.__exit__(exc_type, exc, traceback)
