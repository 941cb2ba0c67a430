"""Check that Redis answers at ``REDIS_URL``, before the demo needs it: ``python -m demo_project.check_redis``.

Exits 0 if it does; otherwise prints one message saying how to start Redis and exits 1. It does not load
Django, so that it answers at once.
"""

from __future__ import annotations

import os
import sys

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def check(url: str) -> str | None:
    """Return None if Redis at ``url`` answers PING within two seconds, else what went wrong."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        client.ping()
    except (redis.RedisError, ValueError, OSError) as exc:
        return str(exc) or type(exc).__name__
    return None


def main() -> int:
    url = os.environ.get("REDIS_URL") or DEFAULT_URL
    problem = check(url)
    if problem is None:
        return 0
    print(
        f"Redis is not reachable at {url} ({problem}). The demo's jobs go through Redis: start it with "
        "`redis-server --daemonize yes` (or `docker run -d -p 6379:6379 redis`), or point REDIS_URL at "
        "a running Redis, then run `make demo` again.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
