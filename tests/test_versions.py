from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from safeupdates.database.statements import SEQUENCE_NAME
from safeupdates.exceptions import InvalidUpdate
from safeupdates.models import ProcessedRequest, VersionCounter
from safeupdates.versions import _next_from_counter, ensure_issued, last_issued, next_version, raise_floor
from tests.testapp.models import Profile
from tests.workers import run_threads


@pytest.mark.django_db
def test_strictly_increasing():
    values = [next_version() for _ in range(50)]
    assert values == sorted(set(values))


@pytest.mark.django_db
def test_counter_fallback_is_strictly_increasing_and_recreates_its_row():
    first = _next_from_counter("default")
    assert _next_from_counter("default") == first + 1
    from tests.factories import ProfileFactory

    profile = ProfileFactory()
    VersionCounter.objects.all().delete()
    # A lost counter row starts again above every version stored in a row, never at 1.
    again = _next_from_counter("default")
    assert again > profile.lock_version
    assert _next_from_counter("default") == again + 1


@pytest.mark.django_db
def test_counter_fallback_takes_a_version_in_one_statement_and_restarts_just_above_the_floor():
    from tests.factories import ProfileFactory

    first = _next_from_counter("default")  # the counter's row exists from here on
    with CaptureQueriesContext(connection) as queries:
        assert _next_from_counter("default") == first + 1
    assert len(queries) == 1, [query["sql"] for query in queries]
    profile = ProfileFactory()
    VersionCounter.objects.all().delete()
    assert _next_from_counter("default") == profile.lock_version + 1  # the highest version stored, plus one


@pytest.mark.django_db
def test_counter_fallback_takes_the_row_another_process_created_after_it_looked():
    """The counter's row is missing when the first statement looks, and another process creates it before
    the fallback writes: the fallback takes the next version of that row (inside its transaction), not a
    second row nor a restart from the floor."""
    VersionCounter.objects.all().delete()
    table = connection.ops.quote_name(VersionCounter._meta.db_table)
    looked = []

    def another_process_creates_the_row(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not looked and sql.lstrip().upper().startswith("UPDATE"):
            looked.append(sql)  # the first statement found no row: create it now, as a concurrent call would
            with connection.cursor() as cursor:
                cursor.execute(f"INSERT INTO {table} (id, value) VALUES (1, 41)")
        return result

    with connection.execute_wrapper(another_process_creates_the_row):
        assert _next_from_counter("default") == 42
    assert looked, "the counter was not read by an UPDATE"
    assert list(VersionCounter.objects.values_list("pk", "value")) == [(1, 42)]
    assert _next_from_counter("default") == 43


@pytest.mark.django_db
def test_purging_requests_does_not_move_versions_back(django_user_model):
    from tests.factories import ProfileFactory

    profile = ProfileFactory()
    from safeupdates import enqueue_update

    request = enqueue_update(profile, active=True)
    ProcessedRequest.objects.all().delete()
    assert next_version() > request.version


@pytest.mark.django_db(transaction=True)
def test_unique_across_threads():
    results: list[int] = []
    lock = threading.Lock()

    def allocate() -> None:
        got = [next_version() for _ in range(100)]
        with lock:
            results.extend(got)

    run_threads(allocate, 4)
    assert len(results) == 400
    if connection.vendor == "postgresql":
        assert len(set(results)) == 400


# --- the cache of ensure_issued, and the floor after a migrate (issue 19, item 3 and two mutation probes) ---


@pytest.fixture
def sequence() -> Iterator[Callable[[int], None]]:
    """Move the version source to a value (back, as a restore does): the sequence on PostgreSQL, the
    counter row elsewhere; moved up again after the test, above every version the test handed out, so
    that no later test gets a version already stored."""
    top = next_version() + 10**6

    def move(value: int) -> None:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT setval('{SEQUENCE_NAME}', %s)", [value])
        else:
            assert VersionCounter.objects.filter(pk=1).update(value=value) == 1

    yield move
    move(top + 10**6)


@pytest.mark.django_db
def test_a_version_above_a_sequence_that_moved_back_is_refused_once_read(sequence) -> None:
    sequence(next_version() + 1000)
    handed_out = next_version()
    sequence(handed_out - 100)  # restored from before `handed_out`
    with pytest.raises(InvalidUpdate):
        ensure_issued(handed_out + 1)  # above what this process saw: read again, and refused
    with pytest.raises(InvalidUpdate) as refused:
        ensure_issued(handed_out)  # above what was read: read again, never taken from the old cache
    assert str(refused.value) == (
        f"version {handed_out} has not been handed out by the version source yet (last: {handed_out - 100}); "
        "allocate versions with safeupdates.versions.next_version(), never make them up."
    )
    ensure_issued(handed_out - 100)


@pytest.mark.django_db
def test_the_floor_after_a_migrate_drops_the_cache(sequence) -> None:
    handed_out = next_version()  # handed out, never stored
    sequence(1)  # `migrate safeupdates zero` + `migrate` created the sequence again
    raise_floor()  # the post_migrate receiver: the sequence goes back above what is stored
    floor = last_issued()
    assert floor < handed_out
    with pytest.raises(InvalidUpdate, match=f"last: {floor}"):
        ensure_issued(handed_out)


@pytest.mark.django_db
def test_the_floor_counts_the_request_log(sequence, redis) -> None:
    from safeupdates import enqueue_update
    from tests.factories import ProfileFactory

    profile = ProfileFactory()
    logged = enqueue_update(profile, active=True).version  # above every lock_version stored
    sequence(1)
    raise_floor()
    assert next_version() > logged


@pytest.mark.django_db
def test_a_source_that_has_handed_out_nothing_has_issued_no_version(sequence) -> None:
    """A source created again (``migrate safeupdates zero`` + ``migrate`` over tables holding no version)
    has handed out nothing: its last version is 0, and version 1 is read and refused, never taken as
    issued (``last_issued`` 23 and ``ensure_issued`` 8 took an empty source's last version as 1)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT setval('{SEQUENCE_NAME}', 1, false)")  # a new sequence: nextval() is 1
    else:
        VersionCounter.objects.filter(pk=1).delete()
    raise_floor()  # the post_migrate receiver: nothing stored to move above; this process's cache dropped
    assert last_issued() == 0
    with pytest.raises(InvalidUpdate, match=r"version 1 has not been handed out .* \(last: 0\)"):
        ensure_issued(1)
    assert next_version() == 1
    ensure_issued(1)


@pytest.mark.django_db
def test_the_floor_never_moves_the_source_down() -> None:
    """A version handed out and never stored is above every stored one: the floor leaves the source
    where it is (``raise_floor`` 34 moved SQLite's counter down to what is stored, and the versions
    above it were handed out again)."""
    from tests.factories import ProfileFactory

    ProfileFactory()
    handed_out = next_version()
    raise_floor()
    assert next_version() > handed_out


@pytest.mark.django_db
def test_the_floor_makes_the_counters_row_again_at_what_is_stored() -> None:
    """Where the counter table is the source (SQLite), a ``flush`` deletes its one row; the floor after a
    ``migrate`` makes it again at the highest version stored (``raise_floor`` 28 and 29 made it at 0, or
    under a key the counter never reads)."""
    from tests.factories import ProfileFactory

    if connection.vendor == "postgresql":
        pytest.skip("PostgreSQL's source is its sequence")
    profile = ProfileFactory()
    VersionCounter.objects.all().delete()
    raise_floor()
    assert list(VersionCounter.objects.values_list("pk", "value")) == [(1, profile.lock_version)]
    assert next_version() == profile.lock_version + 1


@pytest.mark.django_db
def test_the_floor_reads_only_the_tables_this_database_has(sequence) -> None:
    """A router can keep a versioned model off a database, which then has no table for it: the floor
    reads the tables there are, and a ``migrate`` of that database goes on (``_stored_floor`` 6 read
    every model's table, and failed on the first one missing)."""
    from tests.django_contract.models import Car
    from tests.factories import ProfileFactory

    profile = ProfileFactory()
    Car.objects.create(make="Fiat", model="500")
    with connection.cursor() as cursor:  # inside the test's transaction: there again after it
        cursor.execute(f"DROP TABLE {connection.ops.quote_name(Car._meta.db_table)}")
    sequence(1)
    raise_floor()
    assert next_version() > profile.lock_version


@pytest.mark.django_db(transaction=True)
def test_the_newest_version_handed_out_costs_no_query_to_check(postgres_only: None) -> None:
    from tests.factories import ProfileFactory

    profile = ProfileFactory()
    version = next_version()
    with CaptureQueriesContext(connection) as queries:
        assert Profile.objects.update_if_newer(profile.pk, version=version, active=True).applied
    assert [query["sql"].split()[0] for query in queries.captured_queries] == ["UPDATE"]


@pytest.mark.django_db(transaction=True)
def test_a_version_costs_one_statement() -> None:
    """A sequence's nextval on PostgreSQL; on SQLite the counter's UPDATE, which returns its value."""
    next_version()
    with CaptureQueriesContext(connection) as queries:
        first = next_version()
        second = next_version()
    assert second > first
    assert len(queries.captured_queries) == 2, queries.captured_queries


@pytest.mark.django_db(transaction=True)
def test_a_flush_asks_the_floor_nothing_and_the_source_stays_above_what_is_stored() -> None:
    """``flush`` sends ``post_migrate`` too (every ``TransactionTestCase`` of a project flushes after each
    test). It empties every table and leaves the sequence where it was, so there is no floor to look for
    on PostgreSQL: no query per versioned table. The counter row it deletes (SQLite) is made again above
    what is stored."""
    from django.core.management import call_command

    from tests.factories import ProfileFactory

    ProfileFactory()
    handed_out = next_version()
    with CaptureQueriesContext(connection) as queries:
        call_command("flush", interactive=False, verbosity=0)
    floor = [q["sql"] for q in queries.captured_queries if "MAX(" in q["sql"].upper() or "setval" in q["sql"]]
    if connection.vendor == "postgresql":
        assert floor == []
    else:
        assert list(VersionCounter.objects.values_list("pk", "value")) == [(1, 0)]
    after = next_version()
    if connection.vendor == "postgresql":
        assert after > handed_out  # the sequence did not move
    else:
        assert after == 1  # the counter starts again above what is stored: nothing is
    assert Profile.objects.update_if_newer(ProfileFactory().pk, version=next_version(), active=True).applied


@pytest.mark.django_db(transaction=True)
def test_after_a_flush_a_version_inside_a_transaction_costs_one_statement() -> None:
    """On SQLite ``flush`` deletes the counter's row. Made again by the first version taken after it, inside
    a ``TestCase``'s transaction, it was rolled back with the test: every such test after a flush (all of a
    ``--keepdb`` run's, a project's ``TransactionTestCase`` having flushed last) looked for the floor again,
    one query per versioned table, and ``assertNumQueries`` counted them."""
    from django.core.management import call_command
    from django.db import transaction

    call_command("flush", interactive=False, verbosity=0)
    for _test in range(2):
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            next_version()
            transaction.set_rollback(True)
        assert len(queries.captured_queries) == 1, queries.captured_queries
