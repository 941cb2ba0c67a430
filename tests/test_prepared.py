"""The guarded writes and the checked save() run as prepared statements on PostgreSQL; enqueue_update() is
one INSERT."""

from __future__ import annotations

import asyncio
import datetime
import random
import threading
import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import SynchronousOnlyOperation
from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    connection,
    connections,
    transaction,
)
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from safeupdates.database.cursors import _cursors, fetch_one, statement_cursor
from safeupdates.database.errors import is_transient
from safeupdates.database.internals import prepared_cursor_class
from safeupdates.database.statements import SAVE_VERSION_CTE
from safeupdates.exceptions import StaleObjectError
from safeupdates.jobs import enqueue_update
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.testapp.models import Document, Profile, Specimen

pytestmark = pytest.mark.django_db


def prepared_statements(prefix: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", [f"{prefix}%"])
        return int(cursor.fetchone()[0])


def prepared_guarded_statements() -> int:
    return prepared_statements("WITH upd AS")


def test_the_recorded_guarded_write_is_prepared_once_per_connection(postgres_only: None) -> None:
    profile = Profile.objects.create(name="p")
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    for value in (True, False, True):
        Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=value)
    assert prepared_guarded_statements() == 1
    profile.refresh_from_db()
    assert profile.active is True


def test_prepared_statements_can_be_turned_off(postgres_only: None, settings) -> None:
    settings.SAFEUPDATES_PREPARED_STATEMENTS = False
    profile = Profile.objects.create(name="p")
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=True)
    assert prepared_guarded_statements() == 0


def test_logged_queries_show_the_statement_with_its_values(postgres_only: None) -> None:
    profile = Profile.objects.create(name="p")
    rid = uuid.uuid4()
    with CaptureQueriesContext(connection) as queries:
        Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True)
    # In a transaction (as here) the statement runs in a savepoint: it fails whole on a concurrent claim.
    assert [q["sql"] for q in queries.captured_queries if rid.hex in q["sql"]]


def test_enqueue_update_is_one_insert_and_a_known_request_id_keeps_the_transaction_usable(
    postgres_only: None, redis
) -> None:
    profile = Profile.objects.create(name="p")
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            first = enqueue_update(profile, active=True)
        assert [q["sql"].split()[0] for q in queries.captured_queries] == ["INSERT"]
        again = enqueue_update(profile, request_id=first.request_id, active=False)
        assert again.pk == first.pk and again.version == first.version
        assert Profile.objects.filter(pk=profile.pk).exists()  # the transaction is not aborted
    assert ProcessedRequest.objects.filter(request_id=first.request_id).count() == 1
    assert first.version > 0 and first.created_at is not None and not first._state.adding


def prepared_saves() -> int:
    return prepared_statements(SAVE_VERSION_CTE)


def test_a_save_is_one_statement_prepared_once_per_connection(postgres_only: None) -> None:
    profile = Profile.objects.create(name="p")
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    for value in (True, False, True):
        profile.active = value
        profile.save()
    assert prepared_saves() == 1
    assert Profile.objects.get(pk=profile.pk).active is True


def test_a_save_is_not_prepared_when_prepared_statements_are_off(postgres_only: None, settings: Any) -> None:
    settings.SAFEUPDATES_PREPARED_STATEMENTS = False
    profile = Profile.objects.create(name="p")
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    profile.active = True
    profile.save()
    assert prepared_saves() == 0
    assert Profile.objects.get(pk=profile.pk).active is True


@pytest.mark.django_db(transaction=True)
def test_a_stale_save_in_a_transaction_keeps_the_prepared_statements(postgres_only: None) -> None:
    """psycopg forgets every prepared statement on a ROLLBACK, also ROLLBACK TO SAVEPOINT: a stale save
    rolls nothing back (its UPDATE matched no row), so the connection keeps them."""
    profile = Profile.objects.create(name="p")
    stale = Profile.objects.get(pk=profile.pk)
    profile.save()
    with transaction.atomic():
        profile.save()  # prepares the save's statement on this connection
        prepared = prepared_saves()
        stale.name = "stale"
        with pytest.raises(StaleObjectError):
            stale.save()
        assert prepared_saves() == prepared > 0


@pytest.mark.django_db(transaction=True)
def test_the_kept_cursor_follows_a_new_connection_and_other_threads(postgres_only: None) -> None:
    """The prepared cursor is kept per thread and database; a closed connection's is never used again."""
    profile = Profile.objects.create(name="p")
    with statement_cursor(connection) as first:
        kept = first.cursor
    connection.close()
    Profile.objects.update_if_newer(profile.pk, version=next_version(), active=False)
    with statement_cursor(connection) as second:
        assert second.cursor is not kept and second.cursor.connection is connection.connection
    with statement_cursor(connection) as again:
        assert again.cursor is second.cursor  # made once, kept open
    elsewhere: list[Any] = []

    def other_thread() -> None:
        other = connections["default"]
        try:
            with statement_cursor(other) as cursor:
                elsewhere.append(cursor.cursor)
        finally:
            other.close()

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert elsewhere and elsewhere[0] is not second.cursor
    assert _cursors.by_alias["default"] is second.cursor
    profile.refresh_from_db()
    assert profile.active is False


#: A value per field of Specimen for save number ``i`` (update_fields subsets of these give the shapes).
SHAPE_VALUES: dict[str, Any] = {
    "text": lambda i: f"text {i}",
    "big": lambda i: i * 7,
    "ratio": lambda i: i / 4,
    "amount": lambda i: Decimal(i) / 8,
    "day": lambda i: datetime.date(2026, 1, 1) + datetime.timedelta(days=i),
    "odd": lambda i: f"odd {i}",
    "shout": lambda i: f"s{i}",
    "shade": lambda i: "dark" if i % 2 else "light",
    "level": lambda i: 1 + i % 2,
    "token": lambda i: uuid.UUID(int=i),
    "data": lambda i: {"i": i},
    "address": lambda i: f"10.0.{i // 256}.{i % 256}",
}


@pytest.mark.django_db(transaction=True)
def test_a_hundred_shapes_of_save_with_rollbacks_to_savepoints_between_them() -> None:
    """120 saves of 120 shapes (``update_fields`` subsets) in one transaction, each followed by a
    statement that fails in a savepoint (on PostgreSQL psycopg then forgets every prepared statement:
    each shape is prepared again): every save stores its values and takes its version."""
    shapes = sorted({tuple(sorted(random.Random(n).sample(sorted(SHAPE_VALUES), k=1 + n % 6))) for n in range(400)})
    assert len(shapes) >= 120
    shapes = shapes[:120]
    specimen = Specimen.objects.create()
    expected = {name: getattr(specimen, name) for name in SHAPE_VALUES}
    with transaction.atomic():
        for i, shape in enumerate(shapes):
            for name in shape:
                expected[name] = SHAPE_VALUES[name](i)
                setattr(specimen, name, expected[name])
            for _ in range(2):  # the second save of a shape prepares it (the first runs unprepared)
                before = specimen.lock_version
                specimen.save(update_fields=shape)
                assert specimen.lock_version > before
            if connection.vendor == "postgresql":
                assert prepared_saves() >= 1  # this shape's, prepared again after the last rollback
            with pytest.raises(IntegrityError), transaction.atomic():
                Profile.objects.create(score=-13)  # a check constraint: ROLLBACK TO SAVEPOINT
    stored = Specimen.objects.get(pk=specimen.pk)
    assert {name: getattr(stored, name) for name in SHAPE_VALUES} == {**expected, "shout": expected["shout"].upper()}
    assert stored.lock_version == specimen.lock_version
    assert not Profile.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_recorded_write_in_autocommit_is_one_statement_without_a_transaction(postgres_only: None) -> None:
    """The statement records the request and writes the row at once: no BEGIN, no savepoint around it."""
    profile = Profile.objects.create(name="p")
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=True)
    version = next_version()  # the content type is cached now, the version issued
    with CaptureQueriesContext(connection) as queries:
        Profile.objects.update_if_newer(profile.pk, version=version, request_id=uuid.uuid4(), active=False)
    assert [query["sql"].split()[0] for query in queries.captured_queries] == ["WITH"]
    profile.refresh_from_db()
    assert profile.active is False and profile.lock_version > version


def test_a_prepared_statement_runs_on_the_bare_cursor_while_nothing_would_see_the_wrapper(
    postgres_only: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an execute_wrapper() and without query logging, no Django cursor wrapper is made for a
    prepared statement; with either, the statement goes through one (and is seen)."""
    profile = Profile.objects.create(name="p")
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=True)
    wrapped: list[Any] = []
    make_cursor = connection.make_cursor

    def wrap(cursor: Any) -> Any:
        if isinstance(cursor, prepared_cursor_class()):  # not the ORM's own cursors
            wrapped.append(cursor)
        return make_cursor(cursor)

    monkeypatch.setattr(connection, "make_cursor", wrap)
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=False)
    profile.refresh_from_db()
    profile.name = "saved"
    profile.save()
    assert wrapped == []
    seen: list[str] = []

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    rid = uuid.uuid4()
    with connection.execute_wrapper(watch):
        Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True)
    assert len(wrapped) == 1 and any("WITH upd AS" in sql for sql in seen)
    assert ProcessedRequest.objects.get(request_id=rid).status == "applied"


def test_a_prepared_statement_on_the_bare_cursor_keeps_django_s_checks_and_errors(postgres_only: None) -> None:
    """What Django's cursor does around a statement, the bare cursor's path does too: database errors come
    as Django's, a broken transaction refuses further statements, another thread's connection is refused."""
    with pytest.raises(DataError), transaction.atomic():  # a savepoint: the test's transaction goes on
        fetch_one(connection, "SELECT 1 / %s", [0], prepared=True)
    with transaction.atomic():
        transaction.set_rollback(True)  # as an error caught inside the block leaves it
        with pytest.raises(TransactionManagementError):
            fetch_one(connection, "SELECT 1", prepared=True)
    assert fetch_one(connection, "SELECT 2", prepared=True) == (2,)
    refused: list[BaseException] = []
    ours = connections["default"]  # this thread's connection object (`connection` is a proxy to the caller's)

    def other_thread() -> None:
        try:
            fetch_one(ours, "SELECT 1", prepared=True)
        except DatabaseError as exc:
            refused.append(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert refused and "thread" in str(refused[0])

    async def in_an_event_loop() -> Any:
        return fetch_one(connection, "SELECT 1", prepared=True)

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(in_an_event_loop())


# -- a migration changes the type of a column that a prepared statement returns ---------------------------


@pytest.fixture
def lock_version_as_integer(postgres_only: None, transactional_db: None):
    """Another connection changes ``Document.lock_version`` to ``integer`` (as a deploy's migration would,
    while this process keeps its connection), and changes it back at the end."""
    table = connection.ops.quote_name(Document._meta.db_table)

    def alter(to: str) -> None:
        other = connections.create_connection("default")  # another session, as a migrate command's
        try:
            with other.cursor() as cursor:
                cursor.execute(f"ALTER TABLE {table} ALTER COLUMN lock_version TYPE {to}")
        finally:
            other.close()

    yield lambda: alter("integer")
    alter("bigint")
    if connection.connection is not None:  # this connection's statements, prepared for integer, go too
        connection.connection.execute("DEALLOCATE ALL")


def test_a_save_after_a_migration_changed_its_returned_column_type_is_prepared_again(lock_version_as_integer):
    """PostgreSQL refuses a prepared statement whose result type changed (0A000, "cached plan must not
    change result type") on every execution, for the life of the connection: in autocommit, nothing would
    clear psycopg's cache. The save prepares its statement again and is written."""
    document = Document.objects.create(title="a")
    for title in ("b", "c"):
        document.title = title
        document.save()
    lock_version_as_integer()
    for title in ("d", "e"):
        seen = document.lock_version
        document.title = title
        document.save()
        assert document.lock_version > seen
    saved = document.lock_version
    document.refresh_from_db()
    assert (document.title, document.lock_version) == ("e", saved)


def test_in_a_transaction_the_refusal_is_transient_and_the_next_transaction_prepares_again(lock_version_as_integer):
    """Inside a transaction the statement cannot run again (the transaction is aborted): the error is raised,
    and a job's retry cures it (transient: the request is retried, not rejected), since the rollback clears
    psycopg's prepared statements."""
    document = Document.objects.create(title="a")
    for title in ("a2", "b"):  # prepared by its second run
        document.title = title
        document.save()
    lock_version_as_integer()
    document.title = "c"
    with pytest.raises(DatabaseError) as refused, transaction.atomic():
        document.save()
    assert getattr(refused.value.__cause__, "sqlstate", None) == "0A000"
    assert is_transient(refused.value)
    assert Document.objects.get(pk=document.pk).title == "b"  # nothing written
    document.title = "d"
    with transaction.atomic():
        document.save()
    saved = document.lock_version
    document.refresh_from_db()
    assert (document.title, document.lock_version) == ("d", saved)


def test_other_features_not_supported_are_not_transient(postgres_only: None) -> None:
    """0A000 is feature_not_supported: only the plan's revalidation is the connection's state; any other is
    the statement's own and would fail again."""
    with pytest.raises(DatabaseError) as refused, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_class FOR UPDATE")  # not with an aggregate
    assert getattr(refused.value.__cause__, "sqlstate", None) == "0A000", refused.value
    assert not is_transient(refused.value)


@pytest.mark.django_db(transaction=True)
def test_a_statement_is_prepared_on_its_second_run_on_a_connection(postgres_only: None) -> None:
    """Preparing costs a round trip of its own (psycopg sends Parse and waits, then runs the statement):
    on a connection that runs a statement once (an RQ work horse's, a Celery task's without
    CONN_MAX_AGE) that doubled its cost. The first run goes unprepared, in one round trip; the second
    prepares it for the connection's later ones."""
    profile = Profile.objects.create(name="p")
    connection.close()  # a connection of its own, as a work horse's
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=True)
    assert prepared_guarded_statements() == 0
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=False)
    assert prepared_guarded_statements() == 1
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=uuid.uuid4(), active=True)
    assert prepared_guarded_statements() == 1
    profile.refresh_from_db()
    assert profile.active is True
