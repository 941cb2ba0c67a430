"""The request-log admin on a log of millions of rows: no statement of a changelist page reads every row of
the log (issue 22: the first page took 607 ms and a search 2.2 s at 1M requests, in COUNT(*)s of the whole
log, the queue filter's DISTINCT and the date hierarchy's). Sizes are lowered on the paginator so that a
small log stands for a large one; ``make bench-scale`` measures the real thing."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from safeupdates import enqueue_update
from safeupdates.admin.requestlog import RequestLogPaginator
from safeupdates.models import ProcessedRequest
from tests.factories import ProfileFactory

pytestmark = pytest.mark.django_db

LOG = '"safeupdates_processedrequest"'
URL = "admin:safeupdates_processedrequest_changelist"


@pytest.fixture
def log(redis) -> list[ProcessedRequest]:
    profiles = [ProfileFactory() for _ in range(3)]
    requests = [enqueue_update(profiles[n % 3], active=bool(n % 2)) for n in range(30)]
    ProcessedRequest.objects.filter(pk__in=[r.pk for r in requests[:20]]).update(status="applied")
    return requests


@pytest.fixture
def small_sizes(monkeypatch):
    """A log of 30 rows stands for a large one: an estimate above 10 rows, counts up to 12 rows."""
    monkeypatch.setattr(RequestLogPaginator, "estimate_above", 10)
    monkeypatch.setattr(RequestLogPaginator, "count_up_to", 12)


def page(admin_client, params: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """The changelist's HTML and the statements it ran on the log."""
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(reverse(URL), params or {})
    assert response.status_code == 200
    return response.content.decode(), [q["sql"] for q in queries.captured_queries if LOG in q["sql"]]


def reads_every_row(sql: str) -> bool:
    """A statement on the log without a WHERE, a LIMIT or an index-ordered LIMIT: a COUNT(*) of the whole
    log, a DISTINCT over a column of it (a filter's choices), the date hierarchy's years."""
    upper = sql.upper()
    if "DISTINCT" in upper or "DATE_TRUNC" in upper or "DJANGO_DATE_TRUNC" in upper:
        return True
    return "COUNT(" in upper and "LIMIT" not in upper and " WHERE " not in upper


def test_the_rule_finds_statements_that_read_every_row():
    assert reads_every_row('SELECT COUNT(*) AS "__count" FROM "safeupdates_processedrequest"')
    assert reads_every_row('SELECT DISTINCT "safeupdates_processedrequest"."queue" FROM "x" ORDER BY 1')
    assert reads_every_row("SELECT DISTINCT DATE_TRUNC('year', \"created_at\" AT TIME ZONE 'UTC') FROM x")
    assert not reads_every_row('SELECT COUNT(*) FROM (SELECT 1 FROM "safeupdates_processedrequest" LIMIT 13) s')
    assert not reads_every_row('SELECT "id" FROM "safeupdates_processedrequest" ORDER BY "created_at" LIMIT 100')


def test_no_statement_of_the_first_page_reads_the_whole_log(admin_client, log, small_sizes, postgres_only):
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {LOG}")  # the estimate is PostgreSQL's statistics, as autovacuum keeps them
    html, statements = page(admin_client)
    assert statements and not [sql for sql in statements if reads_every_row(sql)], statements
    assert re.search(r"about 30 processed requests", html), html[-3000:]
    assert html.count('class="field-request_id"') == 30


def test_a_filtered_list_counts_up_to_a_bound(admin_client, log, small_sizes):
    html, statements = page(admin_client, {"status__exact": "applied"})
    assert not [sql for sql in statements if reads_every_row(sql)], statements
    assert [sql for sql in statements if "COUNT(" in sql.upper() and "LIMIT 13" in sql.upper()], statements
    assert "more than 12 processed requests" in html
    html, _statements = page(admin_client, {"status__exact": "pending"})
    assert re.search(r"\b10 processed requests", html) and "more than" not in html and "about" not in html


def test_a_small_log_is_counted_exactly(admin_client, log):
    html, statements = page(admin_client)
    assert re.search(r"\b30 processed requests", html) and "about" not in html and "more than" not in html
    assert not [sql for sql in statements if reads_every_row(sql)], statements


def test_the_queue_filter_lists_the_configured_queues_without_reading_the_log(admin_client, log, settings):
    html, statements = page(admin_client)
    assert not [sql for sql in statements if "DISTINCT" in sql.upper()], statements
    for name in settings.RQ_QUEUES:
        assert f"?queue={name}" in html
    profile = ProfileFactory()
    slow = enqueue_update(profile, active=True, queue="slow")
    html, _statements = page(admin_client, {"queue": "slow"})
    assert str(slow.request_id) in html and html.count('class="field-request_id"') == 1


def test_the_created_filter_replaces_the_date_hierarchy(admin_client, log):
    html, statements = page(admin_client, {"created_at__gte": "2000-01-01 00:00:00+00:00"})
    assert not [sql for sql in statements if reads_every_row(sql)], statements
    assert "Past 7 days" in html and 'class="toplinks"' not in html  # the hierarchy's bar is gone
    assert html.count('class="field-request_id"') == 30
