"""What the statement builders of :mod:`safeupdates.statements` refuse when called directly (every caller
in safeupdates validates its fields and its database first)."""

from __future__ import annotations

import types

import pytest
from django.core.exceptions import FieldDoesNotExist
from django.db import connection

from safeupdates.exceptions import SafeUpdatesError
from safeupdates.statements import guarded_update
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
