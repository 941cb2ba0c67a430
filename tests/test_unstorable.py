"""A value no column can hold is refused by ``save()`` before any statement (issue 53): the refusal is both
:class:`~safeupdates.exceptions.InvalidUpdate` and Django's ``DataError``, which a plain ``save()`` raises for
it, so that code catching ``DatabaseError`` around ``save()`` (django-concurrency's own test
``test_trigger_do_not_increase_version_if_error`` does) still catches it; nothing is written.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, DataError, transaction

from safeupdates.exceptions import InvalidUpdate, UnstorableValue
from tests.factories import ProfileFactory
from tests.testapp.models import Profile

pytestmark = pytest.mark.django_db


def stored(profile):
    return Profile.objects.get(pk=profile.pk)


class TestAValueNoColumnCanHold:
    """Refused before any statement, as both InvalidUpdate and Django's DataError (what a plain save raises)."""

    def test_is_a_data_error(self):
        profile = ProfileFactory()
        profile.name = "x" * 21  # max_length=20
        with pytest.raises(DataError) as raised:
            profile.save()
        assert isinstance(raised.value, InvalidUpdate)
        assert isinstance(raised.value, UnstorableValue)
        assert raised.value.field == "name"
        assert stored(profile).name != profile.name

    def test_is_caught_as_a_database_error_and_the_transaction_goes_on(self):
        profile = ProfileFactory(score=1)
        with transaction.atomic():
            profile.name = "x" * 21
            with pytest.raises(DatabaseError):
                profile.save(update_fields=["name"])
            profile.refresh_from_db()
            profile.score = 2
            profile.save(update_fields=["score"])  # the transaction is usable: nothing was sent
        assert stored(profile).score == 2

    def test_a_value_the_field_cannot_convert(self):
        profile = ProfileFactory()
        profile.score = [1, 2]
        with pytest.raises(DataError):
            profile.save()
