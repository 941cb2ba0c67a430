"""Transactions managed by hand (``transaction.set_autocommit(False)``, then ``commit()`` or ``rollback()``).

Django supports it beside ``atomic()``: statements run in a transaction the caller commits or rolls back,
``connection.in_atomic_block`` is False, and ``transaction.on_commit()`` outside an atomic block refuses
to run. Every write of safeupdates treats it as the caller's transaction, as it does an ``atomic()``
block: its outcome is announced, and its job enqueued, when the caller commits; nothing when it rolls back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import django_rq
import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models.signals import post_save

from safeupdates import enqueue_update, signals
from safeupdates.exceptions import StaleObjectError
from safeupdates.jobs import apply_update
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.factories import DocumentFactory
from tests.testapp import jobs
from tests.testapp.models import Chapter, Document, Profile, Restaurant, Truck

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def managed_by_hand() -> Iterator[None]:
    """Autocommit off, as Django's docs show; anything left open is rolled back, and autocommit is back."""
    transaction.set_autocommit(False)
    try:
        yield
    finally:
        if not connection.get_autocommit():
            transaction.rollback()
            transaction.set_autocommit(True)


def commit_and_leave() -> None:
    """Commit, then turn autocommit on again: Django runs the commit's on_commit callbacks then."""
    transaction.commit()
    transaction.set_autocommit(True)


@pytest.fixture
def applied() -> Iterator[list[dict[str, Any]]]:
    """The ``request_applied`` signals sent while the test runs."""
    sent: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    signals.request_applied.connect(receive, weak=False, dispatch_uid="test_manual_transactions")
    yield sent
    signals.request_applied.disconnect(dispatch_uid="test_manual_transactions")


@pytest.mark.parametrize("model", [Profile, Restaurant], ids=["one table", "two tables"])
class TestSave:
    def test_a_save_rolled_back_by_hand_saves_again(self, model: Any) -> None:
        """The rolled-back save's version stays on the instance; the row still carries the one before."""
        obj = model.objects.create(name="a")
        with managed_by_hand():
            obj.name = "b"
            obj.save()
            transaction.rollback()
            assert model.objects.get(pk=obj.pk).name == "a"
            obj.name = "c"
            obj.save()  # no false StaleObjectError
            commit_and_leave()
        assert model.objects.get(pk=obj.pk).name == "c"

    def test_after_a_rollback_by_hand_a_real_conflict_still_raises(self, model: Any, postgres_only: None) -> None:
        """PostgreSQL only: SQLite hands a rolled-back version out again (docs/limits.md)."""
        obj = model.objects.create(name="a")
        with managed_by_hand():
            obj.name = "b"
            obj.save()
            transaction.rollback()
            other = model.objects.get(pk=obj.pk)
            other.name = "other"
            other.save()
            transaction.commit()
            obj.name = "c"
            with pytest.raises(StaleObjectError):
                obj.save()
        assert model.objects.get(pk=obj.pk).name == "other"

    def test_a_save_committed_by_hand_is_the_rows_version(self, model: Any) -> None:
        obj = model.objects.create(name="a")
        with managed_by_hand():
            obj.name = "b"
            obj.save()
            commit_and_leave()
        stale = model.objects.get(pk=obj.pk)
        obj.name = "c"
        obj.save()
        stale.name = "d"
        with pytest.raises(StaleObjectError):
            stale.save()
        assert model.objects.get(pk=obj.pk).name == "c"

    @pytest.mark.parametrize("end", ["commit", "rollback"])
    def test_a_failing_post_save_receiver_by_hand(self, model: Any, end: str) -> None:
        """The row was written in the caller's transaction before the receiver failed: the caller decides,
        and either way the instance saves again."""
        obj = model.objects.create(name="a")

        def fail(**kwargs: Any) -> None:
            raise RuntimeError("the receiver fails")

        post_save.connect(fail, sender=model, weak=False, dispatch_uid="test_manual_transactions")
        try:
            with managed_by_hand():
                obj.name = "b"
                with pytest.raises(RuntimeError):
                    obj.save()
                if end == "commit":
                    commit_and_leave()
                else:
                    transaction.rollback()
                    transaction.set_autocommit(True)
        finally:
            post_save.disconnect(sender=model, dispatch_uid="test_manual_transactions")
        assert model.objects.get(pk=obj.pk).name == ("b" if end == "commit" else "a")
        obj.name = "c"
        obj.save()  # no false StaleObjectError
        assert model.objects.get(pk=obj.pk).name == "c"

    def test_a_stale_save_by_hand_writes_nothing(self, model: Any) -> None:
        obj = model.objects.create(name="a")
        other = model.objects.get(pk=obj.pk)
        other.save()
        with managed_by_hand():
            obj.name = "b"
            with pytest.raises(StaleObjectError):
                obj.save()
            commit_and_leave()  # whatever the refused save left in the transaction would commit here
        assert model.objects.get(pk=obj.pk).name == "a"


def test_a_stale_save_by_hand_of_a_model_below_a_plain_parent_writes_nothing() -> None:
    """``Truck``'s parent table is written before its versions: by hand too, its save runs in a savepoint,
    so the refused save leaves no parent row written in the caller's transaction."""
    truck = Truck.objects.create(wheels=4, load=1)
    Truck.objects.get(pk=truck.pk).save()
    with managed_by_hand():
        truck.wheels, truck.load = 6, 2
        with pytest.raises(StaleObjectError):
            truck.save()
        commit_and_leave()
    assert Truck.objects.filter(pk=truck.pk).values_list("wheels", "load").get() == (4, 1)


class TestDelete:
    def test_a_stale_delete_by_hand_deletes_nothing_it_cascades_to(self) -> None:
        """Django's collector deletes the chapters first, in an ``atomic(savepoint=False)`` that, with
        autocommit off, is the caller's transaction: the stale row must be refused before that."""
        document = DocumentFactory()
        Chapter.objects.create(document=document, title="c")
        stale = Document.objects.get(pk=document.pk)
        document.title = "moved on"
        document.save()
        with managed_by_hand():
            with pytest.raises(StaleObjectError):
                stale.delete()
            commit_and_leave()
        assert Chapter.objects.filter(document=document).count() == 1
        assert Document.objects.filter(pk=document.pk).exists()

    def test_a_delete_by_hand_that_rolls_back_can_be_done_again(self) -> None:
        document = DocumentFactory()
        Chapter.objects.create(document=document, title="c")
        with managed_by_hand():
            document.title = "saved, then rolled back"
            document.save()
            transaction.rollback()
            assert document.delete()[0] == 2
            commit_and_leave()
        assert not Document.objects.filter(title="saved, then rolled back").exists()
        assert not Chapter.objects.exists()


class TestRecordedUpdate:
    """``update_if_newer(..., request_id=...)``: written and recorded in the caller's transaction."""

    def test_it_is_announced_when_the_caller_commits(self, applied: list[dict[str, Any]]) -> None:
        profile = Profile.objects.create(name="a")
        rid = uuid.uuid4()
        with managed_by_hand():
            result = Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, name="b")
            assert result.applied
            assert applied == []  # not committed yet
            commit_and_leave()
        assert [sent["request_id"] for sent in applied] == [rid]
        assert Profile.objects.get(pk=profile.pk).name == "b"

    def test_nothing_is_announced_or_kept_when_the_caller_rolls_back(self, applied: list[dict[str, Any]]) -> None:
        profile = Profile.objects.create(name="a")
        rid = uuid.uuid4()
        with managed_by_hand():
            Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, name="b")
            transaction.rollback()
            transaction.set_autocommit(True)
        assert applied == []
        assert Profile.objects.get(pk=profile.pk).name == "a"
        assert not ProcessedRequest.objects.filter(request_id=rid).exists()

    def test_a_duplicate_is_announced_when_the_caller_commits(self) -> None:
        profile = Profile.objects.create(name="a")
        rid = uuid.uuid4()
        Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, name="b")
        duplicates: list[Any] = []

        def receive(sender: Any, **kwargs: Any) -> None:
            duplicates.append(kwargs["request_id"])

        signals.request_duplicate.connect(receive, weak=False, dispatch_uid="test_manual_duplicate")
        try:
            with managed_by_hand():
                result = Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, name="c")
                assert not result.applied
                assert duplicates == []
                commit_and_leave()
        finally:
            signals.request_duplicate.disconnect(dispatch_uid="test_manual_duplicate")
        assert duplicates == [rid]


class TestEnqueue:
    def test_the_job_is_enqueued_when_the_caller_commits(self, redis: Any) -> None:
        profile = Profile.objects.create(name="a")
        queue = django_rq.get_queue("default")
        with managed_by_hand():
            record = enqueue_update(profile, name="b")
            assert queue.count == 0
            commit_and_leave()
        assert queue.count == 1
        assert ProcessedRequest.objects.get(request_id=record.request_id).status == "pending"

    def test_nothing_is_enqueued_or_kept_when_the_caller_rolls_back(self, redis: Any, postgres_only: None) -> None:
        """PostgreSQL only: with autocommit off, SQLite cannot run ``atomic()`` (Django's docs, "Savepoints in
        SQLite"): the savepoint recording the request commits it (docs/limits.md)."""
        profile = Profile.objects.create(name="a")
        queue = django_rq.get_queue("default")
        with managed_by_hand():
            record = enqueue_update(profile, name="b")
            transaction.rollback()
            transaction.set_autocommit(True)
        assert queue.count == 0
        assert not ProcessedRequest.objects.filter(request_id=record.request_id).exists()


class TestGuardedWrite:
    def test_a_refused_write_by_hand_leaves_the_transaction_usable(self, postgres_only: None) -> None:
        """In autocommit the guarded UPDATE runs without a transaction around it; by hand, as in
        ``atomic()``, it needs a savepoint, or PostgreSQL refuses every later statement of the caller's."""
        profile = Profile.objects.create(name="p")
        with managed_by_hand():
            Profile.objects.create(name="the caller's")
            with pytest.raises(IntegrityError):
                Profile.objects.update_if_newer(profile.pk, version=next_version(), score=-13)  # the check
            Profile.objects.update_if_newer(profile.pk, version=next_version(), score=2)
            commit_and_leave()
        assert Profile.objects.get(pk=profile.pk).score == 2
        assert Profile.objects.filter(name="the caller's").exists()


class TestJobRunByHand:
    def test_a_failing_job_leaves_the_callers_transaction_to_the_caller(
        self, redis: Any, refusing_trigger: Any
    ) -> None:
        """A job called in the caller's transaction records nothing of its failure there (the caller
        decides), and never closes the connection, which would roll the caller's work back unseen."""
        refusing_trigger("40001")
        request = enqueue_update(Profile.objects.create(name="a"), name="forbidden")
        with managed_by_hand():
            Profile.objects.create(name="the caller's")
            with pytest.raises(DatabaseError, match="forbidden"):
                apply_update(str(request.request_id))
            commit_and_leave()
        assert Profile.objects.filter(name="the caller's").exists()
        request.refresh_from_db()
        assert (request.status, request.attempts) == ("pending", 0)

    def test_an_idempotent_task_leaves_the_callers_idle_timeout_alone(self, postgres_only: None) -> None:
        """The guard bounds how long a transaction of its own may idle; the caller's is not its own."""
        with connection.cursor() as cursor:
            cursor.execute("SHOW idle_in_transaction_session_timeout")
            own = cursor.fetchone()[0]
        with managed_by_hand():
            assert jobs.session_timeout("by hand") == own
            with connection.cursor() as cursor:
                cursor.execute("SHOW idle_in_transaction_session_timeout")
                assert cursor.fetchone()[0] == own
