"""What the statement builders of :mod:`safeupdates.statements` refuse when called directly (every caller
in safeupdates validates its fields and its database first)."""

from __future__ import annotations

import threading
import types

import pytest
from django.core.exceptions import FieldDoesNotExist
from django.db import connection

from safeupdates.database.statements import guarded_update, vendor_connection
from safeupdates.exceptions import SafeUpdatesError
from tests.testapp.models import Profile


def test_a_guarded_update_of_a_field_the_model_lacks_is_djangos_error():
    with pytest.raises(FieldDoesNotExist, match=r"^Profile has no field named 'nope'$"):
        guarded_update(Profile, ["active", "nope"], connection)


def test_a_guarded_update_for_another_database_vendor_names_the_database():
    legacy = types.SimpleNamespace(alias="legacy", vendor="oracle")  # all guarded_update reads of it
    with pytest.raises(
        SafeUpdatesError, match=r"^safeupdates supports PostgreSQL and SQLite; database 'legacy' is oracle\.$"
    ):
        guarded_update(Profile, ["active"], legacy)  # type: ignore[arg-type]


def test_a_guarded_update_of_a_name_that_is_no_identifier_is_refused():
    """Field names are spliced into the statement's JSON keys: anything but an identifier is refused, whatever
    validated it upstream."""
    with pytest.raises(SafeUpdatesError, match=r"^not a field name: 'active; --'$"):
        guarded_update(Profile, ["active; --"], connection)


def test_a_guarded_update_takes_the_rows_new_lock_version_where_there_is_no_sequence():
    """SQLite has no sequence to take the row's new lock_version from inside the statement: its caller
    passes one, and a call without it is refused with the reason. PostgreSQL takes it in the statement."""
    statement = guarded_update(Profile, ["active"], connection)
    given = {"pk": 1, "value0": True, "version0": 5}
    if connection.vendor == "postgresql":
        assert statement.params(1, [(True, 5)]) == statement.params(1, [(True, 5)], lock_version=6) == given
        return
    with pytest.raises(
        SafeUpdatesError, match=r"^a guarded update on this database needs the row's new lock_version\.$"
    ):
        statement.params(1, [(True, 5)])
    assert statement.params(1, [(True, 5)], lock_version=6) == {**given, "lock_version": 6}


@pytest.mark.parametrize("returned", ['{"active": 5}', b'{"active": 5}', {"active": 5}])
def test_the_versions_a_guarded_update_returns_are_read_as_text_or_as_json_decoded(returned):
    """The statement returns the row's new field_versions: psycopg 3 (as safeupdates reads it) and SQLite
    give text, a driver that decodes JSON itself (psycopg2's jsonb) a dict."""
    assert guarded_update(Profile, ["active"], connection).load_versions(returned) == {"active": 5}


def test_a_save_on_another_database_is_refused_by_name():
    """The system check refuses such a database first (E004); a save that gets there anyway is refused
    naming the vendor (``SaveTable.of`` 2: no message)."""
    from safeupdates.database.statements import SaveTable

    with pytest.raises(SafeUpdatesError) as raised:
        SaveTable.of(Profile, "mysql")
    assert str(raised.value) == "safeupdates supports PostgreSQL and SQLite, not mysql."


def test_a_vendors_connection_is_found_in_a_thread_that_made_none_and_is_not_opened() -> None:
    """Statements are built wherever the first save runs, a thread that touched no connection yet."""
    vendor, found = connection.vendor, []
    thread = threading.Thread(target=lambda: found.append(vendor_connection(vendor)))
    thread.start()
    thread.join()
    assert [c.vendor for c in found] == [vendor]
    assert found[0].connection is None
