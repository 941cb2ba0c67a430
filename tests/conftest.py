from __future__ import annotations

from collections.abc import Iterator

import django_rq
import pytest
from django.db import connection
from redis import Redis

from tests.workers import Workers


@pytest.fixture
def redis() -> Iterator[Redis]:
    """The tests' Redis database, emptied before and after the test."""
    conn = django_rq.get_connection("default")
    conn.flushdb()
    yield conn
    conn.flushdb()


@pytest.fixture
def workers(redis: Redis, transactional_db: None) -> Iterator[Workers]:
    """Real rqworker processes on the test database; call ``workers.start(n)``."""
    pool = Workers()
    yield pool
    pool.stop()


@pytest.fixture
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (row locks)")
