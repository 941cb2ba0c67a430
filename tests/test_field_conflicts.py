"""``save(update_fields=[...])`` is checked per field (issue 53): edits of different fields never conflict.

A save that names its fields conflicts only if one of them was written after the version at which the
instance read it (the row's per-field versions; a full save counts for every field), writes only those
fields and takes a fresh version. A full ``save()`` keeps the row-level rule. After a save that merged
over another writer's change, the instance never writes that stale value back: a later save of that
field, or a full save, is stale.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from django.db import transaction
from django.db.models.signals import post_save, pre_save
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from safeupdates.conflicts import changed_from_seen, digests, find_field_conflict
from safeupdates.exceptions import StaleObjectError
from safeupdates.models import only_changes
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.testapp.models import Profile, Restaurant, Specimen
from tests.workers import lock_waiters, start_threads

pytestmark = pytest.mark.django_db


def two_copies(**values):
    profile = ProfileFactory(**values)
    return Profile.objects.get(pk=profile.pk), Profile.objects.get(pk=profile.pk)


def stored(profile):
    return Profile.objects.get(pk=profile.pk)


def test_saves_of_different_fields_both_land():
    first, second = two_copies(name="a", active=False)
    first.name = "renamed"
    first.save(update_fields=["name"])
    second.active = True
    second.save(update_fields=["active"])
    row = stored(first)
    assert (row.name, row.active) == ("renamed", True)
    assert row.lock_version == second.lock_version > first.lock_version
    assert row.field_version("active") == second.lock_version
    assert row.field_version("name") == first.lock_version  # the second save kept the first one's entry


def test_saves_of_the_same_field_conflict_and_write_nothing():
    first, second = two_copies(name="a", active=False)
    first.name = "first"
    first.save(update_fields=["name"])
    before = stored(first)
    second.name, second.active = "second", True
    with pytest.raises(StaleObjectError, match=r"was changed after this instance read name;"):
        second.save(update_fields=["active", "name"])
    row = stored(first)
    assert (row.name, row.active, row.lock_version) == ("first", False, before.lock_version)
    assert (second.name, second.active) == ("second", True)  # as set: the refused save changed nothing


def test_a_full_save_counts_for_every_field():
    first, second = two_copies(name="a")
    first.note = "full"
    first.save()
    second.active = True
    with pytest.raises(StaleObjectError):
        second.save(update_fields=["active"])
    assert stored(first).active is False


def test_a_full_save_stays_row_level():
    first, second = two_copies(name="a")
    first.name = "renamed"
    first.save(update_fields=["name"])
    second.active = True
    with pytest.raises(StaleObjectError, match=r"was changed after it was loaded \(lock_version"):
        second.save()
    assert stored(first).active is False


class TestNoLostUpdateAfterAMerge:
    """The instance that merged over another writer's change does not hold that change: it never writes
    its stale value of that field back."""

    def merged(self):
        first, second = two_copies(name="a", active=False, score=1)
        first.name = "theirs"
        first.save(update_fields=["name"])
        second.active = True
        second.save(update_fields=["active"])  # merges over the change of name
        assert second.name == "a"  # not refreshed: the instance holds what it read
        return first, second

    def test_a_later_save_of_that_field_is_stale(self):
        _first, second = self.merged()
        with pytest.raises(StaleObjectError, match="read name"):
            second.save(update_fields=["name", "score"])
        assert stored(second).name == "theirs"
        assert stored(second).score == 1

    def test_a_later_full_save_is_stale(self):
        _first, second = self.merged()
        second.score = 5
        with pytest.raises(StaleObjectError):
            second.save()
        row = stored(second)
        assert (row.name, row.score) == ("theirs", 1)

    def test_a_later_save_of_other_fields_lands(self):
        _first, second = self.merged()
        second.score = 7
        second.save(update_fields=["score"])
        row = stored(second)
        assert (row.name, row.active, row.score) == ("theirs", True, 7)

    def test_its_own_fields_save_again(self):
        _first, second = self.merged()
        second.active = False
        second.save(update_fields=["active"])
        assert stored(second).active is False

    def test_a_refresh_reads_them_again(self):
        _first, second = self.merged()
        second.refresh_from_db()
        second.score = 9
        second.save()
        row = stored(second)
        assert (row.name, row.active, row.score) == ("theirs", True, 9)

    def test_a_refresh_of_that_field_reads_it_again(self):
        first, second = self.merged()
        second.refresh_from_db(fields=["name"])
        assert second.name == "theirs"
        second.name = "mine"
        second.save(update_fields=["name"])
        assert stored(first).name == "mine"

    def test_a_failed_save_keeps_what_it_knew(self):
        _first, second = self.merged()
        with pytest.raises(StaleObjectError):
            second.save(update_fields=["name"])
        with pytest.raises(StaleObjectError):  # still stale: the refusal forgot nothing
            second.save(update_fields=["name"])


def test_a_save_of_other_fields_keeps_every_field_s_version():
    first, second = two_copies()
    first.name = "x"
    first.save(update_fields=["name"])
    name_version = stored(first).field_version("name")
    second.score = 3
    second.save(update_fields=["score"])
    row = stored(first)
    assert row.field_version("name") == name_version
    assert row.field_version("score") == row.lock_version


def test_an_older_request_for_another_field_is_no_conflict():
    profile = ProfileFactory(name="a")
    older = next_version()
    loaded = Profile.objects.get(pk=profile.pk)
    assert Profile.objects.update_if_newer(profile.pk, version=older, active=True).applied
    loaded.name = "b"
    loaded.save(update_fields=["name"])
    row = stored(profile)
    assert (row.name, row.active, row.field_version("active")) == ("b", True, older)


def test_a_newer_request_for_that_field_is_a_conflict():
    profile = ProfileFactory(name="a")
    loaded = Profile.objects.get(pk=profile.pk)
    assert Profile.objects.update_if_newer(profile.pk, version=next_version(), name="request").applied
    loaded.name = "b"
    with pytest.raises(StaleObjectError):
        loaded.save(update_fields=["name"])
    assert stored(profile).name == "request"


def test_signals_get_the_fields_written():
    first, second = two_copies()
    first.name = "x"
    first.save(update_fields=["name"])
    got = []

    def receiver(sender, instance, update_fields, **kwargs):
        got.append((kwargs["signal"], None if update_fields is None else sorted(update_fields)))

    pre_save.connect(receiver, sender=Profile)
    post_save.connect(receiver, sender=Profile)
    try:
        second.active = True
        second.save(update_fields=["active"])
    finally:
        pre_save.disconnect(receiver, sender=Profile)
        post_save.disconnect(receiver, sender=Profile)
    assert got == [(pre_save, ["active"]), (post_save, ["active"])]


def test_a_multi_table_child_s_fields_are_checked_per_field():
    restaurant = Restaurant.objects.create(name="a", seats=1)
    first, second = Restaurant.objects.get(pk=restaurant.pk), Restaurant.objects.get(pk=restaurant.pk)
    first.name = "renamed"
    first.save(update_fields=["name"])
    second.seats = 5
    second.save(update_fields=["seats"])  # a field of the child's table
    row = Restaurant.objects.get(pk=restaurant.pk)
    assert (row.name, row.seats) == ("renamed", 5)
    first.seats = 9
    first.save(update_fields=["name", "open"])  # seats not named: no conflict
    with pytest.raises(StaleObjectError):
        first.save(update_fields=["seats"])
    assert Restaurant.objects.get(pk=restaurant.pk).seats == 5


def test_an_expression_is_checked_per_field_too():
    from django.db.models import F

    first, second = two_copies(score=1)
    first.name = "x"
    first.save(update_fields=["name"])
    second.score = F("score") + 1  # the ORM's compiled UPDATE, not the prepared statement
    second.save(update_fields=["score"])
    assert stored(first).score == 2
    first.score = F("score") + 10
    with pytest.raises(StaleObjectError):
        first.save(update_fields=["score"])
    assert stored(first).score == 2


class _Rollback(Exception):
    pass


def test_a_save_of_a_field_after_a_rolled_back_one_goes_through_over_another_writer_s_field(postgres_only):
    """A rolled-back save leaves its version on the instance (Django has no rollback hook), and the row
    never had it. Another writer moved the row on (a field this instance does not save): the next save
    of the same field is checked against the version the instance read, not the rolled-back one.
    (Found by tests/test_lock_version_property.py: allocate, guarded, rolled-back save, save.)"""
    profile = ProfileFactory(name="a")
    instance = Profile.objects.get(pk=profile.pk)
    Profile.objects.update_if_newer(profile.pk, version=next_version(), active=True)  # the row moves on
    with pytest.raises(_Rollback), transaction.atomic():
        instance.name = "b"
        instance.save(update_fields=["name"])
        raise _Rollback
    instance.name = "c"
    instance.save(update_fields=["name"])
    stored = Profile.objects.get(pk=profile.pk)
    assert (stored.name, stored.active) == ("c", True)
    # A lock_version set by hand above the row's still gets nothing through.
    other = Profile.objects.get(pk=profile.pk)
    other.lock_version = stored.lock_version + 1000
    other.name = "d"
    with pytest.raises(StaleObjectError):
        other.save(update_fields=["name"])


class TestOnlyChanges:
    """``only_changes()``: a surface's plain ``save()`` writes what the person changed and what was set since."""

    def test_writes_the_changed_fields_per_field(self):
        first, second = two_copies(name="a", active=False)
        first.name = "theirs"
        first.save(update_fields=["name"])
        second.active = True
        only_changes(second, ["active"])
        second.save()  # a plain save, as ModelForm.save() and ModelSerializer.update() call it
        row = stored(first)
        assert (row.name, row.active) == ("theirs", True)

    def test_writes_a_field_set_after_too(self):
        first, second = two_copies(name="a", score=0)
        first.name = "theirs"
        first.save(update_fields=["name"])
        second.active = True
        only_changes(second, ["active"])
        second.score = 5  # set by a save_model() override, say
        got = []

        def receiver(update_fields, **kwargs):
            got.append(sorted(update_fields))

        post_save.connect(receiver, sender=Profile)
        try:
            second.save()
        finally:
            post_save.disconnect(receiver, sender=Profile)
        assert got == [["active", "score"]]
        row = stored(first)
        assert (row.name, row.active, row.score) == ("theirs", True, 5)

    def test_a_json_value_changed_in_place_is_written(self):
        specimen = Specimen.objects.create(data={"a": 1})
        loaded = Specimen.objects.get(pk=specimen.pk)
        only_changes(loaded, [])
        loaded.data["b"] = 2  # changed in place, after
        loaded.save()
        assert Specimen.objects.get(pk=specimen.pk).data == {"a": 1, "b": 2}

    def test_the_same_field_changed_by_another_is_a_conflict(self):
        first, second = two_copies(name="a")
        first.name = "theirs"
        first.save(update_fields=["name"])
        second.name = "mine"
        only_changes(second, ["name"])
        with pytest.raises(StaleObjectError):
            second.save()
        assert stored(first).name == "theirs"

    def test_nothing_changed_writes_nothing(self):
        first, second = two_copies(name="a")
        first.name = "theirs"
        first.save(update_fields=["name"])
        version = stored(first).lock_version
        only_changes(second, [])
        second.save()
        assert stored(first).lock_version == version

    def test_only_the_next_save(self):
        profile = ProfileFactory(name="a")
        only_changes(profile, [])
        profile.save()
        profile.name = "b"
        profile.note = "c"
        profile.save()  # a full save again
        assert (stored(profile).name, stored(profile).note) == ("b", "c")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgres_only")
@pytest.mark.parametrize(("other", "both_land"), [("active", True), ("name", False)])
def test_two_connections_saving_at_the_same_moment(other, both_land):
    """Check and write are one statement: the second save waits on the first's row lock, then the
    database checks the row the first committed (READ COMMITTED's recheck), not the row it first saw."""
    profile = ProfileFactory(name="a", active=False)
    first, second = Profile.objects.get(pk=profile.pk), Profile.objects.get(pk=profile.pk)
    written, release = threading.Event(), threading.Event()
    refused: list[bool] = []

    def save_first():
        with transaction.atomic():
            first.name = "first"
            first.save(update_fields=["name"])
            written.set()
            assert release.wait(30)

    def save_second():
        setattr(second, other, "second" if other == "name" else True)
        try:
            second.save(update_fields=[other])
            refused.append(False)
        except StaleObjectError:
            refused.append(True)

    (holder,) = start_threads(save_first, 1)
    assert written.wait(30)
    (saver,) = start_threads(save_second, 1)
    deadline = time.monotonic() + 30
    while not lock_waiters() and time.monotonic() < deadline:
        time.sleep(0.01)  # the second save waits on the first's row lock
    assert lock_waiters()
    release.set()
    holder.join(30)
    saver.join(30)
    row = stored(profile)
    assert refused == [not both_land]
    assert (row.name, row.active) == (("first", True) if both_land else ("first", False))


# --- the property (hypothesis): only saves, so time and version order agree ----------------------------------

FIELDS = ("name", "active", "score")
VALUES = {"name": st.sampled_from(["a", "b", "c"]), "active": st.booleans(), "score": st.integers(0, 3)}
#: The model's fields the steps never name, which a full save writes all the same (dark_mode, note ...).
REST = "the other fields"
INSTANCES = 3


def save_step():
    instance = st.integers(0, INSTANCES - 1)
    changes = st.dictionaries(st.sampled_from(FIELDS), st.none(), min_size=1).flatmap(
        lambda picked: st.fixed_dictionaries({name: VALUES[name] for name in picked})
    )
    return st.one_of(
        st.tuples(st.just("load"), instance),
        st.tuples(st.just("refresh"), instance, st.sampled_from(FIELDS)),
        st.tuples(st.just("save"), instance, changes),
        st.tuples(st.just("full"), instance, changes),
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(save_step(), min_size=1, max_size=30))
# Found by CI: a full save after refreshing only the generated fields writes the other fields too, which
# another instance's full save wrote since this one read them: stale, as the code says.
@example(
    steps=[
        ("full", 0, {"name": "a"}),
        ("refresh", 1, "name"),
        ("refresh", 1, "active"),
        ("refresh", 1, "score"),
        ("save", 1, {"name": "a"}),
        ("full", 1, {"name": "a"}),
    ]
)
def test_a_save_fails_exactly_when_one_of_its_fields_was_written_since_it_was_read(steps):
    """Several instances of one row load, refresh and save some fields (or all). A save of some fields
    fails iff another successful save wrote one of them since this instance last read it; a full save iff
    another wrote any field since the instance took its lock_version (row-level), or since it read that
    field. Every field ends as the last successful save of it wrote it. A full save writes the model's
    other fields too: they are tracked together, as ``REST``, read by a load and written by a full save."""
    profile = ProfileFactory(name="a", active=False, score=0)
    values = {"name": "a", "active": False, "score": 0}
    clock = itertools.count(1)
    tracked = [*FIELDS, REST]
    written_at = dict.fromkeys(tracked, 0)  # when each field was last written, by the model's clock
    writer = dict.fromkeys(tracked, -1)  # which instance wrote it
    instances = [Profile.objects.get(pk=profile.pk) for _ in range(INSTANCES)]
    read_at = [dict.fromkeys(tracked, 0) for _ in range(INSTANCES)]  # when each instance last read each field
    versioned_at = [0] * INSTANCES  # when each took the lock_version it holds (a load, or its own save)

    for op, i, *args in steps:
        instance = instances[i]
        if op == "load":
            instances[i] = Profile.objects.get(pk=profile.pk)
            now = next(clock)
            read_at[i], versioned_at[i] = dict.fromkeys(tracked, now), now
            continue
        if op == "refresh":
            (name,) = args
            instance.refresh_from_db(fields=[name])
            read_at[i][name] = next(clock)
            continue
        (changes,) = args
        for name, value in changes.items():
            setattr(instance, name, value)
        names = list(changes) if op == "save" else tracked
        # Written by another instance's save since this one read it (its own writes it has read).
        moved = [n for n in names if written_at[n] > read_at[i][n] and writer[n] != i]
        if op == "full":
            # A full save stays row-level: any field another writer changed since the instance took its
            # lock_version, or since it read that field, if earlier (a save of other fields merged over it).
            moved = [n for n in tracked if written_at[n] > min(read_at[i][n], versioned_at[i]) and writer[n] != i]
        before = Profile.objects.get(pk=profile.pk)
        if moved:
            with pytest.raises(StaleObjectError):
                instance.save(update_fields=names) if op == "save" else instance.save()
            after = Profile.objects.get(pk=profile.pk)
            assert after.lock_version == before.lock_version, (op, i, changes)
        else:
            instance.save(update_fields=names) if op == "save" else instance.save()
            now = next(clock)
            versioned_at[i] = now
            for n in names:
                if n != REST:
                    values[n] = getattr(instance, n)
                written_at[n], writer[n], read_at[i][n] = now, i, now
        row = Profile.objects.get(pk=profile.pk)
        assert {n: getattr(row, n) for n in FIELDS} == values, (op, i, changes)


class TestWhatAPersonChanged:
    """The surfaces' rule (conflicts.py): a person's edit, measured against what that person was shown."""

    def test_an_edit_of_other_fields_is_no_conflict_and_the_same_field_is(self):
        profile = ProfileFactory(name="a", active=False)
        shown = Profile.objects.get(pk=profile.pk)
        seen_version, seen = shown.lock_version, digests(shown, ["name", "active"])
        other = Profile.objects.get(pk=profile.pk)
        other.name = "theirs"
        other.save(update_fields=["name"])
        edit = Profile.objects.get(pk=profile.pk)  # as a form loads it when the edit comes back,
        edit.name, edit.active = "a", True  # and sets what was posted: the name as shown, active changed
        changed = changed_from_seen(edit, seen, ["name", "active"])
        assert changed == ["active"]  # name differs from the row now, but the person did not change it
        assert find_field_conflict(edit, seen_version, seen, changed) is None
        edit.name = "mine"
        changed = changed_from_seen(edit, seen, ["name", "active"])
        conflict = find_field_conflict(stored(profile), seen_version, seen, changed)
        assert conflict is not None
        assert conflict.fields == ["name"]  # only the overlapping field
        assert conflict.changes[0].now == "theirs"

    def test_a_field_the_token_has_no_digest_of_counts_as_changed(self):
        profile = ProfileFactory(name="a")
        assert changed_from_seen(profile, {}, ["name"]) == ["name"]


def test_only_changes_leaves_an_insert_alone():
    """A copy saved as a new row (its key cleared, as the admin's "save as new" does) inserts every field."""
    profile = ProfileFactory(name="a", score=3)
    only_changes(profile, ["name"])
    profile.pk = None
    profile._state.adding = True
    profile.save()
    assert Profile.objects.filter(name="a", score=3).count() == 2
