"""``manage.py demo_serve``: the development server, workers of ``SAFEUPDATES_DELIVERY`` and the relay, together
(``make serve``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from demo_project.processes import CeleryWorkers, TaskWorkers, Workers, manage_py, stop_signals_interrupt
from safeupdates import conf

#: The demo's queue for long jobs (a key of its ``RQ_QUEUES``), served by a worker of its own.
SLOW_QUEUE = "slow"


class Command(BaseCommand):
    help = (
        "Run the demo: `runserver`, worker(s) on the safeupdates queue (rqworker; db_worker with DELIVERY=tasks; "
        "Celery prefork workers with DELIVERY=celery), an RQ worker on the slow queue, and the relay that "
        "re-delivers requests left pending (lost jobs), until Ctrl-C, SIGTERM or SIGHUP."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000", help="Address of the server.")
        parser.add_argument("--workers", type=int, default=1, help="Worker processes (1).")
        parser.add_argument("--relay-interval", type=float, default=5.0, help="Seconds between two relay passes (5).")

    def handle(self, *args: Any, **options: Any) -> None:
        # SIGTERM (docker stop, systemd) and SIGHUP (the terminal closed) stop everything as Ctrl-C does: what
        # it starts runs in sessions of its own, and would outlive a command killed by their default action.
        with stop_signals_interrupt():
            self._serve(options)

    def _serve(self, options: dict[str, Any]) -> None:
        queue, slow_queue = conf.queue_name(), SLOW_QUEUE
        # The metrics of every process (server, workers) in one place: prometheus-client's multiprocess mode.
        metrics_dir = tempfile.mkdtemp(prefix="safeupdates-demo-metrics-")
        env = {"PROMETHEUS_MULTIPROC_DIR": metrics_dir}
        pool, slow_pool, workers = self._pools()
        server: subprocess.Popen[bytes] | None = None
        relay_proc: subprocess.Popen[bytes] | None = None
        try:
            server = manage_py("runserver", options["addrport"], env=env)
            pool.start(options["workers"], (queue,), verbosity=1, env=env)
            # Separate pools, as in production: toggles never wait behind a slow job (RQ's job tools only).
            slow = ""
            if slow_queue != queue and conf.delivery() == "rq":
                slow_pool.start(1, (slow_queue,), verbosity=1, env=env)
                slow = f" and one on the slow queue {slow_queue!r}"
            interval = options["relay_interval"]
            relay_proc = manage_py("safeupdates_relay", "--interval", str(interval), stdout=subprocess.PIPE)
            threading.Thread(target=self._echo_deliveries, args=(relay_proc,), daemon=True).start()
            self.stdout.write(
                f"Serving http://{options['addrport']}/ with {options['workers']} {workers} on queue {queue!r}{slow}; "
                f"relay: safeupdates_relay every {interval:g} s for requests "
                f"pending over {conf.relay_after()} s. "
                "Log in as demo / demo (`python manage.py demo_user`). Ctrl-C stops everything.\n"
                f"Status: http://{options['addrport']}/admin/safeupdates/processedrequest/status/ "
                f"(or `python manage.py safeupdates_status`); metrics: http://{options['addrport']}/metrics/ "
                "(as a staff user)."
            )
            while True:
                if server.poll() is not None:
                    self.stderr.write(f"runserver exited with status {server.returncode}; stopping.")
                    break
                if not pool.alive():
                    self.stderr.write("the worker exited; stopping.")
                    break
                if relay_proc.poll() is not None:
                    self.stderr.write(f"the relay exited with status {relay_proc.returncode}; stopping.")
                    break
                time.sleep(interval)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (Terminated)
            self.stdout.write("\nstopping…")
        finally:
            # The whole group: runserver's autoreloader runs the server in a child process.
            for proc, sig in ((server, signal.SIGINT), (relay_proc, signal.SIGTERM)):
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, sig)
            pool.stop()
            slow_pool.stop()
            for proc in (server, relay_proc):
                if proc is not None:
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
            shutil.rmtree(metrics_dir, ignore_errors=True)

    @staticmethod
    def _pools() -> tuple[Workers, Workers, str]:
        """The worker pools of ``SAFEUPDATES_DELIVERY`` (the apply queue's, the slow queue's) and what
        their workers are called."""
        if conf.delivery() == "celery":
            return CeleryWorkers(name="demo-serve", output=None), Workers(), "Celery prefork worker(s)"
        if conf.delivery() == "tasks":
            backend = conf.task_backend()
            return TaskWorkers(name="demo-serve", backend=backend, output=None), Workers(), "db_worker(s)"
        return Workers(name="demo-serve", output=None), Workers(name="demo-serve-slow", output=None), "RQ worker(s)"

    def _echo_deliveries(self, proc: subprocess.Popen[bytes]) -> None:
        """Echo the relay's passes that delivered something (one line every few seconds otherwise)."""
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if " 0 job(s)" not in line:
                self.stdout.write(line)
