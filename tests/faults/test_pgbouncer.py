"""Issue 42: the fault scenarios' guarantees through PgBouncer (tests/pooler.py's topologies): in
transaction mode, Debian's 1.18 without ``max_prepared_statements`` (prepared statements off, as
docs/deployment.md asks) and 1.24 with it (prepared statements on, each client's kept to it by PgBouncer
and prepared again on whichever server connection runs it); in session mode (prepared statements on: a
client keeps its server connection, and loses it, with the statements prepared on it, when PgBouncer
restarts; RECONNECT closes it once the client lets it go). The workers and the relay reach the site's
PostgreSQL through a PgBouncer of the test's own; mid-burst the pooler is paused and resumed, told to
RECONNECT, and restarted. The same accounting as the other scenarios
(:func:`tests.faults.harness.verify`): 0 lost, 0 applied twice, 0 non-terminal."""

from __future__ import annotations

import threading
import time

import pytest

from tests.faults.harness import Burst, Converged, Site, run_in_thread, wait_for
from tests.faults.test_scenarios import FAULT_AT, RECORDS, TOGGLES, converge
from tests.pooler import POOLERS, PgBouncer, ensure_built, ensure_installed

# transaction=True: run alone, this is the first test that starts processes, which tests/conftest.py
# gives every test database; in an atomic block the web process's switch to the site's cluster breaks.
pytestmark = [pytest.mark.faults, pytest.mark.workers, pytest.mark.django_db(transaction=True)]


def pooled(site: Site, pooler: PgBouncer, topology: str, application_name: str) -> dict[str, str]:
    """The environment of a worker or the relay that reaches the site through ``pooler`` (of ``topology``)."""
    return {
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{pooler.port}/postgres?application_name={application_name}",
        "SAFEUPDATES_TEST_TOPOLOGY": topology,
        "SAFEUPDATES_TEST_POOLER_PORT": str(pooler.port),
    }


@pytest.mark.parametrize("topology", list(POOLERS))
def test_pgbouncer_paused_reconnected_and_restarted_mid_burst(make_site, topology):
    """PAUSE for 2 s then RESUME, RECONNECT, and a restart of pgbouncer (2 s down) while three workers
    apply and the relay runs through it: jobs cut off are retried or delivered again by the relay, and
    every request ends applied or stale, once."""
    pool_mode, prepared = POOLERS[topology]
    try:
        ensure_built() if prepared else ensure_installed()
    except (RuntimeError, OSError) as exc:
        pytest.skip(str(exc))
    site = make_site()
    pooler = PgBouncer(pool_mode, server_port=site.postgres.port, pool_size=10, max_prepared_statements=prepared)
    site.cleanup.callback(pooler.destroy)
    pooler.start()
    pks = site.profiles(RECORDS)
    site.start_workers(3, **pooled(site, pooler, topology, "worker"))
    site.start_relay(**pooled(site, pooler, topology, "relay"))
    assert wait_for(lambda: site.workers.registered() == site.workers.alive(), 60), site.logs()
    burst, clock = Burst(pks, seed=42), Converged()

    def faults() -> None:
        clock.fault()
        pooler.admin("PAUSE")
        time.sleep(2)
        pooler.admin("RESUME")
        time.sleep(1)
        pooler.admin("RECONNECT")
        time.sleep(1)
        pooler.stop()
        time.sleep(2)
        pooler.start()
        clock.healed()

    fault: list[threading.Thread] = []
    burst.run(TOGGLES, hooks={FAULT_AT: lambda: fault.append(run_in_thread(faults))}, pace=0.004)
    clock.burst_end = time.monotonic()
    converge(site, burst, clock, fault[0], f"PgBouncer ({topology}) PAUSE/RESUME, RECONNECT, restart")
