"""A PgBouncer of the test's own, in front of the shared PostgreSQL, and the command that runs the suite
through it (``python -m tests.pooler TOPOLOGY -- COMMAND ...``).

Debian's ``pgbouncer`` package (1.18 on Debian 12: no ``max_prepared_statements``) is installed when it
is missing (``apt-get install -y pgbouncer``, as root; :func:`ensure_installed`). :class:`PgBouncer` writes
its ``pgbouncer.ini`` and ``userlist.txt`` to a temporary directory, listens on a free loopback port,
forwards every database name to the PostgreSQL at ``127.0.0.1:5432`` (``auth_type = trust``), in
``pool_mode`` ``transaction`` or ``session``, and is stopped (and its directory removed) by whoever
started it. Its admin console (``RECONNECT``, ``PAUSE``, ``RESUME``, ``KILL``) is reached with ``psql``:
it speaks only the simple query protocol.

A PgBouncer that keeps prepared statements per client (1.22 and later, with ``max_prepared_statements``)
is built from Debian's source tarball of it (:data:`PREPARED_PGBOUNCER`, checked against its SHA-256) into
``~/.cache/safeupdates-tests/`` the first time a test needs it (:func:`ensure_built`: about 30 s; as root,
``apt-get install -y libevent-dev`` first if its headers are missing).

The topologies (``SAFEUPDATES_TEST_TOPOLOGY``, read by ``tests/settings.py``): ``direct`` (the default),
``pgbouncer-transaction``, ``pgbouncer-session`` and ``pgbouncer-prepared`` (transaction mode on the
PgBouncer built here, ``max_prepared_statements = 200``), each through a PgBouncer whose port is
``SAFEUPDATES_TEST_POOLER_PORT``; ``django-pool`` (Django's psycopg_pool) and ``persistent``
(``CONN_MAX_AGE`` with ``CONN_HEALTH_CHECKS``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

__all__ = [
    "POOLERS",
    "PREPARED_PGBOUNCER",
    "TOPOLOGIES",
    "PgBouncer",
    "ensure_built",
    "ensure_installed",
    "main",
    "pgbouncer_binary",
]

TOPOLOGIES = (
    "direct",
    "pgbouncer-transaction",
    "pgbouncer-session",
    "pgbouncer-prepared",
    "django-pool",
    "persistent",
)
#: The topologies that go through a PgBouncer: its pool_mode and its max_prepared_statements (0: Debian's
#: packaged PgBouncer; more: the one :func:`ensure_built` builds).
POOLERS = {
    "pgbouncer-transaction": ("transaction", 0),
    "pgbouncer-session": ("session", 0),
    "pgbouncer-prepared": ("transaction", 200),
}

#: The PgBouncer built for ``max_prepared_statements`` (1.22 and later): its version and the SHA-256 of
#: Debian's source tarball of it (Debian 13's; Debian 12 packages 1.18).
PREPARED_PGBOUNCER = ("1.24.1", "da72a3aba13072876d055a3e58dd4aba4a5de4ed6148e73033185245598fd3e0")
_SOURCE = "https://deb.debian.org/debian/pool/main/p/pgbouncer/pgbouncer_{version}.orig.tar.gz"

_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer")


def pgbouncer_binary() -> str | None:
    """The path of the ``pgbouncer`` program, or None."""
    found = shutil.which("pgbouncer")
    return found or next((path for path in _CANDIDATES if os.access(path, os.X_OK)), None)


def ensure_installed() -> str:
    """The path of ``pgbouncer``, installing Debian's package first if it is missing (as root)."""
    binary = pgbouncer_binary()
    if binary is not None:
        return binary
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("pgbouncer is not installed: apt-get install -y pgbouncer (as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "pgbouncer"]
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
        subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=True)
    binary = pgbouncer_binary()
    if binary is None:
        raise RuntimeError("apt-get installed pgbouncer, but the program is not where it should be")
    return binary


def ensure_built() -> str:
    """The path of a PgBouncer that keeps prepared statements per client (:data:`PREPARED_PGBOUNCER`),
    built from Debian's source tarball into ``~/.cache/safeupdates-tests/`` the first time (one build at a
    time: the processes that want it at once wait for the first one's)."""
    version, sha256 = PREPARED_PGBOUNCER
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "safeupdates-tests"
    prefix = cache / f"pgbouncer-{version}"
    binary = prefix / "bin" / "pgbouncer"
    if os.access(binary, os.X_OK):
        return str(binary)
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"pgbouncer-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(binary, os.X_OK):  # built while this one waited
            return str(binary)
        _ensure_build_dependencies()
        with tempfile.TemporaryDirectory(prefix="safeupdates-pgbouncer-build-") as work:
            url = _SOURCE.format(version=version)
            with urllib.request.urlopen(url, timeout=120) as response:
                tarball = response.read()
            if hashlib.sha256(tarball).hexdigest() != sha256:
                raise RuntimeError(f"{url} does not have the SHA-256 {sha256}")
            (Path(work) / "source.tar.gz").write_bytes(tarball)
            with tarfile.open(Path(work) / "source.tar.gz") as tar:
                tar.extractall(work, filter="data")
            source = Path(work) / f"pgbouncer-{version}"
            staging = cache / f"pgbouncer-{version}.partial"
            shutil.rmtree(staging, ignore_errors=True)
            features = ["--without-cares", "--without-pam", "--without-systemd"]
            for step in (["./configure", f"--prefix={staging}", *features], ["make", "-j2"], ["make", "install"]):
                built = subprocess.run(step, cwd=source, capture_output=True, text=True, check=False)
                if built.returncode != 0:
                    raise RuntimeError(
                        f"building PgBouncer {version}: {' '.join(step)} failed:\n{built.stderr[-3000:]}"
                    )
            staging.rename(prefix)
    return str(binary)


def _ensure_build_dependencies() -> None:
    """libevent's headers (the one library PgBouncer needs that a Python machine lacks), from Debian."""
    found = ["pkg-config", "--exists", "libevent", "openssl"]
    if shutil.which("pkg-config") and subprocess.run(found, check=False).returncode == 0:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("building PgBouncer needs libevent's headers: apt-get install -y libevent-dev (as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "libevent-dev", "libssl-dev", "pkg-config"]
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
        subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=True)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class PgBouncer:
    """A ``pgbouncer`` process of our own in front of ``server_host:server_port``.

    ``pool_size`` is each (database, user) pool's ``default_pool_size``. ``max_prepared_statements`` above
    0 runs the PgBouncer built by :func:`ensure_built`, which keeps each client's prepared statements to it;
    0, Debian's. As root, PgBouncer (which refuses to run as root) runs as ``postgres`` (``-u``).
    """

    def __init__(
        self,
        pool_mode: str = "transaction",
        *,
        server_host: str = "127.0.0.1",
        server_port: int = 5432,
        user: str = "postgres",
        pool_size: int = 20,
        port: int | None = None,
        max_prepared_statements: int = 0,
    ) -> None:
        if pool_mode not in {"transaction", "session", "statement"}:
            raise ValueError(f"pool_mode {pool_mode!r}")
        self.pool_mode = pool_mode
        self.max_prepared_statements = max_prepared_statements
        self.server_host = server_host
        self.server_port = server_port
        self.user = user
        self.pool_size = pool_size
        self.port = port or _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="safeupdates-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def ini(self) -> Path:
        return self.dir / "pgbouncer.ini"

    @property
    def log(self) -> Path:
        return self.dir / "pgbouncer.log"

    def _write_config(self) -> None:
        (self.dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        self.ini.write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            f"admin_users = {self.user}\n"
            f"pool_mode = {self.pool_mode}\n"
            "max_client_conn = 500\n"
            f"default_pool_size = {self.pool_size}\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
            # Shorter than the default 15 s: a test waiting on RESUME or a restart is not held up.
            "server_login_retry = 1\n"
            + (f"max_prepared_statements = {self.max_prepared_statements}\n" if self.max_prepared_statements else "")
        )

    def start(self) -> PgBouncer:
        binary = ensure_built() if self.max_prepared_statements else ensure_installed()
        self._write_config()
        args = [binary, str(self.ini)]
        if os.geteuid() == 0:
            shutil.chown(self.dir, self.user)
            for path in self.dir.iterdir():
                shutil.chown(path, self.user)
            args[1:1] = ["-u", self.user]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not _accepts(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log.read_text() if self.log.exists() else ""
                self.stop()
                raise RuntimeError(f"pgbouncer did not start on port {self.port}:\n{log}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """SIGTERM: PgBouncer closes every connection at once and exits (SIGKILL if it has not in 10 s)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> PgBouncer:
        """Stop and start again on the same port (every client and server connection is cut)."""
        self.stop()
        return self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def admin(self, command: str) -> str:
        """Run ``command`` on PgBouncer's admin console (``SHOW POOLS``, ``PAUSE``, ``RESUME`` ...)."""
        result = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", "pgbouncer", "-Atc", command],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return result.stdout

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.pooler TOPOLOGY [-- COMMAND ...]``: run COMMAND (default: pytest on
    tests/test_topologies.py's cases) with ``SAFEUPDATES_TEST_TOPOLOGY=TOPOLOGY``, through a PgBouncer
    of its own for the ``pgbouncer-*`` ones (``SAFEUPDATES_TEST_POOLER_PORT``), stopped afterwards."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in TOPOLOGIES:
        print(f"usage: python -m tests.pooler {{{'|'.join(TOPOLOGIES)}}} [-- COMMAND ...]", file=sys.stderr)
        return 2
    topology, command = args[0], args[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--no-cov", "-m", "not topologies"]
        command.append("tests/test_topologies.py")
    env = {**os.environ, "SAFEUPDATES_TEST_TOPOLOGY": topology}
    if topology not in POOLERS:
        return subprocess.run(command, env=env, check=False).returncode
    mode, prepared = POOLERS[topology]
    with PgBouncer(mode, max_prepared_statements=prepared) as pooler:
        env["SAFEUPDATES_TEST_POOLER_PORT"] = str(pooler.port)
        return subprocess.run(command, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
