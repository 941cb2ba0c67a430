"""Issue 55: ``safeupdates_status`` (its text, its JSON, the admin's status page) warns when the primary
replicates asynchronously, or has no synchronous standby connected: an acknowledged request can be lost in
a failover, or commits wait. On a primary of the test's own and its real streaming replica
(:class:`tests.servers.OwnPostgresReplica`); a single node is in tests/test_status.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from io import StringIO
from typing import Any

import environ
import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connections, transaction
from django.urls import reverse

from safeupdates import status
from tests.servers import OwnPostgres, OwnPostgresReplica, _accepts, missing_servers
from tests.workers import ROOT, still_usable, subprocess_env, wait_until

pytestmark = [pytest.mark.faults]


@pytest.fixture(scope="module")
def primary() -> Iterator[tuple[OwnPostgres, OwnPostgresReplica]]:
    """A primary of the test's own, migrated, with one streaming replica (asynchronous: initdb's default)."""
    if connections["default"].vendor != "postgresql":
        pytest.skip("the replica scenarios run in the PostgreSQL pass (DATABASE_URL is not PostgreSQL)")
    if why := missing_servers():
        pytest.skip(why)
    server = OwnPostgres()
    replica = OwnPostgresReplica(server)
    try:
        server.init()
        migrate = [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"]
        subprocess.run(migrate, env=subprocess_env(DATABASE_URL=server.url), cwd=ROOT, check=True, timeout=180)
        replica.init()
        yield server, replica
    finally:
        replica.destroy()
        server.destroy()


def configure(server: OwnPostgres, **settings: str) -> None:
    """``ALTER SYSTEM SET`` each setting on ``server`` (``RESET`` for ``""``), then reload."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        for name, value in settings.items():
            if value:
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")  # type: ignore[arg-type]
            else:
                conn.execute(f"ALTER SYSTEM RESET {name}")  # type: ignore[arg-type]
        conn.execute("SELECT pg_reload_conf()")


def sync_states(server: OwnPostgres) -> list[str]:
    with psycopg.connect(server.url, autocommit=True) as conn:
        return [row[0] for row in conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall()]


@pytest.fixture
def on_primary(primary: tuple[OwnPostgres, OwnPostgresReplica], django_db_blocker: Any, redis: Any) -> Iterator[Any]:
    """This process's ``default`` database is the primary (asynchronous replication, as initdb leaves it);
    yields ``(primary, replica)``; the settings a test changed are reset afterwards."""
    server, replica = primary
    default = connections["default"]
    saved = default.settings_dict
    default.close()
    default.settings_dict = {**saved, **environ.Env.db_url_config(server.url), "CONN_MAX_AGE": 0}
    ContentType.objects.clear_cache()
    try:
        with django_db_blocker.unblock():
            yield server, replica
    finally:
        configure(server, synchronous_standby_names="", synchronous_commit="")
        if not _accepts(replica.port):  # a test stopped it
            replica.start()
        default.close()
        default.settings_dict = saved
        ContentType.objects.clear_cache()


def command(*args: str) -> str:
    """The command's output; it exits 1 (SystemExit) when unhealthy, which a warning never makes it."""
    out = StringIO()
    call_command("safeupdates_status", *args, stdout=out)
    return out.getvalue()


def test_asynchronous_replication_is_a_warning_in_the_command_its_json_and_the_admin(on_primary, client):
    server, _ = on_primary
    admin, _ = get_user_model().objects.get_or_create(username="admin", is_staff=True, is_superuser=True)
    client.force_login(admin)
    assert wait_until(lambda: sync_states(server) == ["async"], 10)
    found = status.replication()
    assert found == status.Replication(
        standbys=1, synchronous=0, hidden=0, synchronous_standby_names="", synchronous_commit="on"
    )
    warning = found.warning()
    assert "replicates asynchronously to its 1 standby(s)" in warning
    assert "lost with their data" in warning
    text = command()
    assert f"warning: {warning}" in text
    assert "Replication: 1 standby(s), 0 synchronous" in text
    assert "healthy" in text.splitlines()[0] and "UNHEALTHY" not in text  # a warning, not a problem
    data = json.loads(command("--json"))
    assert warning in data["warnings"]
    assert data["healthy"] is True
    assert data["replication"]["standbys"] == 1 and data["replication"]["synchronous"] == 0
    page = client.get(reverse("admin:safeupdates_processedrequest_status")).content.decode()
    assert "replicates asynchronously" in page
    assert 'id="safeupdates-replication"' in page


def test_a_synchronous_standby_is_no_warning(on_primary):
    server, _ = on_primary
    configure(server, synchronous_standby_names="*")
    assert wait_until(lambda: sync_states(server) == ["sync"], 10)
    found = status.replication()
    assert found is not None
    assert (found.standbys, found.synchronous, found.synchronous_standby_names) == (1, 1, "*")
    assert found.warning() == ""
    assert not any("standby" in warning for warning in status.collect().warnings())
    assert "Replication: 1 standby(s), 1 synchronous" in command()


def test_synchronous_commit_local_does_not_wait_for_the_standby(on_primary):
    server, _ = on_primary
    configure(server, synchronous_standby_names="*", synchronous_commit="local")
    assert wait_until(lambda: sync_states(server) == ["sync"], 10)
    found = status.replication()
    assert found is not None and found.synchronous_commit == "local"
    assert "synchronous_commit is 'local'" in found.warning()


def test_a_synchronous_standby_that_is_gone_is_a_warning(on_primary):
    server, replica = on_primary
    configure(server, synchronous_standby_names="*")
    replica.stop("fast")
    assert wait_until(lambda: sync_states(server) == [], 10)
    found = status.replication()
    assert found is not None and (found.standbys, found.synchronous) == (0, 0)
    assert "no synchronous standby is connected" in found.warning()
    assert found.warning() in status.collect().warnings()


def test_a_user_who_may_not_read_the_replication_views_gets_no_replication_and_no_error(on_primary):
    """A hardened server where PUBLIC may not read pg_stat_replication: the status says nothing of
    replication, instead of failing; inside a transaction (ATOMIC_REQUESTS, the admin's page), the
    transaction goes on."""
    server, _ = on_primary
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS hardened")
        conn.execute("CREATE ROLE hardened LOGIN")
        conn.execute("REVOKE SELECT ON pg_stat_replication FROM PUBLIC")
    default = connections["default"]
    default.close()
    default.settings_dict = {**default.settings_dict, "USER": "hardened"}
    try:
        with transaction.atomic():
            assert status.replication() is None
            still_usable()
    finally:
        default.close()
        default.settings_dict = {**default.settings_dict, "USER": "postgres"}
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("GRANT SELECT ON pg_stat_replication TO PUBLIC")
            conn.execute("DROP ROLE hardened")
