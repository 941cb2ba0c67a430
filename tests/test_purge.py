"""``safeupdates_purge`` at size: short batches that never wait for a writer, a progress line, and a purge
that was killed finishes when run again, never deleting what must be kept (pending requests, task rows)."""

from __future__ import annotations

import datetime
import signal
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from safeupdates.management.commands import safeupdates_purge
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus
from tests.workers import ROOT, RowLock, subprocess_env, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime.datetime.now(datetime.UTC)
TERMINAL = [RequestStatus.APPLIED, RequestStatus.STALE, RequestStatus.REJECTED, RequestStatus.FAILED]


def log_rows(
    count: int,
    *,
    days_old: float,
    status: str = RequestStatus.APPLIED,
    kind: str = RequestKind.UPDATE,
    key: str = "",
) -> list[int]:
    """``count`` request-log rows created ``days_old`` days ago (statuses cycle through the terminal
    ones unless ``status`` is pending); tasks get keys ``key0, key1, ...``. Returns their pks."""
    at = NOW - datetime.timedelta(days=days_old)
    rows = [
        ProcessedRequest(
            kind=kind,
            key=f"{key}{index}" if kind == RequestKind.TASK else "",
            object_id=str(index),
            status=status if status == RequestStatus.PENDING else TERMINAL[index % len(TERMINAL)],
            created_at=at,
            processed_at=None if status == RequestStatus.PENDING else at,
        )
        for index in range(count)
    ]
    return [row.pk for row in ProcessedRequest.objects.bulk_create(rows, batch_size=2000)]


def remaining(pks: list[int]) -> int:
    return ProcessedRequest.objects.filter(pk__in=pks).count()


def purge(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("safeupdates_purge", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_purge_deletes_in_batches_and_reports_them():
    old = log_rows(30, days_old=3)
    old_items = log_rows(4, days_old=3, kind=RequestKind.BATCH_ITEM)
    kept = log_rows(5, days_old=0) + log_rows(6, days_old=3, status=RequestStatus.PENDING)
    tasks = log_rows(3, days_old=3, kind=RequestKind.TASK, key="charge:")

    out, _err = purge("--older-than", "1", "--batch-size", "7")
    assert out.startswith(
        "deleted 34 request(s) older than 1 day(s); tasks kept (SAFEUPDATES_TASK_RETENTION is None); 5 batch(es) in "
    )
    assert remaining(old + old_items) == 0
    assert remaining(kept + tasks) == len(kept + tasks)


def test_purge_prints_a_progress_line(monkeypatch):
    log_rows(30, days_old=3)
    monkeypatch.setattr(safeupdates_purge, "PROGRESS_EVERY", 0)
    _out, err = purge("--older-than", "1", "--batch-size", "10")
    assert err.splitlines() == [
        "safeupdates purge: requests: 10 of 30 deleted (33%)",
        "safeupdates purge: requests: 20 of 30 deleted (67%)",
        "safeupdates purge: requests: 30 of 30 deleted (100%)",
    ]
    assert purge("--older-than", "1", "-v", "0")[1] == ""


def test_purge_dry_run_counts_what_it_would_delete():
    log_rows(12, days_old=3)
    log_rows(2, days_old=3, kind=RequestKind.TASK, key="refund:")
    with override_settings(SAFEUPDATES_TASK_RETENTION=2):
        out, _err = purge("--older-than", "1", "--dry-run")
    assert out == (
        "would delete 12 request(s) older than 1 day(s) and 2 task(s) completed more than 2 day(s) ago "
        "(SAFEUPDATES_TASK_RETENTION)\n"
    )
    assert ProcessedRequest.objects.count() == 14


def test_tasks_within_their_retention_are_kept():
    recent = log_rows(3, days_old=1, kind=RequestKind.TASK, key="recent:")
    old = log_rows(4, days_old=5, kind=RequestKind.TASK, key="old:")
    running = log_rows(2, days_old=5, kind=RequestKind.TASK, key="running:", status=RequestStatus.PENDING)
    with override_settings(SAFEUPDATES_TASK_RETENTION=2):
        out, _err = purge("--older-than", "0", "--batch-size", "3")
    assert out.startswith("deleted 0 request(s) older than 0 day(s) and 4 task(s) completed more than 2 day(s) ago")
    assert remaining(old) == 0
    assert remaining(recent + running) == 5


def test_batch_size_has_a_help_text():
    parser = safeupdates_purge.Command().create_parser("manage.py", "safeupdates_purge")
    action = next(action for action in parser._actions if "--batch-size" in action.option_strings)
    assert action.help == (
        "Rows deleted per statement (default 1000). Each batch commits on its own and holds the row locks of its "
        "rows only while it runs (milliseconds at the default); a larger batch deletes faster and holds them longer."
    )
    assert action.metavar == "ROWS"


def test_purge_refuses_an_unknown_database():
    with pytest.raises(CommandError) as excinfo:
        call_command("safeupdates_purge", "--database", "nope")
    assert str(excinfo.value) == "--database 'nope' is not in DATABASES."


#: A purge of every outcome at once (``--older-than``), and one per retention (the settings).
BY_RETENTION = {"SAFEUPDATES_RETENTION": 1, "SAFEUPDATES_FAILED_RETENTION": 2, "SAFEUPDATES_REJECTED_RETENTION": 2}


@pytest.mark.parametrize(("args", "retentions"), [(["--older-than", "1"], {}), ([], BY_RETENTION)])
def test_purge_never_waits_for_a_row_another_transaction_holds(postgres_only, args, retentions):
    """A row being changed by another transaction is left for the next run; the purge does not wait for it
    (nor, so, make the writers queued behind its lock wait)."""
    old = log_rows(20, days_old=3)
    held = old[7]
    with RowLock(ProcessedRequest, held), override_settings(**retentions):
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # a purge that waited would fail here, not hang
        try:
            out, _err = purge(*args, "--batch-size", "5")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        assert out.startswith("deleted 19 request(s)")
        assert list(ProcessedRequest.objects.filter(pk__in=old).values_list("pk", flat=True)) == [held]
    assert purge("--older-than", "1")[0].startswith("deleted 1 request(s)")
    assert remaining(old) == 0


def test_a_killed_purge_finishes_when_run_again_and_keeps_what_it_must(postgres_only):
    """SIGKILL mid-way: the batches that committed stay deleted, the rest is purged by the next run, and no
    pending request, recent request or task row is ever deleted."""
    old = log_rows(12_000, days_old=3) + log_rows(400, days_old=3, kind=RequestKind.BATCH_ITEM)
    kept = (
        log_rows(300, days_old=0)
        + log_rows(300, days_old=3, status=RequestStatus.PENDING)
        + log_rows(200, days_old=30, kind=RequestKind.TASK, key="charge:")
    )
    command = [sys.executable, "manage.py", "safeupdates_purge", "--older-than", "1", "--batch-size", "10"]
    proc = subprocess.Popen(command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # Mid-way: a few batches committed, most of the rows still there.
        assert wait_until(lambda: remaining(old) <= len(old) - 500, 60, interval=0.01), "the purge did not start"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    left = remaining(old)
    assert 0 < left <= len(old) - 500, f"not killed mid-way: {left} of {len(old)} left"
    assert remaining(kept) == len(kept)

    out, _err = purge("--older-than", "1")
    assert out.startswith(f"deleted {left} request(s) older than 1 day(s)")
    assert remaining(old) == 0
    assert remaining(kept) == len(kept)


def test_purge_pauses_between_batches_never_after_the_last(monkeypatch):
    log_rows(25, days_old=3)
    pauses: list[float] = []
    monkeypatch.setattr(safeupdates_purge, "sleep", pauses.append)
    out, _err = purge("--older-than", "1", "--batch-size", "10")
    # Three batches that deleted rows (10, 10, 5), then one that found none: a pause after each full one,
    # 50 ms unless told otherwise.
    assert pauses == [0.05, 0.05]
    assert out.startswith("deleted 25 request(s) older than 1 day(s)")
    assert ProcessedRequest.objects.count() == 0
    pauses.clear()
    log_rows(25, days_old=3)
    purge("--older-than", "1", "--batch-size", "10", "--pause", "0.2")
    assert pauses == [0.2, 0.2]
    pauses.clear()
    log_rows(25, days_old=3)
    purge("--older-than", "1", "--batch-size", "10", "--pause", "0")
    assert pauses == []


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "61"])
def test_purge_refuses_a_pause_that_is_not_a_short_number_of_seconds(value):
    pks = log_rows(3, days_old=3)
    with pytest.raises(CommandError) as excinfo:
        purge("--older-than", "1", "--pause", value)
    assert str(excinfo.value) == f"--pause must be a number of seconds from 0 to 60, not {float(value):g}."
    assert remaining(pks) == 3


def of_status(count: int, status: str, *, days_old: float, kind: str = RequestKind.UPDATE) -> list[int]:
    """``count`` request-log rows of ``status``, created (and processed) ``days_old`` days ago."""
    at = NOW - datetime.timedelta(days=days_old)
    rows = [
        ProcessedRequest(kind=kind, object_id=str(index), status=status, created_at=at, processed_at=at)
        for index in range(count)
    ]
    return [row.pk for row in ProcessedRequest.objects.bulk_create(rows)]


def test_failed_and_rejected_requests_outlive_applied_and_stale_ones():
    """By default an applied or stale request is kept 30 days, a failed or rejected one 90: it is what an
    operator looks for weeks later (and re-drives)."""
    applied = of_status(5, RequestStatus.APPLIED, days_old=40) + of_status(3, RequestStatus.STALE, days_old=40)
    failed = of_status(4, RequestStatus.FAILED, days_old=40)
    rejected = of_status(2, RequestStatus.REJECTED, days_old=40)
    failed_item = of_status(1, RequestStatus.FAILED, days_old=40, kind=RequestKind.BATCH_ITEM)
    older = of_status(2, RequestStatus.FAILED, days_old=100) + of_status(1, RequestStatus.REJECTED, days_old=100)
    pending = of_status(2, RequestStatus.PENDING, days_old=100)

    out, _err = purge("--batch-size", "2")
    assert out.startswith(
        "deleted 11 request(s): 8 applied or stale older than 30 day(s), 3 rejected or failed older than 90 "
        "day(s); tasks kept (SAFEUPDATES_TASK_RETENTION is None); "
    )
    assert remaining(applied + older) == 0
    assert remaining(failed + rejected + failed_item + pending) == 4 + 2 + 1 + 2


def test_each_outcome_has_its_own_retention_and_none_keeps_it():
    applied = of_status(3, RequestStatus.APPLIED, days_old=10)
    failed = of_status(3, RequestStatus.FAILED, days_old=10)
    rejected = of_status(3, RequestStatus.REJECTED, days_old=400)
    retentions = {"RETENTION": 20, "FAILED_RETENTION": 5, "REJECTED_RETENTION": None}
    with override_settings(**{f"SAFEUPDATES_{name}": days for name, days in retentions.items()}):
        dry, _err = purge("--dry-run")
        out, _err = purge()
    assert dry == (
        "would delete 3 request(s): 0 applied or stale older than 20 day(s), 3 failed older than 5 day(s); "
        "rejected kept (SAFEUPDATES_REJECTED_RETENTION is None); tasks kept (SAFEUPDATES_TASK_RETENTION is None)\n"
    )
    assert out.startswith("deleted 3 request(s): ")
    assert remaining(failed) == 0
    assert remaining(applied + rejected) == 6


def test_older_than_given_on_the_command_line_applies_to_every_outcome():
    """``--older-than`` is the operator's word for this run: every outcome, as before per-outcome settings."""
    rows = [pk for status in TERMINAL for pk in of_status(2, status, days_old=3)]
    out, _err = purge("--older-than", "1")
    assert out.startswith("deleted 8 request(s) older than 1 day(s); ")
    assert remaining(rows) == 0


@pytest.mark.parametrize("name", ["SAFEUPDATES_FAILED_RETENTION", "SAFEUPDATES_REJECTED_RETENTION"])
def test_purge_refuses_a_retention_per_outcome_that_is_no_number_of_days(name):
    rows = of_status(2, RequestStatus.APPLIED, days_old=100)
    with override_settings(**{name: "forever"}), pytest.raises(CommandError, match=f"{name} is not None nor"):
        purge()
    assert remaining(rows) == 2
