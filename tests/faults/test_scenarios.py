"""Issue 15: the guarantees hold through faults of PostgreSQL, Redis and the network, on servers of the
test's own. Each scenario sends a burst of toggles from this process (the web process) to 24 records
served by 3 real workers and the relay, injects its fault mid-burst, and then checks: no wrong field,
no lost request, nothing pending after the relay window, and no request applied twice or after a newer
one (see :func:`tests.faults.harness.verify`). Each prints how long convergence took after the fault."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from tests.faults.harness import (
    RELAY_WINDOW,
    Burst,
    Converged,
    Site,
    database_url,
    join,
    run_in_thread,
    verify,
    wait_for,
)
from tests.servers import FaultProxy
from tests.workers import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.workers]

TOGGLES = 2000
RECORDS = 24
FAULT_AT = 700  # toggles committed before the fault: mid-burst
#: How long the workers may take to apply what was queued when the burst ended, on a busy 2-core machine.
DRAIN = 60


def prepare(site: Site, workers: int = 3) -> list[int]:
    """Records, workers and the relay; returns the records' primary keys once the workers listen."""
    pks = site.profiles(RECORDS)
    if workers:
        site.start_workers(workers)
    site.start_relay()
    assert wait_for(lambda: len(site.workers.rq_states()) == site.workers.alive(), 60), site.logs()
    return pks


def converge(site: Site, burst: Burst, clock: Converged, scenario: str, extra: str = "") -> None:
    """Wait until no request is pending, print the timings and counts, and check the guarantees."""
    clock.burst_end = clock.burst_end or time.monotonic()
    converged = wait_for(lambda: site.non_terminal() == 0, RELAY_WINDOW + DRAIN)
    clock.done_at = time.monotonic()
    outcome = verify(burst)
    print(
        f"\n{scenario}: {clock.summary()}.\n  {len(burst.committed)} toggles committed in {burst.seconds:.1f}s "
        f"({burst.retries} web retries, longest wait {burst.longest_wait:.1f}s){extra}; job errors in workers "
        f"{site.worker_errors()}, {site.workers.restarts} worker(s) restarted by the supervisor; relay enqueued {site.relay_enqueued()} job(s), {site.relay_failed_passes()} "
        f"failed pass(es).\n  {outcome.requests} requests: statuses {outcome.statuses}, attempts "
        f"{outcome.attempts}, {outcome.writes} row writes; wrong fields {outcome.wrong_fields}, lost "
        f"{outcome.lost}, non-terminal {outcome.non_terminal}, double-applied {outcome.double_applied}, applied "
        f"out of order {outcome.applied_out_of_order}"
    )
    assert converged, f"{site.non_terminal()} requests still pending\n{site.logs()}"
    assert outcome.violations() == {}, f"{outcome}\n{site.logs()}"
    assert len(burst.committed) >= TOGGLES


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgresql_restarts_mid_burst(make_site, mode):
    """``pg_ctl restart -m fast`` (connections terminated, clean shutdown) and ``-m immediate`` (a
    crash, recovery at start), 2 s down: the web process retries its failed transactions, the workers'
    jobs fail and are retried, and the relay delivers what could not be enqueued or was abandoned."""
    site = make_site()
    pks = prepare(site)
    burst, clock = Burst(pks, seed=15), Converged()

    def restart() -> None:
        clock.fault()
        site.postgres.restart(mode, down_for=2)
        clock.healed()

    fault: list[threading.Thread] = []
    burst.run(TOGGLES, hooks={FAULT_AT: lambda: fault.append(run_in_thread(restart))})
    clock.burst_end = time.monotonic()
    join(fault[0])
    assert burst.retries > 0, "the restart did not hit the burst"
    converge(site, burst, clock, f"PostgreSQL restart -m {mode}")


def test_worker_connections_terminated_mid_transaction(make_site):
    """``pg_terminate_backend`` of the workers' connections while they are inside their transaction: a
    DBA's kill, a connection pooler's restart. To catch them mid-transaction every time, a helper holds
    row locks on a few records; the jobs of those records lock their requests, block in the guarded
    UPDATE, and are terminated there. Their transactions roll back; RQ retries the jobs."""
    site = make_site()
    pks = prepare(site)
    burst, clock = Burst(pks, seed=16), Converged()
    stop, terminated, rounds = threading.Event(), [], [0]
    url = database_url(site.postgres, application_name="dba")
    waiting_workers = (
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'worker' AND wait_event_type = 'Lock' "
        "AND xact_start IS NOT NULL"
    )

    def terminate() -> None:
        clock.fault()
        with psycopg.connect(url, autocommit=True) as admin, psycopg.connect(url) as locker:
            while not stop.is_set():
                held = [pks[(rounds[0] * 5 + k) % len(pks)] for k in range(5)]
                rounds[0] += 1
                locker.execute("SELECT 1 FROM testapp_profile WHERE id = ANY(%s) FOR UPDATE", [held])
                deadline, pids = time.monotonic() + 1.5, []
                while not pids and time.monotonic() < deadline and not stop.is_set():
                    pids = [pid for (pid,) in admin.execute(waiting_workers).fetchall()]
                    time.sleep(0.01)
                for pid in pids:
                    if admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]:
                        terminated.append(pid)
                locker.rollback()
                time.sleep(0.2)
        clock.healed()

    fault = run_in_thread(terminate)
    try:
        # Paced (one transaction per 4 ms at least): the jobs keep coming while the helper waits for them.
        burst.run(TOGGLES, pace=0.004)
        clock.burst_end = time.monotonic()
    finally:
        stop.set()
        join(fault)
    assert len(terminated) >= 5, f"only {len(terminated)} worker transactions were terminated"
    converge(site, burst, clock, "pg_terminate_backend of workers mid-transaction",
             f"; {len(terminated)} worker transactions terminated in {rounds[0]} rounds")


def test_redis_restarts_without_persistence_mid_burst(make_site):
    """Redis is killed and comes back empty 1 s later: every queued job, the workers' registrations and
    RQ's registries are gone. Commits meanwhile succeed (delivery on commit fails and is logged), the
    workers reconnect by themselves, and the relay delivers every record whose job was lost."""
    site = make_site()
    pks = prepare(site)
    burst, clock = Burst(pks, seed=17), Converged()

    def restart() -> None:
        clock.fault()
        assert site.redis is not None
        site.redis.restart(down_for=1)
        clock.healed()

    fault: list[threading.Thread] = []
    burst.run(TOGGLES, hooks={FAULT_AT: lambda: fault.append(run_in_thread(restart))}, pace=0.004)
    clock.burst_end = time.monotonic()
    join(fault[0])
    converge(site, burst, clock, "Redis restart without persistence")
    assert site.relay_enqueued() > 0, f"the relay delivered nothing: luck, not the relay\n{site.logs()}"


def test_redis_sentinel_failover_mid_burst(make_site):
    """A primary, a replica and 3 Sentinels; django-rq's RQ_QUEUES name the Sentinels. The primary is
    SIGKILLed mid-burst; the Sentinels promote the replica (about 2 s). Clients find the new primary by
    asking the Sentinels again; jobs the replica had not received are delivered by the relay."""
    site = make_site(sentinel=True)
    assert site.failover is not None
    pks = prepare(site)
    burst, clock = Burst(pks, seed=18), Converged()
    replica = ("127.0.0.1", site.failover.replica.port)

    def kill_primary() -> None:
        clock.fault()
        site.failover.kill_primary()
        assert wait_until(lambda: site.failover.primary() == replica, 30), "the Sentinels did not fail over"
        clock.healed()

    fault: list[threading.Thread] = []
    burst.run(TOGGLES, hooks={FAULT_AT: lambda: fault.append(run_in_thread(kill_primary))}, pace=0.004)
    clock.burst_end = time.monotonic()
    join(fault[0])
    converge(site, burst, clock, "Redis Sentinel failover (primary SIGKILLed)")


def test_two_hosts_one_cut_off_mid_job(make_site):
    """Two "hosts": host B (2 workers) reaches PostgreSQL and Redis through fault-injecting proxies, host A
    (1 worker, the relay, the web process) directly. While a job of host B holds its record's row lock,
    the network between host B and both servers is partitioned for 8 s (no connection closed: bytes just
    stop), then healed. PostgreSQL's ``idle_in_transaction_session_timeout`` (3 s here; see
    docs/operations.md) ends host B's transaction on the server, which frees the row for host A; when the
    network is back, host B's job finds its connection gone and RQ retries it."""
    site = make_site()
    assert site.redis is not None
    with psycopg.connect(database_url(site.postgres), autocommit=True) as admin:
        admin.execute("ALTER DATABASE postgres SET idle_in_transaction_session_timeout = '3s'")
    pks = site.profiles(RECORDS)
    db_proxy = FaultProxy("127.0.0.1", site.postgres.port).start()
    redis_proxy = FaultProxy("127.0.0.1", site.redis.port).start()
    site.cleanup.callback(db_proxy.stop)
    site.cleanup.callback(redis_proxy.stop)
    site.start_workers(
        2,
        name="host-b",
        DATABASE_URL=database_url(site.postgres, db_proxy.port, "host-b"),
        REDIS_URL=f"redis://127.0.0.1:{redis_proxy.port}/0",
    )
    site.start_workers(1, name="host-a")
    site.start_relay()
    assert wait_for(lambda: len(site.workers.rq_states()) == 3, 60), site.logs()
    burst, clock = Burst(pks, seed=19), Converged()
    url = database_url(site.postgres, application_name="dba")
    caught: list[int] = []

    def cut() -> None:
        # Hold row locks until a job of host B waits for one inside its transaction: then it is mid-job.
        with psycopg.connect(url, autocommit=True) as admin, psycopg.connect(url) as locker:
            locker.execute("SELECT 1 FROM testapp_profile WHERE id = ANY(%s) FOR UPDATE", [pks])
            assert wait_until(
                lambda: bool(
                    caught.extend(
                        pid for (pid,) in admin.execute(
                            "SELECT pid FROM pg_stat_activity WHERE application_name = 'host-b' "
                            "AND wait_event_type = 'Lock' AND xact_start IS NOT NULL"
                        ).fetchall()
                    ) or caught
                ),
                30,
                interval=0.01,
            ), "no job of host B ever ran"
            clock.fault()
            db_proxy.partition()
            redis_proxy.partition()
            locker.rollback()  # host B's job gets the row lock now, and keeps it while it cannot talk
        time.sleep(8)
        db_proxy.heal()
        redis_proxy.heal()
        clock.healed()

    fault: list[threading.Thread] = []
    burst.run(TOGGLES, hooks={FAULT_AT: lambda: fault.append(run_in_thread(cut))}, pace=0.004)
    clock.burst_end = time.monotonic()
    join(fault[0])
    converge(site, burst, clock, "two hosts, host B partitioned 8 s mid-job",
             f"; {len(set(caught))} host-B job(s) caught mid-transaction")
