"""The plan of ``race_demo``'s stress round: what is expected, and a schedule that can go wrong."""

from __future__ import annotations

from collections import Counter

import pytest

from demo_project.toggles.plan import FIELDS, RoundResult, make_plan, summary_line, what_the_kill_did


def test_same_seed_same_plan() -> None:
    assert make_plan(50, 4, seed=7) == make_plan(50, 4, seed=7)
    assert make_plan(50, 4, seed=7) != make_plan(50, 4, seed=8)


def test_each_toggle_flips_its_field_and_the_last_one_is_expected() -> None:
    plan = make_plan(200, 5, seed=1)
    last: dict[tuple[int, str], bool] = {}
    for toggle in plan.toggles:
        assert toggle.field in FIELDS
        assert toggle.value is not last.get((toggle.record, toggle.field), False)  # a click flips the switch
        last[toggle.record, toggle.field] = toggle.value
    expected = plan.expected()
    assert len(expected) == plan.fields == 5 * len(FIELDS)
    assert all(expected[key] is last.get(key, False) for key in expected)


def test_every_toggle_is_delivered_after_its_click_some_twice_and_out_of_order() -> None:
    plan = make_plan(200, 5, seed=2)
    clicked: set[int] = set()
    deliveries: list[int] = []
    for kind, index in plan.events:
        if kind == "click":
            clicked.add(index)
        else:
            assert index in clicked, "a job is delivered before its click"
            deliveries.append(index)
    counts = Counter(deliveries)
    assert set(counts) == set(range(200))
    assert set(counts.values()) <= {1, 2}
    assert plan.duplicates == sum(counts.values()) - 200 > 0
    assert plan.deliveries == len(deliveries)
    firsts = list(dict.fromkeys(deliveries))
    assert firsts != sorted(firsts), "deliveries are not shuffled"


@pytest.mark.parametrize("toggles, records", [(1, 1), (3, 10)])
def test_small_plans(toggles: int, records: int) -> None:
    plan = make_plan(toggles, records, seed=0)
    assert len(plan.toggles) == toggles
    assert plan.deliveries >= toggles


def test_summary_line() -> None:
    naive = RoundResult(
        wrong=11, fields=30, duplicates=38, absorbed=0, stale_dropped=0, seconds=1, jobs=1, lost=0, killed_busy=True
    )
    safe = RoundResult(
        wrong=0, fields=30, duplicates=38, absorbed=38, stale_dropped=9, seconds=1, jobs=1, lost=0, killed_busy=True
    )
    assert summary_line(naive, safe) == "naive: 11/30 fields wrong; safeupdates: 0/30 fields wrong"


def _round(lost: int, relayed: int | None = None) -> RoundResult:
    return RoundResult(
        wrong=0, fields=30, duplicates=38, absorbed=38, stale_dropped=9, seconds=1, jobs=1, lost=lost,
        killed_busy=True, relayed=relayed,
    )  # fmt: skip


@pytest.mark.parametrize(
    "naive, safe, says",
    [
        # The reading that looked like a loss ("jobs lost 1, relay re-delivered 0"): other jobs applied them.
        (_round(1), _round(1, 0), "On the safeupdates path it cut off 1 job: its requests stayed pending in the "
         "request log, and other jobs applied them (a job applies every pending request of its profile): the "
         "relay found nothing left to deliver. Nothing was lost."),
        (_round(0), _round(2, 3), "On the safeupdates path it cut off 2 jobs: their requests stayed pending in the "
         "request log, and the relay delivered 3 record(s) again, whose jobs applied them. Nothing was lost."),
        (_round(1), _round(0, 1), "On the safeupdates path it cut off no job; the relay delivered 1 record(s) whose "
         "requests were still pending, and their jobs applied them."),
        (_round(1), _round(0, 0), "On the safeupdates path it cut off no job."),
    ],
)  # fmt: skip
def test_what_the_kill_did_says_where_the_requests_of_a_cut_off_job_went(
    naive: RoundResult, safe: RoundResult, says: str
) -> None:
    words = " ".join(what_the_kill_did(naive, safe).split())
    naive_words = (
        "The SIGKILL cut off 1 job on the naive path: never run again, so a click whose write was not made yet "
        "is lost for good."
        if naive.lost
        else "The SIGKILL cut off no job on the naive path."
    )
    assert words == f"{naive_words} {says}"
    assert all(len(line) <= 96 for line in what_the_kill_did(naive, safe).splitlines())
