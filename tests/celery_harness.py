"""Helpers of the Celery tests (``SAFEUPDATES_DELIVERY = "celery"``): a RabbitMQ vhost of the test's own,
the web process's Celery app on a test's broker, and real prefork workers (``celery -A tests.celery_app
worker --pool prefork -c 2``) as subprocesses, optionally under a supervisor that starts a worker again
when it exits (as production runs them)."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from django.test import override_settings

from demo_project import processes
from tests.faults.harness import SupervisedWorkers

#: The shared RabbitMQ (tests create and delete vhosts of their own on it, nothing else).
RABBITMQ_HOST, RABBITMQ_PORT = "127.0.0.1", 5672

#: The Celery app of the web process (this test process) while a test delivers through Celery:
#: ``SAFEUPDATES_CELERY_APP`` names it (:func:`celery_delivery`).
WEB_APP: Celery | None = None


def rabbitmq_missing() -> str | None:
    """Why the RabbitMQ tests cannot run here, or None."""
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not on PATH (install rabbitmq-server)"
    with contextlib.suppress(OSError), socket.create_connection((RABBITMQ_HOST, RABBITMQ_PORT), timeout=1):
        return None
    return f"RabbitMQ does not answer at {RABBITMQ_HOST}:{RABBITMQ_PORT}"


class RabbitVhost:
    """A vhost of the test's own on the shared RabbitMQ (``safeupdates_test_<random>``), guest's to use;
    :meth:`delete` removes it with its queues."""

    def __init__(self) -> None:
        self.name = f"safeupdates_test_{secrets.token_hex(4)}"

    def _ctl(self, *args: str) -> None:
        subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)

    def create(self) -> RabbitVhost:
        self._ctl("add_vhost", self.name)
        self._ctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")
        return self

    def url(self, port: int = RABBITMQ_PORT) -> str:
        """The broker URL of the vhost, directly or through a proxy listening on ``port``."""
        return f"amqp://guest:guest@{RABBITMQ_HOST}:{port}/{self.name}"

    def delete(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._ctl("delete_vhost", self.name)


@contextlib.contextmanager
def own_vhost() -> Iterator[RabbitVhost]:
    """A RabbitMQ vhost of the caller's own, deleted at the end; skips the test if RabbitMQ is missing."""
    missing = rabbitmq_missing()
    if missing:
        pytest.skip(missing)
    own = RabbitVhost().create()
    try:
        yield own
    finally:
        own.delete()


def web_app(broker_url: str, **config: Any) -> Celery:
    """A Celery app configured as ``tests.celery_app`` is (the ``CELERY_*`` settings), on ``broker_url``."""
    app = Celery("tests-web", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.broker_url = broker_url
    app.conf.update(config)
    return app


@contextlib.contextmanager
def celery_delivery(broker_url: str, **config: Any) -> Iterator[Celery]:
    """Deliver through Celery on ``broker_url`` in this process (``SAFEUPDATES_DELIVERY = "celery"``, the
    app :data:`WEB_APP`), for the block; yields the app."""
    global WEB_APP
    app = web_app(broker_url, **config)
    WEB_APP = app
    try:
        with override_settings(SAFEUPDATES_DELIVERY="celery", SAFEUPDATES_CELERY_APP="tests.celery_harness.WEB_APP"):
            yield app
    finally:
        WEB_APP = None
        app.close()


def queued(app: Celery, queue: str = "default") -> int:
    """Messages waiting in ``queue`` of ``app``'s broker (0 if the queue does not exist)."""
    with app.connection_for_read() as connection:
        channel = connection.channel()
        try:
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
        except connection.channel_errors:
            return 0
        finally:
            with contextlib.suppress(Exception):
                channel.close()


def take_messages(app: Celery, queue: str = "default") -> list[Any]:
    """Take every message waiting in ``queue`` off the broker (acknowledged): what a worker would get."""
    return processes.take_messages(app, queue)


class CeleryWorkers(processes.CeleryWorkers):
    """Real Celery workers of ``tests.celery_app``: ``celery -A tests.celery_app worker --pool prefork -c 2
    -Q QUEUES`` (:class:`demo_project.processes.CeleryWorkers`, which the Celery demo runs too), on the
    tests' settings."""

    app = "tests.celery_app"
    delivery_env = {"SAFEUPDATES_DELIVERY": "celery"}


class SupervisedCeleryWorkers(SupervisedWorkers, CeleryWorkers):
    """Celery workers under the supervisor of the fault scenarios: one that exits (a prefork worker can,
    when its Redis broker restarts) is started again a second later."""

    def registered(self) -> int:
        return self.ready()


def worker_log_dir(tmp_path: Path) -> Path:
    path = tmp_path / "celery-workers"
    path.mkdir(parents=True, exist_ok=True)
    return path
