"""Servers a test may stop and start: its own ``redis-server`` (alone, or a primary with a replica and
Sentinels), its own PostgreSQL cluster (alone, or a primary with a streaming replica), and TCP proxies
that cut processes off a server (as a restart would, or as a network partition would). The shared
servers are never stopped."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.workers import wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


class OwnRedis:
    """A ``redis-server`` of the test's own, without persistence: a restart loses every key.

    ``extra`` are more command-line options (``--replicaof 127.0.0.1 PORT`` for a replica). Its working
    directory (a replica's full sync may write there) is a temporary one, removed by :meth:`destroy`.
    """

    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.extra = extra
        self.dir = Path(tempfile.mkdtemp(prefix="safeupdates-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OwnRedis:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.dir), *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_until(lambda: _accepts(self.port), 10), "redis-server did not start"
        return self

    def stop(self) -> None:
        """SIGKILL: no shutdown save, no goodbye to clients or replicas (a crash, an OOM kill)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self, down_for: float = 0.0) -> OwnRedis:
        """Kill the server and start it again, empty, on the same port after ``down_for`` seconds."""
        self.stop()
        time.sleep(down_for)
        return self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class OwnSentinel(OwnRedis):
    """A Redis Sentinel (``redis-server CONFIG --sentinel``) watching primary ``master_name``.

    Sentinel rewrites its configuration file as it learns the replicas and the other Sentinels, so the
    file lives in the Sentinel's own temporary directory.
    """

    def __init__(self, primary_port: int, *, master_name: str = "mymaster", quorum: int = 1) -> None:
        super().__init__()
        self.master_name = master_name
        self.config = self.dir / "sentinel.conf"
        self.config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"sentinel monitor {master_name} 127.0.0.1 {primary_port} {quorum}\n"
            # Declare the primary down after 1 s without answers, and retry a stuck failover soon.
            f"sentinel down-after-milliseconds {master_name} 1000\n"
            f"sentinel failover-timeout {master_name} 5000\n"
            f"sentinel parallel-syncs {master_name} 1\n"
        )

    def start(self) -> OwnSentinel:
        args = ["redis-server", str(self.config), "--sentinel"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_until(lambda: _accepts(self.port), 10), "redis-server --sentinel did not start"
        return self


class OwnRedisFailover:
    """A primary, one replica and ``sentinels`` Sentinels (a majority is the quorum), all of the test's own.

    :meth:`kill_primary` SIGKILLs the primary; the Sentinels then promote the replica (about 2 s with the
    settings of :class:`OwnSentinel`). :meth:`primary` asks a Sentinel where the primary is now.
    """

    def __init__(self, sentinels: int = 3, master_name: str = "mymaster") -> None:
        self.master_name = master_name
        self.primary_server = OwnRedis()
        self.replica = OwnRedis("--replicaof", "127.0.0.1", str(self.primary_server.port))
        quorum = sentinels // 2 + 1
        self.sentinels = [
            OwnSentinel(self.primary_server.port, master_name=master_name, quorum=quorum) for _ in range(sentinels)
        ]

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", sentinel.port) for sentinel in self.sentinels]

    def start(self) -> OwnRedisFailover:
        self.primary_server.start()
        self.replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        assert wait_until(self._ready, 30), "the replica did not sync, or the Sentinels did not find it"
        return self

    def _ready(self) -> bool:
        from redis import Redis
        from redis.exceptions import RedisError

        try:
            with Redis(port=self.replica.port, socket_timeout=1) as replica:
                if replica.info("replication").get("master_link_status") != "up":
                    return False
            for sentinel in self.sentinels:
                with Redis(port=sentinel.port, socket_timeout=1) as conn:
                    info = conn.sentinel_master(self.master_name)
                    # Every Sentinel must know the replica and the others, or it cannot fail over.
                    if info["num-slaves"] < 1 or info["num-other-sentinels"] < len(self.sentinels) - 1:
                        return False
        except RedisError:
            return False
        return True

    def primary(self) -> tuple[str, int] | None:
        """Where the Sentinels say the primary is, or None if none of them answers."""
        from redis import Redis
        from redis.exceptions import RedisError

        for sentinel in self.sentinels:
            with contextlib.suppress(RedisError), Redis(port=sentinel.port, socket_timeout=1) as conn:
                host, port = conn.sentinel_get_master_addr_by_name(self.master_name)
                return host.decode() if isinstance(host, bytes) else str(host), int(port)
        return None

    def kill_primary(self) -> None:
        self.primary_server.stop()

    def destroy(self) -> None:
        for server in [*self.sentinels, self.replica, self.primary_server]:
            server.destroy()


#: Where Debian and Ubuntu put PostgreSQL's server programs, which are not on PATH there.
PG_BIN_DIRS = "/usr/lib/postgresql/*/bin"


def find_initdb() -> str | None:
    """PostgreSQL's ``initdb``: on PATH, else in :data:`PG_BIN_DIRS` (the newest version); None if neither."""
    found = shutil.which("initdb")
    if found:
        return found
    candidates = Path("/").glob(f"{PG_BIN_DIRS.lstrip('/')}/initdb")
    newest = max(candidates, key=lambda path: int(path.parts[-3]) if path.parts[-3].isdigit() else 0, default=None)
    return str(newest) if newest else None


def missing_servers() -> str | None:
    """Why a test cannot start servers of its own (initdb, redis-server), and how to run it; None if it can."""
    if find_initdb() is None:
        return (
            f"PostgreSQL's initdb is neither on PATH nor in {PG_BIN_DIRS}: install the PostgreSQL server "
            "(Debian: apt-get install postgresql), then run them with `pytest -m faults`"
        )
    if shutil.which("redis-server") is None:
        return (
            "redis-server is not on PATH: install Redis (Debian: apt-get install redis-server), then run them "
            "with `pytest -m faults`"
        )
    return None


class OwnPostgres:
    """A PostgreSQL cluster of the test's own (``initdb`` in a temporary directory, a free port)."""

    def __init__(self) -> None:
        initdb = find_initdb()
        assert initdb is not None, f"PostgreSQL's initdb is neither on PATH nor in {PG_BIN_DIRS}"
        self.initdb = initdb
        self.pg_ctl = str(Path(self.initdb).with_name("pg_ctl"))
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="safeupdates-pg-"))
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        # initdb refuses to run as root: run the cluster as the postgres user then.
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres")

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, timeout=60)

    def init(self) -> OwnPostgres:
        self._run(self.initdb, "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres", "--no-sync")
        return self.start()

    def start(self) -> OwnPostgres:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(self.pg_ctl, "-D", str(self.dir / "data"), "-o", options, "-l", str(self.dir / "log"), "-w", "start")
        return self

    def stop(self, mode: str = "immediate") -> None:
        """``pg_ctl stop -m MODE``: ``immediate`` (a crash: recovery at the next start), ``fast``
        (connections terminated, a clean shutdown) or ``smart``."""
        self._run(self.pg_ctl, "-D", str(self.dir / "data"), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast", down_for: float = 0.0) -> OwnPostgres:
        """Stop the cluster (``-m mode``) and start it again on the same port and data directory."""
        self.stop(mode)
        time.sleep(down_for)
        return self.start()

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class OwnPostgresReplica(OwnPostgres):
    """A streaming replica of an :class:`OwnPostgres` primary: ``pg_basebackup -R`` of the primary's
    cluster (the primary's ``wal_level`` is ``replica``, initdb's default, and its ``pg_hba.conf`` trusts
    replication from 127.0.0.1), started as a hot standby on a port of its own.

    :meth:`pause_replay` stops the replica applying the WAL it receives (``pg_wal_replay_pause()``), so
    that it serves the data of that moment however the primary moves on: a replica lagging behind, on
    demand. :meth:`resume_replay` and :meth:`catch_up` end the lag.
    """

    def __init__(self, primary: OwnPostgres) -> None:
        super().__init__()
        self.primary = primary
        # Beside the real initdb (a symlink to it may stand alone on PATH).
        self.pg_basebackup = str(Path(self.initdb).resolve().with_name("pg_basebackup"))

    def init(self) -> OwnPostgresReplica:
        self._run(
            self.pg_basebackup,
            *("-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres"),
            *("-D", str(self.dir / "data"), "-R", "-X", "stream", "--checkpoint", "fast", "--no-sync"),
        )
        self.start()
        return self

    def _query(self, url: str, sql: str) -> object:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(sql).fetchone()  # type: ignore[arg-type]
        return None if row is None else row[0]

    def pause_replay(self) -> None:
        """Stop applying WAL: from now on the replica shows what the primary had committed so far."""
        self.catch_up()
        self._query(self.url, "SELECT pg_wal_replay_pause()")
        assert wait_until(lambda: self._query(self.url, "SELECT pg_get_wal_replay_pause_state()") == "paused", 10)

    def resume_replay(self) -> None:
        self._query(self.url, "SELECT pg_wal_replay_resume()")

    def catch_up(self, timeout: float = 30) -> None:
        """Wait until the replica has applied everything the primary has written so far."""
        target = self._query(self.primary.url, "SELECT pg_current_wal_lsn()::text")
        applied = f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"
        assert wait_until(lambda: self._query(self.url, applied) is True, timeout), "the replica did not catch up"


class TcpProxy:
    """Forward a local port to ``host:port``. :meth:`stop` refuses new connections and cuts the open
    ones, as a server that restarts would; :meth:`start` serves again on the same port."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._gate()
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets += [client, upstream]
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                self._gate()
                sink.sendall(data)
        self._gate()
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _gate(self) -> None:
        """Where bytes, new connections and goodbyes wait to pass (never, here: see FaultProxy)."""

    def stop(self) -> None:
        if self._listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would not.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class FaultProxy(TcpProxy):
    """A :class:`TcpProxy` that can also *partition*: bytes stop flowing both ways (and new connections
    hang) without any socket being closed, as when a cable is pulled or a route is lost. The peers
    notice only through their own timeouts. :meth:`heal` lets the held bytes through, as TCP
    retransmission would once the network is back; :meth:`stop` and :meth:`start` cut and refuse
    connections instead (a host that went away, or a partition longer than TCP's patience)."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self._flowing = threading.Event()
        self._flowing.set()

    @property
    def partitioned(self) -> bool:
        return not self._flowing.is_set()

    def partition(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def _gate(self) -> None:
        # While partitioned: a SYN that gets no answer, bytes that do not arrive, a goodbye held back,
        # until the network is back.
        self._flowing.wait()

    def stop(self) -> None:
        super().stop()
        self.heal()  # threads waiting to forward find their sockets closed and end
