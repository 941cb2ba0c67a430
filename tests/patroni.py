"""A highly available PostgreSQL of the test's own: one ``etcd`` and two PostgreSQL nodes run by Patroni,
every process on free loopback ports, in a temporary directory, stopped by pid (the shared PostgreSQL on
5432 is never touched).

Debian's ``patroni`` and ``etcd-server`` packages (Patroni 3.0, etcd 3.4 on Debian 12) are installed when
they are missing (``apt-get install -y patroni etcd-server``, as root; :func:`ensure_installed`), as
:mod:`tests.pooler` installs PgBouncer. They start no service of their own where there is no systemd; here
``etcd`` and ``patroni NODE.yml`` are started as subprocesses, as the ``postgres`` user when the tests run
as root (initdb refuses root), with the machine's PostgreSQL programs (:func:`tests.servers.find_initdb`).

:class:`PatroniCluster` bootstraps the two nodes in synchronous mode (``synchronous_mode`` and
``synchronous_mode_strict``: a commit returns once the standby has it) or asynchronous mode (a commit
returns once the primary has it), tuned to fail over fast: ``ttl`` 20 (Patroni's minimum), ``loop_wait`` 1,
``retry_timeout`` 5, ``primary_start_timeout`` 0 (a crashed primary is not restarted in place: the standby
is promoted at once) and ``use_pg_rewind`` with ``wal_log_hints`` (the old primary rejoins by itself). Its
:attr:`~PatroniCluster.url` names both nodes with ``target_session_attrs=read-write``, the multi-host DSN
of docs/deployment.md: a client reaches whichever node is the primary.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.servers import find_initdb, free_port
from tests.workers import wait_until

__all__ = ["Etcd", "PatroniCluster", "PatroniNode", "ensure_installed", "missing"]

#: Debian's packages, and the programs of theirs that the cluster runs.
PACKAGES = ("patroni", "etcd-server")
_PROGRAMS = ("patroni", "etcd")


def _program(name: str) -> str | None:
    """The path of program ``name`` (on PATH, or where Debian puts it), or None."""
    return shutil.which(name) or next(
        (path for path in (f"/usr/bin/{name}", f"/usr/local/bin/{name}") if os.access(path, os.X_OK)), None
    )


def missing() -> str | None:
    """Why a Patroni cluster cannot be started here (and cannot be installed), or None."""
    if find_initdb() is None:
        return "PostgreSQL's server programs are not installed (Debian: apt-get install postgresql)"
    if all(_program(name) for name in _PROGRAMS) or (os.geteuid() == 0 and shutil.which("apt-get")):
        return None
    return "patroni and etcd are not installed: apt-get install -y patroni etcd-server (as root)"


def ensure_installed() -> tuple[str, str]:
    """The paths of ``patroni`` and ``etcd``, installing Debian's packages first if either is missing (as
    root). The packages' own services are not used (nor started where there is no systemd)."""
    if all(_program(name) for name in _PROGRAMS):
        return _program("patroni") or "", _program("etcd") or ""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("patroni and etcd are not installed: apt-get install -y patroni etcd-server (as root)")
    # One install at a time: both xdist workers may get here at once (the second finds them installed).
    with open(Path(tempfile.gettempdir()) / "safeupdates-patroni-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(_program(name) for name in _PROGRAMS):
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
            if subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=False).returncode != 0:
                subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
                subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=True)
    patroni, etcd = _program("patroni"), _program("etcd")
    if patroni is None or etcd is None:
        raise RuntimeError("apt-get installed patroni and etcd-server, but their programs are not on PATH")
    return patroni, etcd


def _run_as() -> dict[str, Any]:
    """``Popen`` arguments that run a server as ``postgres`` when we are root (its pid is then the
    server's own, not a wrapper's: killing it kills the server)."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


def _stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Signal ``proc`` (ours), wait for it, SIGKILL it if it is still there after ``timeout`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Etcd:
    """One ``etcd`` member with the v2 API on (Patroni 3.0's ``etcd:`` client speaks it) on free loopback
    ports; ready once ``GET /health`` answers."""

    def __init__(self, root: Path, binary: str) -> None:
        self.binary = binary
        self.dir = root / "etcd"
        self.port, self.peer_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Etcd:
        self.dir.mkdir()
        _chown(self.dir)
        client, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer_port}"
        args = [self.binary, "--name", "e0", "--data-dir", str(self.dir / "data"), "--enable-v2=true"]
        args += ["--listen-client-urls", client, "--advertise-client-urls", client]
        args += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
        args += ["--initial-cluster", f"e0={peer}", "--initial-cluster-state", "new"]
        with open(self.dir / "etcd.log", "wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **_run_as()
            )
        if not wait_until(self._healthy, 30, interval=0.1):
            raise RuntimeError(f"etcd did not start:\n{(self.dir / 'etcd.log').read_text(errors='replace')[-3000:]}")
        return self

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"etcd exited:\n{(self.dir / 'etcd.log').read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None


class PatroniNode:
    """One ``patroni NODE.yml`` process and the PostgreSQL it runs (:attr:`port`), REST API on
    :attr:`api_port`."""

    def __init__(self, cluster: PatroniCluster, index: int) -> None:
        self.cluster = cluster
        self.name = f"node{index}"
        self.port, self.api_port = free_port(), free_port()
        self.dir = cluster.dir / self.name
        self.config = self.dir / "patroni.yml"
        self.log = self.dir / "patroni.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def write_config(self) -> None:
        self.dir.mkdir(exist_ok=True)
        _chown(self.dir)
        cluster = self.cluster
        # JSON is YAML: the configuration is written as JSON, without a YAML library.
        config = {
            "scope": cluster.scope,
            "namespace": "/safeupdates/",
            "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{self.api_port}", "connect_address": f"127.0.0.1:{self.api_port}"},
            "etcd": {"host": f"127.0.0.1:{cluster.etcd.port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": 20,
                    "loop_wait": 1,
                    "retry_timeout": 5,
                    "primary_start_timeout": 0,
                    "maximum_lag_on_failover": 1024 * 1024 * 1024,
                    "synchronous_mode": cluster.synchronous,
                    "synchronous_mode_strict": cluster.synchronous,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_log_hints": "on",
                            "max_connections": 100,
                            "max_wal_senders": 5,
                            "max_replication_slots": 5,
                            "wal_keep_size": "128MB",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}, "no-sync"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}",
                "connect_address": f"127.0.0.1:{self.port}",
                "data_dir": str(self.data_dir),
                "bin_dir": str(Path(cluster.initdb).resolve().parent),
                "pgpass": str(self.dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
                "parameters": {
                    "unix_socket_directories": str(self.dir),
                    # Only processes die in these tests, never the machine: the page cache keeps what was
                    # written, and a shared machine is spared the fsyncs.
                    "fsync": "off",
                },
            },
        }
        self.config.write_text(json.dumps(config, indent=2))
        _chown(self.config)

    def start(self) -> PatroniNode:
        """Start Patroni (which starts, bootstraps or rejoins its PostgreSQL)."""
        if not self.config.exists():
            self.write_config()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.cluster.patroni, str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.dir,
                **_run_as(),
            )
        return self

    def api(self, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """Ask this node's REST API; ``(status, JSON or text)``, ``(0, None)`` if it does not answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.api_port}{path}", data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode()
        except OSError:
            return 0, None
        with contextlib.suppress(ValueError):
            return status, json.loads(text)
        return status, text

    def writable(self) -> bool:
        """Whether this node's PostgreSQL accepts writes now (it runs, and is out of recovery)."""
        import psycopg

        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
                row = conn.execute("SELECT NOT pg_is_in_recovery()").fetchone()
        except psycopg.Error:
            return False
        return bool(row and row[0])

    def streaming(self) -> int:
        """How many standbys stream from this node now (``pg_stat_replication``); 0 if it does not answer."""
        import psycopg

        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
                row = conn.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'").fetchone()
        except psycopg.Error:
            return 0
        return int(row[0]) if row else 0

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        return None

    def postgres_pids(self) -> list[int]:
        """The postmaster of this node and its children (backends, walsenders, checkpointer ...)."""
        from demo_project.processes import descendants

        postmaster = self.postmaster_pid()
        if postmaster is None or not Path(f"/proc/{postmaster}").exists():
            return []
        return [postmaster, *descendants(postmaster)]

    def kill_postgres(self) -> int:
        """SIGKILL this node's PostgreSQL, every process of it at once (a crash; Patroni lives on and, with
        ``primary_start_timeout`` 0, hands the leadership over instead of restarting it). Returns how
        many processes were killed."""
        pids = self.postgres_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def walsender_pids(self) -> list[int]:
        """The walsender processes of this node's PostgreSQL (from /proc: their command line says so)."""
        found = []
        for pid in self.postgres_pids():
            with contextlib.suppress(OSError):
                if b"walsender" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
        return found

    def stop(self) -> None:
        """SIGKILL Patroni, then its PostgreSQL (every process of it): the node's data is thrown away
        with the cluster's directory, so nothing needs a clean shutdown (a clean one takes seconds)."""
        _stop(self.proc, signal.SIGKILL)
        self.proc = None
        self.kill_postgres()


class PatroniCluster:
    """etcd and two Patroni nodes on loopback; see the module's docstring. ``synchronous``: synchronous
    replication (``synchronous_mode`` + ``synchronous_mode_strict``), else asynchronous."""

    def __init__(self, *, synchronous: bool = True, nodes: int = 2) -> None:
        self.patroni, etcd = ensure_installed()
        initdb = find_initdb()
        assert initdb is not None
        self.initdb = initdb
        self.synchronous = synchronous
        self.scope = f"su{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self.dir = Path(tempfile.mkdtemp(prefix="safeupdates-patroni-"))
        _chown(self.dir)
        self.etcd = Etcd(self.dir, etcd)
        self.nodes = [PatroniNode(self, index) for index in range(nodes)]

    @property
    def url(self) -> str:
        """Every node in one URL, ``target_session_attrs=read-write``: the client tries each host in turn
        and keeps the one that accepts writes."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgres://postgres@{hosts}/postgres?target_session_attrs=read-write&connect_timeout=2"

    def start(self, timeout: float = 120) -> PatroniCluster:
        """Start etcd and the nodes; return once one node leads and every other one streams from it (in
        synchronous mode: is its synchronous standby)."""
        self.etcd.start()
        self.nodes[0].start()
        if not wait_until(lambda: self.leader() is not None, timeout, interval=0.5):
            raise RuntimeError(f"no Patroni node became the leader\n{self.logs()}")
        for node in self.nodes[1:]:
            node.start()
        if not wait_until(self.healthy, timeout, interval=0.5):
            raise RuntimeError(f"the standby did not join\n{self.members()}\n{self.logs()}")
        return self

    def init(self) -> PatroniCluster:
        """:meth:`start` (what a :class:`~tests.faults.harness.Site` calls on its PostgreSQL)."""
        return self.start()

    def members(self) -> list[dict[str, Any]]:
        """``GET /cluster`` of the first node that answers: name, role (``leader``, ``sync_standby``,
        ``replica``), state, lag of each member."""
        for node in self.nodes:
            status, body = node.api("/cluster")
            if status == 200 and isinstance(body, dict):
                return list(body.get("members", []))
        return []

    def leader(self) -> PatroniNode | None:
        """The node that leads (holds the leader key) and accepts writes, or None."""
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                node = next(node for node in self.nodes if node.name == member["name"])
                return node if node.writable() else None
        return None

    def healthy(self) -> bool:
        """One leader, every other member its standby (in synchronous mode, its sync standby), and the
        leader's ``pg_stat_replication`` showing each of them streaming."""
        members = self.members()
        roles = sorted(member.get("role", "") for member in members)
        want = "sync_standby" if self.synchronous else "replica"
        if len(members) != len(self.nodes) or roles != sorted(["leader", *[want] * (len(self.nodes) - 1)]):
            return False
        leader = self.leader()
        return leader is not None and leader.streaming() == len(self.nodes) - 1

    def switchover(self, timeout: float = 60) -> PatroniNode:
        """A planned switchover (``POST /switchover``) to the other node; returns the new leader once it
        leads. Patroni answers 412 until the candidate can take over: asked again meanwhile."""
        old = self.leader()
        assert old is not None, "no leader to switch over from"
        candidate = next(node for node in self.nodes if node is not old)
        answers: list[tuple[int, Any]] = []

        def ask() -> bool:
            answers.append(old.api("/switchover", "POST", {"leader": old.name, "candidate": candidate.name}))
            return answers[-1][0] == 200

        if not wait_until(ask, timeout, interval=0.5):
            raise RuntimeError(f"switchover refused: {answers[-3:]}\n{self.members()}")
        if not wait_until(lambda: self.leader() is candidate, timeout, interval=0.2):
            raise RuntimeError(f"{candidate.name} did not take over\n{self.members()}\n{self.logs()}")
        return candidate

    def logs(self) -> str:
        parts = []
        for node in self.nodes:
            for path in (node.log, node.dir / "patroni.log"):
                if path.exists():
                    parts.append(f"--- {node.name} {path.name}:\n{path.read_text(errors='replace')[-3000:]}")
                    break
        return "\n".join(parts)

    def destroy(self) -> None:
        for node in self.nodes:
            node.stop()
        self.etcd.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PatroniCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()
