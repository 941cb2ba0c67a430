"""Issue 55: the guarantees through a PostgreSQL failover, on a Patroni cluster of the test's own
(:class:`tests.patroni.PatroniCluster`: etcd and two PostgreSQL nodes on loopback, Debian's packages,
installed if missing). Every process of the site (this one as the web process, 3 supervised workers, the
relay) reaches PostgreSQL through the multi-host DSN of docs/deployment.md, both nodes with
``target_session_attrs=read-write``.

During a paced burst of toggles on a few records: a planned switchover (``POST /switchover``), then, once
the old primary has rejoined as a standby, an unplanned failover: the new primary's walsender is stopped
(SIGSTOP) for 2 s, so that it has WAL its standby has not received, then every process of that
PostgreSQL is SIGKILLed; Patroni promotes the standby and the killed node rejoins by itself (pg_rewind).
Then the burst goes on a little on the healed cluster, and :func:`tests.faults.harness.verify` counts.

- Synchronous replication (``synchronous_mode`` + ``synchronous_mode_strict``), on RQ, Celery (RabbitMQ)
  and Django tasks (django-tasks-db's ``db_worker``): 0 wrong, 0 non-terminal, 0 lost, 0 applied twice.
  A commit caught waiting for its standby when the primary died is ambiguous to the web process: it is
  retried with the same request ids, which the request log resolves.
- Asynchronous replication, on RQ: acknowledged requests whose WAL had not reached the standby vanish with
  their data. That is what asynchronous replication is; the test counts and prints them (the figures of
  docs/deployment.md) and asserts the rest: nothing wrong, nothing left pending, nothing applied twice.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from safeupdates import status
from tests.faults.harness import Burst, Converged, Site, join, run_in_thread, verify, wait_for
from tests.patroni import PatroniCluster, PatroniNode, missing
from tests.servers import missing_servers

# Transactional: the test process's connection moves to the cluster (Site), outside any test transaction.
pytestmark = [pytest.mark.faults, pytest.mark.workers, pytest.mark.django_db(transaction=True)]

RECORDS = 12
#: The burst: one transaction (1 to 3 toggles) per PACE seconds at most, the faults after FAULT_AT
#: toggles; the burst goes on while they last, then AFTER more toggles on the healed cluster.
TOGGLES, FAULT_AT, AFTER, PACE = 300, 100, 100, 0.05
#: How long the new primary's walsender is stopped before the primary is killed.
WALSENDER_STOPPED = 2.0
#: How long to wait at most for every request to be terminal (a liveness bound, not a measurement).
PATIENCE = 120


@pytest.fixture
def failover_site(tmp_path: Path, django_db_blocker: Any) -> Iterator[Callable[..., Site]]:
    """Build a :class:`~tests.faults.harness.Site` on a Patroni cluster of its own; torn down after the test."""
    if connections["default"].vendor != "postgresql":
        pytest.skip("the fault scenarios run in the PostgreSQL pass (DATABASE_URL is not PostgreSQL)")
    why = missing_servers() or missing()
    if why:
        pytest.skip(why)
    sites: list[Site] = []

    def make(*, synchronous: bool, delivery: str) -> Site:
        if delivery == "celery":
            from tests.celery_harness import rabbitmq_missing

            if why := rabbitmq_missing():
                pytest.skip(why)
        site = Site(tmp_path / "site", delivery=delivery, postgres=PatroniCluster(synchronous=synchronous))
        sites.append(site)
        return site.start(django_db_blocker)

    try:
        yield make
    finally:
        for site in sites:
            site.close()


class Faults:
    """The switchover, the failover and the rejoins, in a thread of their own while the burst goes on;
    what happened, for the report."""

    def __init__(self, site: Site, cluster: PatroniCluster) -> None:
        self.site, self.cluster = site, cluster
        self.events: list[str] = []
        self.clock = Converged()
        self.done = threading.Event()

    def _note(self, began: float, what: str) -> None:
        self.events.append(f"{what} {time.monotonic() - began:.1f}s")

    def run(self) -> None:
        try:
            self.clock.fault()
            began = time.monotonic()
            old = self.cluster.leader()
            new = self.cluster.switchover()
            self._note(began, f"switchover {old and old.name}->{new.name} in")
            began = time.monotonic()
            assert wait_until_healthy(self.cluster), f"{old and old.name} did not rejoin\n{self.cluster.logs()}"
            self._note(began, "old primary rejoined in")
            time.sleep(1)  # the burst commits on the new primary for a while
            walsenders = new.walsender_pids()
            assert walsenders, f"no walsender on {new.name}\n{self.cluster.members()}"
            for pid in walsenders:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(WALSENDER_STOPPED)
            began = time.monotonic()
            killed = new.kill_postgres()
            promoted = wait_for_leader(self.cluster, other_than=new)
            self._note(
                began,
                f"{len(walsenders)} walsender stopped {WALSENDER_STOPPED:g}s, {killed} processes of "
                f"{new.name} SIGKILLed, {promoted.name} accepted writes after",
            )
            began = time.monotonic()
            assert wait_until_healthy(self.cluster), f"{new.name} did not rejoin\n{self.cluster.logs()}"
            self._note(began, f"{new.name} rejoined in")
            self.clock.healed()
        finally:
            self.done.set()


def wait_until_healthy(cluster: PatroniCluster, timeout: float = 90) -> bool:
    """Wait until the cluster is whole again: a leader, and its standby streaming from it."""
    return wait_for(cluster.healthy, timeout)


def wait_for_leader(cluster: PatroniCluster, *, other_than: PatroniNode, timeout: float = 60) -> PatroniNode:
    """The node that took over from ``other_than``, once it accepts writes."""
    found: list[PatroniNode] = []

    def promoted() -> bool:
        leader = cluster.leader()
        if leader is not None and leader is not other_than:
            found.append(leader)
            return True
        return False

    assert wait_for(promoted, timeout), f"no other node took over\n{cluster.members()}\n{cluster.logs()}"
    return found[0]


@pytest.mark.parametrize(
    ("synchronous", "delivery"),
    [
        pytest.param(True, "rq", id="synchronous-rq"),
        pytest.param(True, "celery", id="synchronous-celery"),
        pytest.param(True, "tasks-db", id="synchronous-tasks-db"),
        pytest.param(False, "rq", id="asynchronous-rq"),
    ],
)
def test_switchover_failover_and_rejoin_mid_burst(failover_site, synchronous, delivery):
    site = failover_site(synchronous=synchronous, delivery=delivery)
    cluster = site.postgres
    assert isinstance(cluster, PatroniCluster)
    # What safeupdates_status says of this cluster: nothing in synchronous mode; a warning in asynchronous.
    replication = status.replication()
    assert replication is not None and replication.standbys == 1
    if synchronous:
        assert (replication.synchronous, replication.warning()) == (1, ""), replication
    else:
        assert "replicates asynchronously" in replication.warning(), replication
    pks = site.profiles(RECORDS)
    site.start_workers(3)
    site.start_relay()
    assert wait_for(lambda: site.workers.registered() == 3, 90), site.logs()
    burst = Burst(pks, seed=55)
    faults = Faults(site, cluster)
    thread: list[threading.Thread] = []
    burst.run(TOGGLES, hooks={FAULT_AT: lambda: thread.append(run_in_thread(faults.run))}, pace=PACE)
    while not faults.done.is_set():  # the burst goes on while the faults last
        burst.run(30, pace=PACE)
    join(thread[0], 120)
    burst.run(AFTER, pace=PACE)
    faults.clock.burst_end = time.monotonic()
    converged = wait_for(lambda: site.non_terminal() == 0, PATIENCE)
    faults.clock.done_at = time.monotonic()
    outcome = verify(burst)
    mode = "synchronous" if synchronous else "asynchronous"
    print(
        f"\nfailover on {delivery}, {mode} replication: {'; '.join(faults.events)}; {faults.clock.summary()}."
        f"\n  {len(burst.committed)} toggles committed ({burst.retries} web retries {dict(burst.errors)}, longest "
        f"wait {burst.longest_wait:.1f}s); exception lines in worker logs {site.worker_errors()}, "
        f"{site.workers.restarts} worker(s) restarted by the supervisor; relay enqueued {site.relay_enqueued()} "
        f"job(s), {site.relay_failed_passes()} failed pass(es)."
        f"\n  {outcome.requests} requests: statuses {outcome.statuses}, attempts {outcome.attempts}, "
        f"{outcome.writes} row writes; wrong fields {outcome.wrong_fields}, lost {outcome.lost}, non-terminal "
        f"{outcome.non_terminal}, applied twice {outcome.double_applied}, applied out of order "
        f"{outcome.applied_out_of_order}"
    )
    assert converged, f"{site.non_terminal()} requests still pending\n{site.logs()}"
    assert burst.retries > 0, "the failover did not hit the burst"
    violations = outcome.violations()
    if not synchronous:
        # Acknowledged, then gone with the primary: asynchronous replication's loss, counted above.
        violations.pop("lost", None)
    assert violations == {}, f"{outcome}\n{site.logs()}"
    # Every worker works on (an exited one was started again by the supervisor).
    assert wait_for(lambda: site.workers.alive() == 3, 30), site.logs()
