"""Tests of :func:`safeupdates.write.bulk.bulk_update_if_newer` (PostgreSQL by default; SQLite with DATABASE_URL)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeupdates.exceptions import InvalidUpdate
from safeupdates.managers import Outcome
from safeupdates.versions import next_version
from safeupdates.write import bulk
from safeupdates.write.bulk import BulkResult, bulk_update_if_newer
from tests.testapp.models import Document, Profile, Restaurant

pytestmark = pytest.mark.django_db

FIELDS = ("active", "newsletter", "dark_mode", "score", "name")
Update = tuple[Any, int, dict[str, Any]]
DEFAULTS = {"active": False, "newsletter": False, "dark_mode": False, "score": 0, "name": "init"}


def state(pk: Any) -> dict[str, Any]:
    """The row's fields and ``field_versions`` (JSON nulls dropped: they mean "no entry"), and whether
    ``lock_version`` lies above every version written (it is a fresh change token after any write)."""
    row = Profile.objects.filter(pk=pk).values(*FIELDS, "lock_version", "field_versions").first()
    if row is None:
        return {}
    row["field_versions"] = {k: v for k, v in row["field_versions"].items() if v is not None}
    row["lock_version"] = row["lock_version"] > max(row["field_versions"].values(), default=0)
    return row


def set_state(pk: Any, snapshot: dict[str, Any]) -> None:
    Profile.objects.filter(pk=pk).update(**snapshot)


def write_statements(queries: Sequence[dict[str, str]]) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith(("WITH", "UPDATE"))]


@pytest.fixture
def profile() -> Profile:
    return Profile.objects.create(name="p")


def test_applied_stale_and_missing_are_counted_per_update(profile: Profile) -> None:
    old = profile.lock_version
    v1, v2 = next_version(), next_version()
    result = Profile.objects.bulk_update_if_newer(
        [
            (profile.pk, v1, {"active": True, "score": 3}),
            (profile.pk, old, {"newsletter": True}),  # not newer than the last save
            (profile.pk + 1000, v2, {"active": True}),
        ]
    )
    assert result == BulkResult(applied=1, stale=1, missing=1)
    assert result.total == 3
    profile.refresh_from_db()
    assert (profile.active, profile.score, profile.newsletter) == (True, 3, False)
    assert profile.field_versions == {"*": old, "active": v1, "score": v1}
    assert profile.lock_version > v1


def test_the_updates_of_every_missing_row_are_counted(profile: Profile) -> None:
    v1, v2, v3 = next_version(), next_version(), next_version()
    result = Profile.objects.bulk_update_if_newer(
        [
            (profile.pk + 1000, v1, {"active": True}),
            (profile.pk + 1000, v2, {"score": 2}),  # two updates of one missing row
            (profile.pk + 2000, v3, {"active": True}),
            (profile.pk, v3, {"active": True}),
        ]
    )
    assert result == BulkResult(applied=1, stale=0, missing=3)


def test_updates_of_one_row_merge_per_field_by_version(profile: Profile) -> None:
    v1, v2, v3 = next_version(), next_version(), next_version()
    result = Profile.objects.bulk_update_if_newer(
        [
            (profile.pk, v3, {"active": False}),
            (profile.pk, v1, {"active": True, "newsletter": True}),  # newsletter still wins
            (profile.pk, v2, {"active": True}),  # superseded by v3 for all its fields
        ]
    )
    assert result == BulkResult(applied=2, stale=1, missing=0)
    profile.refresh_from_db()
    assert (profile.active, profile.newsletter) == (False, True)
    assert profile.field_versions == {"*": profile.field_versions["*"], "active": v3, "newsletter": v1}
    assert profile.lock_version > v3


def test_of_two_updates_of_one_field_with_the_same_version_the_first_counts(profile: Profile) -> None:
    """As applied one by one: the second then finds its version there already, and is stale
    (``newest_per_field`` 7 let the last one win)."""
    one_by_one = Profile.objects.create(name="")
    version = next_version()
    result = Profile.objects.bulk_update_if_newer(
        [(profile.pk, version, {"name": "first"}), (profile.pk, version, {"name": "second"})]
    )
    assert result == BulkResult(applied=1, stale=1, missing=0)
    profile.refresh_from_db()
    assert profile.name == "first"
    for name in ("first", "second"):
        Profile.objects.update_if_newer(one_by_one.pk, version=version, name=name)
    one_by_one.refresh_from_db()
    assert one_by_one.name == profile.name


def test_an_older_update_of_another_field_is_not_dropped(profile: Profile) -> None:
    """The seeds' row-level guard would drop it: per-field versions keep it."""
    old, new = next_version(), next_version()
    Profile.objects.bulk_update_if_newer([(profile.pk, new, {"newsletter": True})])
    result = Profile.objects.bulk_update_if_newer([(profile.pk, old, {"active": True})])
    assert result == BulkResult(applied=1)
    profile.refresh_from_db()
    assert (profile.active, profile.newsletter) == (True, True)
    assert profile.lock_version > new


def test_running_a_batch_again_changes_nothing_and_reports_stale(profile: Profile) -> None:
    updates = [(profile.pk, next_version(), {"active": True}), (profile.pk, next_version(), {"score": 7})]
    assert Profile.objects.bulk_update_if_newer(updates) == BulkResult(applied=2)
    before = state(profile.pk)
    assert Profile.objects.bulk_update_if_newer(updates) == BulkResult(stale=2)
    assert state(profile.pk) == before


def test_a_later_save_supersedes_earlier_versions(profile: Profile) -> None:
    early = next_version()
    profile.name = "saved"
    profile.save()
    result = Profile.objects.bulk_update_if_newer([(profile.pk, early, {"name": "late", "active": True})])
    assert result == BulkResult(stale=1)
    profile.refresh_from_db()
    assert (profile.name, profile.active) == ("saved", False)


def test_matches_update_if_newer_on_a_single_update(profile: Profile) -> None:
    twin = Profile.objects.create(name="p")
    set_state(twin.pk, {k: v for k, v in state(profile.pk).items()})
    version = next_version()
    single = Profile.objects.update_if_newer(profile.pk, version=version, active=True, name="x")
    bulk = Profile.objects.bulk_update_if_newer([(twin.pk, version, {"active": True, "name": "x"})])
    assert single.outcome is Outcome.APPLIED and bulk == BulkResult(applied=1)
    assert state(profile.pk) == state(twin.pk)


def test_pk_given_as_text_addresses_the_same_row(profile: Profile) -> None:
    v1, v2 = next_version(), next_version()
    result = Profile.objects.bulk_update_if_newer(
        [(str(profile.pk), v2, {"active": True}), (profile.pk, v1, {"active": False})]
    )
    assert result == BulkResult(applied=1, stale=1)
    profile.refresh_from_db()
    assert profile.active is True


def test_no_updates_runs_no_query() -> None:
    with CaptureQueriesContext(connection) as queries:
        assert Profile.objects.bulk_update_if_newer([]) == BulkResult(0, 0, 0)
        assert Profile.objects.bulk_update_if_newer(iter(())) == BulkResult()
    assert queries.captured_queries == []


def test_the_result_is_frozen() -> None:
    with pytest.raises(AttributeError):
        BulkResult().applied = 1  # type: ignore[misc]


def test_one_statement_per_batch_on_postgresql(postgres_only: None) -> None:
    profiles = Profile.objects.bulk_create([Profile(name=str(i)) for i in range(7)])
    updates = [(p.pk, next_version(), {"active": True, "score": i}) for i, p in enumerate(profiles)]
    with CaptureQueriesContext(connection) as queries:
        result = bulk_update_if_newer(Profile.objects.all(), updates, batch_size=3)
    assert result == BulkResult(applied=7)
    assert len(write_statements(queries.captured_queries)) == 3  # 7 rows in batches of 3
    with CaptureQueriesContext(connection) as queries:
        bulk_update_if_newer(Profile.objects.all(), [(p.pk, next_version(), {"score": 1}) for p in profiles])
    assert len(write_statements(queries.captured_queries)) == 1


def test_batches_split_rows_not_updates_of_one_row(profile: Profile) -> None:
    other = Profile.objects.create(name="o")
    v = [next_version() for _ in range(4)]
    updates = [
        (profile.pk, v[3], {"score": 4}),
        (other.pk, v[0], {"score": 1}),
        (profile.pk, v[1], {"score": 2}),
        (other.pk, v[2], {"score": 3}),
    ]
    assert bulk_update_if_newer(Profile.objects.all(), updates, batch_size=1) == BulkResult(applied=2, stale=2)
    assert (state(profile.pk)["score"], state(other.pk)["score"]) == (4, 3)


def test_works_on_any_lock_version_model() -> None:
    doc = Document.objects.create(title="a")
    version = next_version()
    result = bulk_update_if_newer(Document.objects.all(), [(doc.pk, version, {"title": "b", "body": "text"})])
    assert result == BulkResult(applied=1)
    doc.refresh_from_db()
    assert (doc.title, doc.body, doc.field_versions["title"]) == ("b", "text", version)
    assert doc.lock_version > version


def test_the_per_row_path_writes_only_rows_with_news() -> None:
    """The per-row path (a child of multi-table inheritance; every model on SQLite) reads the batch's
    versions first and goes on only with the rows where a field is newer: an older update, or the same
    batch again (a field already at that version), runs nothing after that read (no lock, no UPDATE)."""
    restaurant = Restaurant.objects.create(name="r")
    older, newer = next_version(), next_version()
    assert bulk_update_if_newer(Restaurant.objects.all(), [(restaurant.pk, newer, {"seats": 5})]) == BulkResult(
        applied=1
    )
    with CaptureQueriesContext(connection) as queries:
        again = bulk_update_if_newer(Restaurant.objects.all(), [(restaurant.pk, newer, {"seats": 5})])
        late = bulk_update_if_newer(Restaurant.objects.all(), [(restaurant.pk, older, {"seats": 7})])
    assert (again, late) == (BulkResult(stale=1), BulkResult(stale=1))
    ran = [q["sql"] for q in queries.captured_queries if '"testapp_' in q["sql"]]  # the records' tables
    assert len(ran) == 2 and all(sql.startswith("SELECT") for sql in ran)  # the read of the versions, per call
    restaurant.refresh_from_db()
    assert (restaurant.seats, restaurant.field_versions["seats"]) == (5, newer)


def test_a_model_without_versions_is_refused() -> None:
    with pytest.raises(InvalidUpdate, match=r"contenttypes\.ContentType has no per-field versions"):
        bulk_update_if_newer(ContentType.objects.all(), [(1, 5, {"model": "x"})])


@pytest.mark.parametrize(
    ("updates", "message"),
    [
        ([(1, 5, {"nope": 1})], "updates[1]: testapp.Profile has no field 'nope'"),
        ([(1, 0, {"active": True})], "updates[1]: version must be a positive integer"),
        ([(1, True, {"active": True})], "updates[1]: version must be a positive integer"),
        ([(1, "7", {"active": True})], "updates[1]: version must be a positive integer"),
        ([("x", 5, {"active": True})], "updates[1]: testapp.Profile: invalid primary key 'x'"),
        ([(None, 5, {"active": True})], "updates[1]: testapp.Profile: a primary key is required"),
        ([(1, 5, {})], "updates[1]: testapp.Profile: an update needs at least one field=value change"),
        ([(1, 5, {"lock_version": 3})], "updates[1]: testapp.Profile.lock_version is managed by safeupdates"),
        ([(1, 5, {"field_versions": {}})], "updates[1]: testapp.Profile.field_versions is managed"),
        ([(1, 5, {"pk": 3})], "updates[1]: testapp.Profile: the primary key cannot be updated"),
        ([(1, 5, {"score": "many"})], "updates[1]: testapp.Profile.score='many' is invalid"),
        ([(1, 5, {"name": "x" * 21})], "updates[1]: testapp.Profile.name="),
        ([(1, 5)], "updates[1]: expected a (pk, version, changes) tuple"),
        (["abc"], "updates[1]: expected a (pk, version, changes) tuple"),
        ([(1, 5, [("active", True)])], "updates[1]: changes must be a mapping"),
    ],
)
def test_bad_input_raises_and_writes_nothing(profile: Profile, updates: list[Any], message: str) -> None:
    before = state(profile.pk)
    good = (profile.pk, next_version(), {"active": True})
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidUpdate) as excinfo:
        Profile.objects.bulk_update_if_newer([good, *updates])
    assert str(excinfo.value).startswith(message), str(excinfo.value)
    assert str(excinfo.value).endswith("Nothing was written.")
    assert write_statements(queries.captured_queries) == []
    assert state(profile.pk) == before


@pytest.mark.parametrize("updates", [None, 5, "abc", {1: (5, {})}])
def test_updates_must_be_an_iterable_of_tuples(updates: Any) -> None:
    with pytest.raises(InvalidUpdate, match="updates must be an iterable of"):
        Profile.objects.bulk_update_if_newer(updates)


@pytest.mark.parametrize("batch_size", [0, -1, True, 1.5])
def test_batch_size_must_be_positive(batch_size: Any) -> None:
    with pytest.raises(InvalidUpdate, match="batch_size must be a positive integer"):
        bulk_update_if_newer(Profile.objects.all(), [], batch_size=batch_size)


# --- property: bulk in any order and chunking == update_if_newer one by one, in version order ---

values = {
    "active": st.booleans(),
    "newsletter": st.booleans(),
    "dark_mode": st.booleans(),
    "score": st.integers(-5, 5),
    "name": st.sampled_from(["a", "b", "c", "d"]),
}
changes_strategy = st.dictionaries(st.sampled_from(FIELDS), st.none(), min_size=1).flatmap(
    lambda keys: st.fixed_dictionaries({name: values[name] for name in keys})
)
initial_versions = st.fixed_dictionaries(
    {"*": st.integers(1, 40)}, optional={name: st.integers(1, 60) for name in FIELDS}
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[dict[str, int]], list[tuple[int, int, dict[str, Any]]], list[int], int]:
    """Initial ``field_versions`` of up to 4 rows; updates of those rows (row index 4 is missing) with
    unique versions; an input order (a permutation); chunk sizes; a batch size."""
    rows = draw(st.lists(initial_versions, min_size=1, max_size=4))
    count = draw(st.integers(1, 12))
    versions = draw(st.lists(st.integers(1, 80), min_size=count, max_size=count, unique=True))
    updates = [(draw(st.integers(0, len(rows))), v, draw(changes_strategy)) for v in versions]
    order = draw(st.permutations(range(count)))
    cuts = sorted(draw(st.lists(st.integers(1, max(1, count - 1)), max_size=3)))
    return rows, [updates[i] for i in order], cuts, draw(st.integers(1, 4))


def chunks(items: Sequence[Update], cuts: Sequence[int]) -> Iterator[Sequence[Update]]:
    start = 0
    for cut in [*cuts, len(items)]:
        if cut > start:
            yield items[start:cut]
            start = cut


def expected_counts(initial: dict[Any, dict[str, int]], parts: Sequence[Sequence[Update]]) -> BulkResult:
    """The counts promised: per call, an update counts as applied iff it is its row's newest update of
    some field in that call, and that field's stored version was older."""
    stored = {pk: dict(versions) for pk, versions in initial.items()}
    applied = stale = missing = 0
    for part in parts:
        newest: dict[tuple[Any, str], int] = {}
        for pk, version, changes in part:
            for name in changes:
                newest[pk, name] = max(version, newest.get((pk, name), 0))
        passing = {
            key: version
            for key, version in newest.items()
            if key[0] in stored and stored[key[0]].get(key[1], stored[key[0]]["*"]) < version
        }
        for pk, version, changes in part:
            if pk not in stored:
                missing += 1
            elif any(passing.get((pk, name)) == version for name in changes):
                applied += 1
            else:
                stale += 1
        for (pk, name), version in passing.items():
            stored[pk][name] = version
    return BulkResult(applied, stale, missing)


@pytest.fixture(params=["native", "per_row"])
def writer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each database's own writer, and the portable one-statement-per-row writer on every database."""
    if request.param == "per_row":
        monkeypatch.setattr(bulk, "write_rows", bulk._write_per_row)
    return str(request.param)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=scenarios())
def test_bulk_in_any_order_and_chunking_equals_sequential_update_if_newer(writer: str, scenario: Any) -> None:
    initial, updates, cuts, batch_size = scenario
    while next_version() < 80:  # the scenario's versions must have been handed out by the source
        pass
    profiles = Profile.objects.bulk_create([Profile(name="init") for _ in initial])
    pks = [p.pk for p in profiles] + [max(p.pk for p in profiles) + 10_000]  # the last one is missing
    snapshots = {}
    for pk, versions in zip(pks, initial, strict=False):
        snapshots[pk] = {"field_versions": versions, "lock_version": max(versions.values())}
        set_state(pk, snapshots[pk])
    updates = [(pks[row], version, changes) for row, version, changes in updates]

    missing_sequential = 0
    for pk, version, changes in sorted(updates, key=lambda u: u[1]):
        result = Profile.objects.update_if_newer(pk, version=version, **changes)
        missing_sequential += result.outcome is Outcome.MISSING
    sequential = {pk: state(pk) for pk in pks}

    for pk, snapshot in snapshots.items():
        set_state(
            pk, {**snapshot, "active": False, "newsletter": False, "dark_mode": False, "score": 0, "name": "init"}
        )
    parts = list(chunks(updates, cuts))
    total = BulkResult()
    for part in parts:
        result = bulk_update_if_newer(Profile.objects.all(), part, batch_size=batch_size)
        total = BulkResult(total.applied + result.applied, total.stale + result.stale, total.missing + result.missing)

    assert {pk: state(pk) for pk in pks} == sequential
    assert total == expected_counts({pk: s["field_versions"] for pk, s in snapshots.items()}, parts)
    assert total.missing == missing_sequential
    assert total.total == len(updates)


# --- concurrency: real threads on PostgreSQL ---


@pytest.mark.django_db(transaction=True)
def test_concurrent_overlapping_batches_neither_deadlock_nor_lose_a_field(postgres_only: None) -> None:
    profiles = Profile.objects.bulk_create([Profile(name=str(i)) for i in range(20)])
    rng = random.Random(4)
    updates: list[Update] = []
    for _ in range(600):
        field = rng.choice(("active", "newsletter", "dark_mode"))
        updates.append((rng.choice(profiles).pk, next_version(), {field: rng.random() < 0.5}))
    expected: dict[tuple[Any, str], bool] = {}
    for pk, _version, changes in updates:  # in version order: the last one wins
        for name, value in changes.items():
            expected[pk, name] = value
    # Every thread gets every update, in its own order and chunking: many overlapping row locks.
    results: list[BulkResult] = []
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        mine = list(updates)
        random.Random(seed).shuffle(mine)
        try:
            for start in range(0, len(mine), 97):
                results.append(bulk_update_if_newer(Profile.objects.all(), mine[start : start + 97], batch_size=7))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    for (pk, name), value in expected.items():
        assert getattr(Profile.objects.using(DEFAULT_DB_ALIAS).get(pk=pk), name) is value
    # Each (row, field) winner is written exactly once across all threads.
    assert sum(r.total for r in results) == 4 * len(updates)
    assert sum(r.missing for r in results) == 0
    for profile in Profile.objects.all():
        assert profile.lock_version > max(v for pk, v, _c in updates if pk == profile.pk)
