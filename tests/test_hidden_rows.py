"""Every internal read of a record sees every row (issue 46.2), as Django's own internal access does
(``Model._base_manager``): on a model whose default manager hides rows (soft delete, a tenant filter, a
published-only manager), ``Memo.objects`` leaves out the archived ones, and nothing safeupdates decides
may depend on that.

A stale write to a hidden row was recorded ``missing``; a multi-table child's stale request ``rejected:
the target object does not exist``; ``bulk_update_if_newer()`` skipped hidden rows that
``update_if_newer()`` writes; ``safeupdates_verify`` never looked at them.
"""

from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import call_command
from django.db import connection

from safeupdates import enqueue_update
from safeupdates.audit import find_drift, replay
from safeupdates.jobs import apply_update
from safeupdates.managers import Outcome
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.testapp.models import Memo, TaggedMemo

pytestmark = pytest.mark.django_db


def hidden(model: type[Memo] = Memo, **fields: object) -> Memo:
    """A row the model's default manager does not show (archived), with a newer save over an older version."""
    row = model.objects.create(archived=True, text="kept", **fields)
    assert not model.objects.filter(pk=row.pk).exists() and model._base_manager.filter(pk=row.pk).exists()
    return row


@pytest.mark.parametrize("model", [Memo, TaggedMemo], ids=["one table", "multi-table child"])
@pytest.mark.parametrize("with_request_id", [False, True], ids=["direct", "recorded"])
def test_a_stale_write_to_a_hidden_row_is_stale(model, with_request_id):
    old = next_version()
    row = hidden(model)  # saved after `old` was handed out: its save holds every field
    rid = uuid.uuid4() if with_request_id else None
    result = model.objects.update_if_newer(row.pk, version=old, request_id=rid, text="late")
    assert (result.applied, result.outcome) == (False, Outcome.STALE)
    assert model._base_manager.get(pk=row.pk).text == "kept"
    if with_request_id:
        request = ProcessedRequest.objects.get(request_id=rid)
        assert (request.status, request.error) == ("stale", "")


@pytest.mark.parametrize("model", [Memo, TaggedMemo], ids=["one table", "multi-table child"])
def test_a_newer_write_to_a_hidden_row_is_applied(model):
    row = hidden(model)
    result = model.objects.update_if_newer(row.pk, version=next_version(), request_id=uuid.uuid4(), text="new")
    assert result.outcome == Outcome.APPLIED
    assert model._base_manager.get(pk=row.pk).text == "new"


@pytest.mark.parametrize("model", [Memo, TaggedMemo], ids=["one table", "multi-table child"])
def test_bulk_writes_the_hidden_rows_that_update_if_newer_writes(model):
    shown, archived = model.objects.create(text="a"), hidden(model)
    version = next_version()
    result = model.objects.bulk_update_if_newer(
        [(shown.pk, version, {"pinned": True}), (archived.pk, version, {"pinned": True})]
    )
    assert (result.applied, result.stale, result.missing) == (2, 0, 0)
    assert model._base_manager.get(pk=archived.pk).pinned


def test_a_queued_request_for_a_hidden_row_is_applied():
    """The job path read records through the base manager already: kept so."""
    row = hidden()
    request = enqueue_update(row, text="queued")
    apply_update(str(request.request_id))
    request.refresh_from_db()
    assert (request.status, Memo._base_manager.get(pk=row.pk).text) == ("applied", "queued")


def test_verify_checks_the_hidden_rows_for_drift():
    """A value written around safeupdates in a hidden row is drift like any other."""
    row = hidden()
    Memo.objects.update_if_newer(row.pk, version=next_version(), request_id=uuid.uuid4(), text="requested")
    Memo._base_manager.filter(pk=row.pk).update(text="behind its back")
    [drift] = list(find_drift(Memo))
    assert (drift.pk, drift.field, drift.stored, drift.derived) == (row.pk, "text", "behind its back", "requested")
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("safeupdates_verify", "testapp.Memo", stdout=out, stderr=io.StringIO())
    assert exited.value.code == 1 and str(row.pk) in out.getvalue()


def test_replay_of_a_hidden_row():
    row = hidden()
    Memo.objects.update_if_newer(row.pk, version=next_version(), request_id=uuid.uuid4(), text="requested")
    assert replay(Memo._base_manager.get(pk=row.pk)) == {"text": "requested"}


def test_the_queries_that_decide_never_filter_by_the_default_manager():
    """The stale decision of a direct write reads the row without the default manager's filter."""
    old = next_version()
    row = hidden()
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        Memo.objects.update_if_newer(row.pk, version=old, text="late")
    assert not any('"archived"' in query["sql"] for query in queries.captured_queries), queries.captured_queries


# -- the surfaces that check a person's or a client's write: forms, HTTP, DRF, the admin -----------------


def moved_on(row: Memo) -> None:
    """Another write of the row's text since it was shown."""
    Memo.objects.update_if_newer(row.pk, version=next_version(), text="theirs")


def test_a_form_of_a_hidden_row_finds_its_conflict():
    from safeupdates.forms import SafeUpdateModelForm

    class MemoForm(SafeUpdateModelForm):
        class Meta:
            model = Memo
            fields = ["text", "pinned"]

    row = hidden()
    shown = MemoForm(instance=Memo._base_manager.get(pk=row.pk))
    data = {**shown.initial, "text": "mine"}
    moved_on(row)
    form = MemoForm(data, instance=Memo._base_manager.get(pk=row.pk))
    assert not form.is_valid()
    assert form.safeupdates_conflict is not None and form.safeupdates_conflict.fields == ["text"]


def test_a_lost_write_of_a_hidden_row_is_a_conflict_not_a_deleted_record():
    from safeupdates.conflicts import digests
    from safeupdates.http import lost_write

    row = Memo._base_manager.get(pk=hidden().pk)
    loaded, seen = row.lock_version, digests(row, ["text"])
    moved_on(row)
    answer = lost_write(row, loaded, precondition=True, fields=["text"], seen=seen, values=False)
    assert answer is not None and answer.status == 412
    assert "deleted" not in str(answer.body), answer.body
    assert [change["field"] for change in answer.body["changes"]] == ["text"], answer.body


def test_a_drf_update_of_a_hidden_row_is_a_conflict():
    pytest.importorskip("rest_framework")
    from rest_framework import serializers

    from safeupdates.contrib.drf import ConflictError, LockVersionSerializerMixin

    class MemoSerializer(LockVersionSerializerMixin, serializers.ModelSerializer):
        class Meta:
            model = Memo
            fields = ["text", "pinned"]

    row = Memo._base_manager.get(pk=hidden().pk)
    moved_on(row)
    serializer = MemoSerializer(row, data={"text": "mine", "lock_version": row.lock_version}, partial=True)
    assert serializer.is_valid(), serializer.errors
    with pytest.raises(ConflictError) as refused:
        serializer.save()
    assert refused.value.status_code == 409 and "text" in str(refused.value.detail)


def test_the_admin_refuses_an_edit_of_a_hidden_row_that_moved_on(admin_client):
    from django.urls import reverse

    from tests.htmlforms import form_data

    row = hidden()
    url = reverse("admin:testapp_memo_change", args=[row.pk])
    data = form_data(admin_client.get(url).content, "memo_form")
    moved_on(row)
    response = admin_client.post(url, {**data, "text": "mine", "_save": "Save"})
    assert response.status_code == 200
    assert "was changed by someone else after you opened it" in response.content.decode()
    assert "Text: now &#x27;theirs&#x27;" in response.content.decode()
    assert Memo._base_manager.get(pk=row.pk).text == "theirs"
