from __future__ import annotations

import uuid
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.admin import site
from django.contrib.contenttypes.models import ContentType
from django.urls import reverse
from django.utils import timezone

from safeupdates.admin import ProcessedRequestAdmin
from safeupdates.contrib.batches.models import Batch
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.testapp.models import Gadget, Profile

pytestmark = pytest.mark.django_db


@pytest.fixture
def recorded():
    profile = ProfileFactory()
    Profile.objects.update_if_newer(
        profile.pk, version=next_version(), request_id="6f1c1b4e-8a4e-4a55-9f41-6b1f0e1c2d3a", active=True
    )
    return profile, ProcessedRequest.objects.get()


def test_changelist_lists_filters_and_searches(admin_client, recorded):
    profile, request = recorded
    url = reverse("admin:safeupdates_processedrequest_changelist")
    page = admin_client.get(url).content.decode()
    assert str(request.request_id) in page
    assert reverse("admin:testapp_profile_change", args=[profile.pk]) in page  # link to the target
    assert admin_client.get(url, {"status__exact": "applied"}).content.decode().count(str(request.request_id)) >= 1
    assert str(request.request_id) not in admin_client.get(url, {"status__exact": "pending"}).content.decode()
    assert str(request.request_id) in admin_client.get(url, {"q": str(request.request_id)}).content.decode()
    assert (
        str(request.request_id)
        not in admin_client.get(url, {"q": "00000000-0000-0000-0000-000000000000"}).content.decode()
    )


def test_read_only(admin_client, recorded):
    _profile, request = recorded
    assert admin_client.get(reverse("admin:safeupdates_processedrequest_add")).status_code == 403
    change = admin_client.get(reverse("admin:safeupdates_processedrequest_change", args=[request.pk]))
    assert change.status_code == 200
    assert b'name="status"' not in change.content  # shown, not editable
    assert admin_client.post(reverse("admin:safeupdates_processedrequest_delete", args=[request.pk])).status_code == 403
    assert ProcessedRequest.objects.filter(pk=request.pk).exists()


def test_target_without_admin_is_plain_text(admin_client):
    request = ProcessedRequest(content_type=ContentType.objects.get_for_model(Gadget), object_id="7")
    assert ProcessedRequestAdmin(ProcessedRequest, site).target_link(request) == "testapp.gadget 7"
    assert ProcessedRequestAdmin(ProcessedRequest, site).target_link(ProcessedRequest(key="k")) == "k"


def test_request_whose_content_type_was_deleted(admin_client, recorded):
    _profile, request = recorded
    ProcessedRequest.objects.filter(pk=request.pk).update(content_type_id=987654)
    changelist = admin_client.get(reverse("admin:safeupdates_processedrequest_changelist"))
    assert changelist.status_code == 200 and b"content type 987654 (deleted)" in changelist.content
    change = admin_client.get(reverse("admin:safeupdates_processedrequest_change", args=[request.pk]))
    assert change.status_code == 200 and b"content type 987654 (deleted)" in change.content


# -- a request log that explains outcomes ------------------------------------------------------------------


def test_the_list_shows_what_each_request_wanted(admin_client, recorded):
    page = admin_client.get(reverse("admin:safeupdates_processedrequest_changelist")).content.decode()
    assert "active=True" in page


def test_a_stale_request_names_the_newer_write_that_holds_each_field(admin_client):
    profile = ProfileFactory()
    old, new = next_version(), next_version()
    Profile.objects.update_if_newer(profile.pk, version=new, request_id=uuid.uuid4(), active=True, score=2)
    Profile.objects.update_if_newer(profile.pk, version=old, request_id=uuid.uuid4(), active=False)
    stale = ProcessedRequest.objects.get(version=old)
    holder = ProcessedRequest.objects.get(version=new)
    assert stale.status == "stale"
    holder_url = reverse("admin:safeupdates_processedrequest_change", args=[holder.pk])

    page = unescape(
        admin_client.get(reverse("admin:safeupdates_processedrequest_change", args=[stale.pk])).content.decode()
    )
    assert f'active: held by v{new} (request <a href="{holder_url}">{holder.request_id}</a>)' in page
    listed = unescape(admin_client.get(reverse("admin:safeupdates_processedrequest_changelist")).content.decode())
    assert f"active: held by v{new}" in listed

    # A direct save that holds the field is named as one.
    fresh = Profile.objects.get(pk=profile.pk)
    fresh.save()
    page = unescape(
        admin_client.get(reverse("admin:safeupdates_processedrequest_change", args=[stale.pk])).content.decode()
    )
    held = Profile.objects.get(pk=profile.pk).field_version("active")
    assert f"active: held by v{held} (a direct save)" in page


def test_a_timestamp_mode_request_keeps_its_synced_at(admin_client):
    profile = ProfileFactory()
    newer, older = timezone.now() - timedelta(seconds=10), timezone.now() - timedelta(seconds=60)
    Profile.objects.update_if_newer(profile.pk, synced_at=newer, request_id=uuid.uuid4(), active=True)
    Profile.objects.update_if_newer(profile.pk, synced_at=older, request_id=uuid.uuid4(), active=False)
    applied, stale = ProcessedRequest.objects.order_by("id")
    assert (applied.synced_at, stale.synced_at) == (newer, older)
    assert stale.status == "stale"
    page = unescape(
        admin_client.get(reverse("admin:safeupdates_processedrequest_change", args=[stale.pk])).content.decode()
    )
    assert "the record was synced at" in page and "synced at" in page.lower()


def test_tasks_and_batch_items_show_their_key(admin_client):
    task = ProcessedRequest.objects.create(kind="task", key="refund:42", status="applied")
    item = ProcessedRequest.objects.create(kind="batch_item", key=f"{uuid.uuid4()}:3", status="failed", error="boom")
    assert str(task) == "task refund:42 (applied)"
    assert str(item) == f"batch item {item.key} (failed)"
    for request in (task, item):
        page = admin_client.get(
            reverse("admin:safeupdates_processedrequest_change", args=[request.pk])
        ).content.decode()
        assert "vNone" not in page and request.key in page


def test_the_model_filter_lists_only_models_that_use_the_app(admin_client, recorded):
    response = admin_client.get(reverse("admin:safeupdates_processedrequest_changelist"))
    spec = next(s for s in response.context["cl"].filter_specs if getattr(s, "field_path", "") == "content_type")
    # tests.django_contract's models (Django's test models with the mixin) include a versioned "User".
    labels = {str(label) for _pk, label in spec.lookup_choices if "django_contract" not in str(label).lower()}
    assert "testapp | profile" in {label.lower() for label in labels}
    assert not any("user" in label.lower() or "session" in label.lower() for label in labels)
    assert not any("reduce run" in label.lower() for label in labels)


def test_a_batch_with_failed_items_says_so_and_links_them(admin_client):
    batch = Batch.objects.create(item_func="x.y", queue="default", total=3, succeeded=1, failed=1)
    failed = ProcessedRequest.objects.create(
        kind="batch_item", key=f"{batch.batch_id}:1", status="failed", error="ValueError: bad"
    )
    applied = ProcessedRequest.objects.create(kind="batch_item", key=f"{batch.batch_id}:0", status="applied")
    batch.items.create(index=1, request_id=failed.request_id)
    batch.items.create(index=0, request_id=applied.request_id)
    page = admin_client.get(reverse("admin:safeupdates_batches_batch_change", args=[batch.pk])).content.decode()
    assert "1 item failed" in page
    assert reverse("admin:safeupdates_processedrequest_change", args=[failed.pk]) in page
    assert "ValueError: bad" in page
    listed = admin_client.get(reverse("admin:safeupdates_batches_batch_changelist")).content.decode()
    assert "1 failed" in listed


# -- searching the request log by a request id prefix (issue 20.10) --------------------------------------


def test_a_request_id_prefix_finds_the_request(admin_client, recorded):
    _profile, request = recorded
    url = reverse("admin:safeupdates_processedrequest_changelist")
    other = ProcessedRequest.objects.create(
        request_id="6f1c1b4f-0000-4000-8000-000000000000", kind="task", key="k", status="applied"
    )
    for term in ("6f1c1b4e", "6F1C1B4E-8A4E", " 6f1c1b4e8a4e4a55 ", str(request.request_id)):
        found = admin_client.get(url, {"q": term}).context["cl"].result_list
        assert [r.pk for r in found] == [request.pk], term
    assert {r.pk for r in admin_client.get(url, {"q": "6f1c1b4"}).context["cl"].result_list} == set()
    assert [r.pk for r in admin_client.get(url, {"q": "k"}).context["cl"].result_list] == [other.pk]
    page = admin_client.get(url).content.decode()
    assert "a prefix of 8 or more hex digits" in page


def test_the_prefix_search_is_a_range_on_the_unique_index(admin_client, recorded, postgres_only):
    """No text LIKE over every row: a range on the uuid, which the unique btree index answers."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    url = reverse("admin:safeupdates_processedrequest_changelist")
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get(url, {"q": "6f1c1b4e"}).status_code == 200
    listed = [q["sql"] for q in queries.captured_queries if 'FROM "safeupdates_processedrequest"' in q["sql"]]
    assert all("LIKE" not in sql.upper() and "::text" not in sql for sql in listed)
    searched = [sql for sql in listed if '"request_id" BETWEEN' in sql]
    assert len(searched) >= 2  # the search's exists(), the count and the page
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the table is small: ask what the index can do
        for sql in searched:
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan" not in plan and "safeupdates_processedrequest_request_id" in plan, plan


def test_the_model_filter_has_no_bare_dash_entry(admin_client, recorded):
    response = admin_client.get(reverse("admin:safeupdates_processedrequest_changelist"))
    spec = next(s for s in response.context["cl"].filter_specs if getattr(s, "field_path", "") == "content_type")
    labels = [str(choice["display"]) for choice in spec.choices(response.context["cl"])]
    assert "-" not in labels
    assert "No record (tasks, batch items)" in labels
