"""Settings of the fault scenarios: ``tests.settings``, pointed by environment variables at a scenario's
own servers. ``DATABASE_URL`` and ``REDIS_URL`` as in ``tests.settings``; ``REDIS_SENTINELS``
(``host:port,host:port``) with ``REDIS_MASTER_NAME`` builds ``RQ_QUEUES`` on Redis Sentinel instead.
The relay and retry settings are the library's defaults unless the environment says otherwise."""

from __future__ import annotations

from typing import Any

from safeupdates import conf
from tests.settings import *  # noqa: F403
from tests.settings import RQ_QUEUES as _TEST_QUEUES
from tests.settings import env


def sentinel_queues(sentinels: list[tuple[str, int]], master_name: str) -> dict[str, dict[str, Any]]:
    """``RQ_QUEUES`` with the queues of ``tests.settings`` on the primary that the Sentinels name.

    Short timeouts: a client must give up on a dead primary in about a second and ask the Sentinels
    again, not wait for the kernel's TCP timeouts. ``SOCKET_TIMEOUT`` bounds every command of the web
    process and the relay; RQ raises it for its workers above their blocking dequeue.
    """
    connection = {
        "SENTINELS": sentinels,
        "MASTER_NAME": master_name,
        "DB": 0,
        "SOCKET_TIMEOUT": 5,
        "CONNECTION_KWARGS": {"socket_connect_timeout": 1},
        "SENTINEL_KWARGS": {"socket_timeout": 1, "socket_connect_timeout": 1},
    }
    return {name: {**connection, "DEFAULT_TIMEOUT": queue["DEFAULT_TIMEOUT"]} for name, queue in _TEST_QUEUES.items()}


# Only the database a scenario starts: since Django 6.1 every management command (rqworker,
# safeupdates_relay) runs the model checks against every alias in DATABASES at start, and a scenario's
# own cluster has no database for the tenant alias of tests.settings, so no worker would start.
DATABASES = {"default": DATABASES["default"]}  # noqa: F405

_sentinels = env.list("REDIS_SENTINELS", default=[])
if _sentinels:
    RQ_QUEUES = sentinel_queues(
        [(host, int(port)) for host, port in (address.rsplit(":", 1) for address in _sentinels)],
        env("REDIS_MASTER_NAME", default="mymaster"),
    )
SAFEUPDATES_RELAY_AFTER = env.int("SAFEUPDATES_RELAY_AFTER", default=conf.RELAY_AFTER.default)
SAFEUPDATES_RETRY = env.json("SAFEUPDATES_RETRY", default=conf.RETRY.default)
