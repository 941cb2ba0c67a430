"""``manage.py demo_serve``: the development server, a worker and the relay, together (``make serve``)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any

from django.core.management import get_commands
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, connections, reset_queries
from redis.exceptions import RedisError

from demo_project.toggles.processes import WorkerPool, manage_py
from safeupdates import conf
from safeupdates.jobs import relay_pending


class Command(BaseCommand):
    help = (
        "Run the demo: `runserver`, RQ worker(s) on the safeupdates queue and the relay that re-delivers "
        "requests left pending (lost jobs), until Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000", help="Address of the server.")
        parser.add_argument("--workers", type=int, default=1, help="Worker processes (1).")
        parser.add_argument("--relay-interval", type=float, default=5.0, help="Seconds between two relay passes (5).")

    def handle(self, *args: Any, **options: Any) -> None:
        queue = conf.queue_name()
        server = manage_py("runserver", options["addrport"])
        pool = WorkerPool(queue, name="demo-serve", output=None)
        pool.start(options["workers"], scheduler=True, verbosity=1)
        relay_proc = None
        interval = options["relay_interval"]
        if "safeupdates_relay" in get_commands():
            relay_proc = manage_py("safeupdates_relay", "--interval", str(interval), stdout=subprocess.PIPE)
            threading.Thread(target=self._echo_deliveries, args=(relay_proc,), daemon=True).start()
            relay = "safeupdates_relay"
        else:
            relay = "relay_pending() in this process"
        self.stdout.write(
            f"Serving http://{options['addrport']}/ with {options['workers']} worker(s) on queue {queue!r}; "
            f"relay: {relay} every {interval:g} s for requests pending over {conf.relay_after()} s. "
            "Log in as demo / demo (`python manage.py demo_user`). Ctrl-C stops everything."
        )
        try:
            while True:
                if server.poll() is not None:
                    self.stderr.write(f"runserver exited with status {server.returncode}; stopping.")
                    break
                if not pool.alive():
                    self.stderr.write("the worker exited; stopping.")
                    break
                if relay_proc is None:
                    self._relay_once()
                elif relay_proc.poll() is not None:
                    self.stderr.write(f"the relay exited with status {relay_proc.returncode}; stopping.")
                    break
                time.sleep(interval)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        finally:
            # The whole group: runserver's autoreloader runs the server in a child process.
            for proc, sig in ((server, signal.SIGINT), (relay_proc, signal.SIGTERM)):
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, sig)
            pool.stop()
            for proc in (server, relay_proc):
                if proc is not None:
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()

    def _echo_deliveries(self, proc: subprocess.Popen[bytes]) -> None:
        """Echo the relay's passes that delivered something (one line every few seconds otherwise)."""
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if " 0 job(s)" not in line:
                self.stdout.write(line)

    def _relay_once(self) -> None:
        try:
            delivered = relay_pending()
        except (DatabaseError, RedisError) as exc:
            self.stderr.write(f"relay: {exc}; trying again in a moment.")
            delivered = 0
        finally:
            # A long-lived loop: don't keep a broken connection, nor DEBUG's log of every query.
            connections.close_all()
            reset_queries()
        if delivered:
            self.stdout.write(f"relay: delivered {delivered} record(s) again")
