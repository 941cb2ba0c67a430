"""The request log shows a request's values only to a viewer who may view its target model (issue 46.3).

A staff user with only the request log's view permission read, in its list, on a request's page and on
the status page, the values of models whose own admin refuses that user (403). Now the values (the
changes, and an error that may quote them) are hidden there, and the row says why; the record's model, its
key and the request's status stay visible, as the log's own data.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.db import transaction
from django.test import Client
from django.urls import path, reverse

from safeupdates import enqueue_update
from safeupdates.admin import ProcessedRequestAdmin
from safeupdates.models import ProcessedRequest
from tests.factories import ProfileFactory
from tests.testapp.admin import ProfileAdmin
from tests.testapp.models import ActiveOnlyProfile, Gadget, Profile

pytestmark = pytest.mark.django_db

SECRET = "s3cret-value"
CHANGELIST = "admin:safeupdates_processedrequest_changelist"
HIDDEN = "hidden: you may not view testapp.profile"


def staff(django_user_model, *perms: str) -> Client:
    user = django_user_model.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", password="x", is_staff=True)
    for perm in ("safeupdates.view_processedrequest", *perms):
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client()
    client.force_login(user)
    return client


def request_with_a_secret() -> ProcessedRequest:
    with transaction.atomic():
        return enqueue_update(ProfileFactory(), name=SECRET)


def test_the_list_hides_the_values_of_a_model_the_viewer_may_not_view(django_user_model, redis):
    request = request_with_a_secret()
    viewer = staff(django_user_model)
    assert viewer.get(reverse("admin:testapp_profile_changelist")).status_code == 403  # the model's admin refuses
    page = viewer.get(reverse(CHANGELIST)).content.decode()
    assert str(request.request_id) in page
    assert SECRET not in page
    assert HIDDEN in page


def test_the_change_page_hides_the_values_and_the_error(django_user_model, redis):
    request = request_with_a_secret()
    ProcessedRequest.objects.filter(pk=request.pk).update(error=f"the database refused it: ... ({SECRET})")
    viewer = staff(django_user_model)
    page = viewer.get(reverse("admin:safeupdates_processedrequest_change", args=[request.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert SECRET not in html and HIDDEN in html
    assert str(request.request_id) in html and "pending" in html  # the log's own data stays


def test_a_viewer_who_may_view_the_model_sees_the_values(django_user_model, admin_client, redis):
    request = request_with_a_secret()
    viewer = staff(django_user_model, "testapp.view_profile")
    for client in (viewer, admin_client):
        list_page = client.get(reverse(CHANGELIST)).content.decode()
        change_page = client.get(reverse("admin:safeupdates_processedrequest_change", args=[request.pk]))
        assert SECRET in list_page and SECRET in change_page.content.decode()
        assert HIDDEN not in list_page


def test_a_model_without_an_admin_is_judged_by_its_view_permission(django_user_model, admin_client, redis):
    """``Gadget`` has no admin: its view permission decides (a superuser has every permission)."""
    gadget = Gadget.objects.create(label="g")
    with transaction.atomic():
        enqueue_update(gadget, label=SECRET)
    assert SECRET not in staff(django_user_model).get(reverse(CHANGELIST)).content.decode()
    assert SECRET in staff(django_user_model, "testapp.view_gadget").get(reverse(CHANGELIST)).content.decode()
    assert SECRET in admin_client.get(reverse(CHANGELIST)).content.decode()


def test_the_status_page_hides_a_failed_requests_error(django_user_model, admin_client, redis):
    request = request_with_a_secret()
    log = ProcessedRequest.objects.filter(pk=request.pk)
    log.fail(request.request_id, f"DataError: value too long ({SECRET})", final=True)
    url = reverse("admin:safeupdates_processedrequest_status")
    hidden_page = staff(django_user_model).get(url).content.decode()
    assert str(request.request_id) in hidden_page and SECRET not in hidden_page and HIDDEN in hidden_page
    assert SECRET in admin_client.get(url).content.decode()


# -- rows of no record: a task's, a batch item's (values shown with safeupdates.view_recordless_values) --------

NO_RECORD = "hidden: you may not view the values of requests with no record"
RECORDLESS = "safeupdates.view_recordless_values"


def rows_of_no_record() -> tuple[ProcessedRequest, ProcessedRequest]:
    """A failed task and a failed batch item, each with a secret in its changes and in its error."""
    task = ProcessedRequest.objects.create(
        kind="task", key="refund:7", changes={"function": f"shop.refund.{SECRET}"}, status="failed", error=SECRET
    )
    item = ProcessedRequest.objects.create(
        kind="batch_item",
        key=f"{uuid.uuid4()}:0",
        changes={"item": SECRET},
        status="failed",
        error=f"ValueError: bad item {SECRET!r}",
    )
    return task, item


def test_a_task_row_and_a_batch_item_hide_their_values_from_the_logs_viewer(django_user_model, redis):
    """Rows of no record have no model to ask: their values need a permission of the log's own."""
    rows = rows_of_no_record()
    viewer = staff(django_user_model, "testapp.view_profile")
    listed = viewer.get(reverse(CHANGELIST)).content.decode()
    assert all(row.key in listed for row in rows)  # the log's own data stays
    assert SECRET not in listed and NO_RECORD in listed
    for row in rows:
        page = viewer.get(reverse("admin:safeupdates_processedrequest_change", args=[row.pk]))
        html = page.content.decode()
        assert page.status_code == 200 and row.key in html
        assert SECRET not in html and NO_RECORD in html
    status_page = viewer.get(reverse("admin:safeupdates_processedrequest_status")).content.decode()
    assert rows[0].key in status_page and SECRET not in status_page and NO_RECORD in status_page


def test_the_permission_of_rows_of_no_record_shows_their_values(django_user_model, admin_client, redis):
    rows = rows_of_no_record()
    request_with_a_secret()  # a profile's: the permission of rows of no record does not show it
    viewer = staff(django_user_model, RECORDLESS)
    listed = viewer.get(reverse(CHANGELIST)).content.decode()
    assert SECRET in listed and NO_RECORD not in listed and HIDDEN in listed
    for client in (viewer, admin_client):  # a superuser has every permission
        for row in rows:
            html = client.get(reverse("admin:safeupdates_processedrequest_change", args=[row.pk])).content.decode()
            assert SECRET in html and NO_RECORD not in html
        assert SECRET in client.get(reverse("admin:safeupdates_processedrequest_status")).content.decode()


def _listed(client: Client, **query: str) -> str:
    response = client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    return response.content.decode()


def test_a_filter_on_the_values_finds_no_row_whose_values_are_hidden(django_user_model, admin_client, redis):
    """``?changes__name=...`` is a lookup the admin allows (a field of the model): over rows whose values
    are hidden it would tell, by listing the row or not, whether a guess is right."""
    profile_request = request_with_a_secret()
    task, item = rows_of_no_record()
    guesses = [
        ({"changes__name": SECRET}, profile_request),
        ({"changes__item": SECRET}, item),
        ({"error__contains": SECRET}, task),
        ({"changes__icontains": "s3cret"}, item),
    ]
    viewer = staff(django_user_model)
    for query, row in guesses:
        assert str(row.request_id) not in _listed(viewer, **query), query
        assert str(row.request_id) in _listed(admin_client, **query), query  # who sees the values may filter
    assert str(task.request_id) not in _listed(viewer, **{"changes__function__icontains": "refund"})
    assert str(task.request_id) in _listed(viewer, key="refund:7")  # the log's own data is filtered as before


class ValueSearchAdmin(ProcessedRequestAdmin):
    """A request log that also searches the values (a project's subclass)."""

    search_fields = [*ProcessedRequestAdmin.search_fields, "changes__name", "error"]


value_search_site = admin.AdminSite(name="admin")
value_search_site.register(ProcessedRequest, ValueSearchAdmin)
value_search_site.register(Profile, ProfileAdmin)
urlpatterns = [path("admin/", value_search_site.urls)]


@pytest.mark.urls(__name__)
def test_a_search_over_the_values_finds_no_row_whose_values_are_hidden(django_user_model, redis):
    profile_request = request_with_a_secret()
    task, _item = rows_of_no_record()
    viewer = staff(django_user_model)
    hidden = _listed(viewer, q=SECRET)
    assert str(profile_request.request_id) not in hidden and str(task.request_id) not in hidden
    assert str(task.request_id) in _listed(viewer, q="refund:7")  # a key is found, as before
    shown = _listed(staff(django_user_model, "testapp.view_profile", RECORDLESS), q=SECRET)
    assert str(profile_request.request_id) in shown and str(task.request_id) in shown


GONE = "hidden: the model of this request is gone"


def test_the_status_page_hides_the_error_of_a_request_whose_model_is_gone(django_user_model, admin_client, redis):
    """The list hides the values of a request whose content type was deleted (no model to ask): so does
    the status page, which named it ``content type N`` and showed its error."""
    gone = ProcessedRequest.objects.create(content_type_id=987654, object_id="1", status="failed", error=SECRET)
    for client in (staff(django_user_model, RECORDLESS), admin_client):
        listed = client.get(reverse(CHANGELIST)).content.decode()
        assert str(gone.request_id) in listed and SECRET not in listed and GONE in listed
        status_page = client.get(reverse("admin:safeupdates_processedrequest_status")).content.decode()
        assert "content type 987654" in status_page and SECRET not in status_page and GONE in status_page
        page = client.get(reverse("admin:safeupdates_processedrequest_change", args=[gone.pk])).content.decode()
        assert str(gone.request_id) in page and SECRET not in page and GONE in page  # its content type read alone


def test_a_stale_timestamp_request_tells_its_records_time_only_to_who_may_view_it(
    django_user_model, admin_client, redis
):
    """A stale timestamp-mode request says when the record was synced: a value of the record (its
    ``last_synced_at``), hidden as the request's own values are."""
    import datetime

    from django.utils import timezone

    profile = ProfileFactory()
    synced = timezone.now().replace(microsecond=0) - datetime.timedelta(days=3, seconds=7)
    older = synced - datetime.timedelta(days=1)
    Profile.objects.update_if_newer(profile.pk, synced_at=synced, request_id=uuid.uuid4(), active=True)
    Profile.objects.update_if_newer(profile.pk, synced_at=older, request_id=uuid.uuid4(), active=False)
    stale = ProcessedRequest.objects.get(status="stale")
    url = reverse("admin:safeupdates_processedrequest_change", args=[stale.pk])
    told = f"{timezone.localtime(synced):%Y-%m-%d %H:%M:%S}"
    assert f"the record was synced at {told}" in admin_client.get(url).content.decode()
    page = staff(django_user_model).get(url).content.decode()
    assert told not in page and f"{timezone.localtime(older):%Y-%m-%d %H:%M:%S}" in page  # the request's own
    assert HIDDEN in page


def test_the_batch_page_shows_its_failed_items_errors_and_its_reduce_error_by_the_same_permission(
    django_user_model, admin_client, redis
):
    """A fan-out batch's page lists its failed items with their errors, and its reduce's last error: the
    values of requests of no record, shown by the same permission as in the request log."""
    from safeupdates.contrib.batches.models import Batch, BatchItem

    batch = Batch.objects.create(
        item_func="shop.refund", queue="default", total=1, failed=1, reduce_error=f"RuntimeError: {SECRET}"
    )
    item = ProcessedRequest.objects.create(
        kind="batch_item", key=f"{batch.batch_id}:0", status="failed", error=f"ValueError: bad item {SECRET!r}"
    )
    BatchItem.objects.create(batch=batch, index=0, request_id=item.request_id)
    page = reverse("admin:safeupdates_batches_batch_change", args=[batch.pk])
    viewer = staff(django_user_model, "safeupdates_batches.view_batch")
    html = viewer.get(page).content.decode()
    assert "item 0" in html and "1 item failed" in html  # which items failed stays the batch's own data
    assert SECRET not in html and NO_RECORD in html
    for client in (staff(django_user_model, "safeupdates_batches.view_batch", RECORDLESS), admin_client):
        html = client.get(page).content.decode()
        assert html.count(SECRET) == 2 and NO_RECORD not in html


def test_a_filter_on_a_batchs_reduce_error_needs_the_same_permission(django_user_model, admin_client, redis):
    """``?reduce_error__contains=...`` is a lookup the admin allows on any field: listing the batch or not
    would tell a viewer without the permission whether a guess of the error is right. It is refused."""
    from safeupdates.contrib.batches.models import Batch

    Batch.objects.create(item_func="shop.refund", queue="default", total=0, reduce_error=f"RuntimeError: {SECRET}")
    changelist = reverse("admin:safeupdates_batches_batch_changelist")
    guess = {"reduce_error__contains": SECRET[:6]}
    assert staff(django_user_model, "safeupdates_batches.view_batch").get(changelist, guess).status_code == 400
    for client in (staff(django_user_model, "safeupdates_batches.view_batch", RECORDLESS), admin_client):
        response = client.get(changelist, guess)
        assert response.status_code == 200 and "shop.refund" in response.content.decode()


# -- the model's own admin decides; a proxy's permission is not its concrete model's; change grants view -----


def _pages(client: Client, request: ProcessedRequest) -> dict[str, str]:
    """The request log's list, the request's page and the status page, as ``client`` is shown them."""
    urls = {
        "list": reverse(CHANGELIST),
        "change": reverse("admin:safeupdates_processedrequest_change", args=[request.pk]),
        "status": reverse("admin:safeupdates_processedrequest_status"),
    }
    pages = {}
    for name, url in urls.items():
        response = client.get(url)
        assert response.status_code == 200, name
        pages[name] = response.content.decode()
    return pages


def failed_request_with_a_secret() -> ProcessedRequest:
    """A profile's request with the secret in its changes, failed with an error that quotes it (so the
    status page lists it too)."""
    request = request_with_a_secret()
    ProcessedRequest.objects.filter(pk=request.pk).fail(request.request_id, f"DataError: ({SECRET})", final=True)
    return request


@pytest.mark.urls("tests.request_log_urls")
def test_a_model_admin_that_refuses_the_viewer_hides_the_values_whatever_permissions_they_hold(
    django_user_model, admin_client, redis
):
    """The project's ``ModelAdmin.has_view_permission()`` is the judge where the model has one: a user who
    holds ``view_profile`` (and ``change_profile``) but whom that admin refuses is not shown the values."""
    request = failed_request_with_a_secret()
    viewer = staff(django_user_model, "testapp.view_profile", "testapp.change_profile")
    assert viewer.get(reverse("admin:testapp_profile_changelist")).status_code == 403  # the model's admin refuses
    for name, page in _pages(viewer, request).items():
        assert str(request.request_id) in page, name
        assert SECRET not in page and HIDDEN in page, name
    for name, page in _pages(admin_client, request).items():  # the admin lets a superuser view them
        assert SECRET in page and HIDDEN not in page, name


def test_a_proxys_permissions_do_not_show_the_values_of_its_concrete_model(django_user_model, redis):
    """``ActiveOnlyProfile`` is a proxy of ``Profile``: its permissions are its own (a content type of its
    own), and a request of either is logged under ``Profile``'s content type. Who may view or change the
    proxy only is not shown the profiles' values."""
    request = failed_request_with_a_secret()
    with transaction.atomic():
        through_proxy = enqueue_update(ActiveOnlyProfile.objects.get(pk=request.object_id), active=False)
    viewer = staff(django_user_model, "testapp.view_activeonlyprofile", "testapp.change_activeonlyprofile")
    for name, page in _pages(viewer, request).items():
        assert SECRET not in page and HIDDEN in page, name
    listed = _listed(viewer)
    assert str(through_proxy.request_id) in listed and "active=False" not in listed
    assert str(request.request_id) not in _listed(viewer, **{"changes__name": SECRET})  # a guess tells nothing
    # the same viewer with the concrete model's permission is shown them: the proxy's hid nothing else
    shown = staff(django_user_model, "testapp.view_activeonlyprofile", "testapp.view_profile")
    for name, page in _pages(shown, request).items():
        assert SECRET in page, name
    assert "active=False" in _listed(shown)


def test_a_viewer_who_may_change_the_model_but_holds_no_view_permission_sees_the_values(django_user_model, redis):
    """Django's admin lets who may change a model view it (``change_<model>`` implies view): so does the
    request log, for a model with an admin (``Profile``) and one without (``Gadget``)."""
    request = failed_request_with_a_secret()
    gadget = Gadget.objects.create(label="g")
    with transaction.atomic():
        gadget_request = enqueue_update(gadget, label="gadget-" + SECRET)
    ProcessedRequest.objects.filter(pk=gadget_request.pk).fail(
        gadget_request.request_id, f"DataError: (gadget-{SECRET})", final=True
    )
    profiles = staff(django_user_model, "testapp.change_profile")
    assert profiles.get(reverse("admin:testapp_profile_changelist")).status_code == 200
    for name, page in _pages(profiles, request).items():
        assert SECRET in page and HIDDEN not in page, name
    listed = _listed(profiles)  # change_profile shows no gadget's values
    assert "gadget-" + SECRET not in listed and "hidden: you may not view testapp.gadget" in listed
    gadgets = staff(django_user_model, "testapp.change_gadget")
    for name, page in _pages(gadgets, gadget_request).items():
        assert "gadget-" + SECRET in page and "hidden: you may not view testapp.gadget" not in page, name
    assert HIDDEN in _listed(gadgets)  # nor does change_gadget show a profile's


def test_a_row_not_read_through_the_logs_admin_is_shown_as_the_logs_permission_allows(redis):
    """The admin marks each row of its queryset with whether its values may be shown; a row a project reads
    itself (its own view or action over the request log) has no mark, and is shown to whoever the project
    lets call it."""
    request = ProcessedRequest.objects.get(pk=request_with_a_secret().pk)
    log_admin = ProcessedRequestAdmin(ProcessedRequest, admin.site)
    assert SECRET in log_admin.wanted_in_full(request) and SECRET in log_admin.wanted(request)
