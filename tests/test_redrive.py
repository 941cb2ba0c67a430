"""Failed and rejected requests re-driven (issue 55): listed in the admin with their last error and attempts,
filterable by model and error; an admin action makes the selection pending and delivers it on commit, once,
whatever the backend; ``safeupdates_relay --retry-failed --model app.Model`` does it for one model."""

from __future__ import annotations

import io
import uuid

import django_rq
import pytest
from django.apps import apps
from django.contrib.auth.management import create_permissions
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import transaction
from django.db.models.functions import Now
from django.test import Client, override_settings
from django.urls import reverse
from django_tasks_db.models import DBTaskResult
from rq import SimpleWorker

from safeupdates import enqueue_update
from safeupdates.delivery import tasks as taskqueue
from safeupdates.models import ProcessedRequest
from tests.factories import ProfileFactory
from tests.testapp.models import Gadget, Profile

pytestmark = pytest.mark.django_db(transaction=True)

FAILED_LIST = "admin:safeupdates_failedrequest_changelist"
OUTAGE = "OperationalError: the database restarted (SECRET-HOST)"


def queue():
    return django_rq.get_queue("default")


def work() -> None:
    """Run the queued jobs here, with RQ's own SimpleWorker, until the queue is empty."""
    SimpleWorker([queue()], connection=queue().connection).work(burst=True)


def failed_request(redis, *, status: str = "failed", error: str = OUTAGE, **changes) -> ProcessedRequest:
    """A committed request whose job ran out of retries (or was rejected): no job left anywhere."""
    profile = ProfileFactory(active=False)
    request = enqueue_update(profile, **(changes or {"active": True}))
    redis.flushdb()
    ProcessedRequest.objects.filter(pk=request.pk).update(status=status, error=error, attempts=4, processed_at=Now())
    request.refresh_from_db()
    return request


def staff(django_user_model, *perms: str) -> Client:
    for app_label in ("safeupdates", "testapp"):  # a transactional test's flush took them (tests/conftest.py)
        create_permissions(apps.get_app_config(app_label), verbosity=0)
    user = django_user_model.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", password="x", is_staff=True)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client()
    client.force_login(user)
    return client


def redrive(client: Client, *requests: ProcessedRequest, follow: bool = True):
    return client.post(
        reverse(FAILED_LIST),
        {"action": "redrive", "_selected_action": [str(r.pk) for r in requests]},
        follow=follow,
    )


#: The permissions of an operator: the log, the re-drive, and the records' model.
OPERATOR = ("safeupdates.view_processedrequest", "safeupdates.redrive_failedrequest", "testapp.change_profile")


def test_the_failed_list_shows_failed_and_rejected_requests_with_their_error_and_attempts(admin_client, redis):
    failed = failed_request(redis)
    rejected = failed_request(redis, status="rejected", error="the target object does not exist")
    applied = enqueue_update(ProfileFactory(), active=True)
    work()
    page = admin_client.get(reverse(FAILED_LIST)).content.decode()
    assert str(failed.request_id) in page and str(rejected.request_id) in page
    assert str(applied.request_id) not in page
    assert OUTAGE in page and "the target object does not exist" in page
    assert '<td class="field-attempts">4</td>' in page


def test_the_failed_list_filters_by_model_and_by_error(admin_client, redis):
    outage = failed_request(redis)
    gadget = Gadget.objects.create(label="g")
    other = enqueue_update(gadget, label="h")
    ProcessedRequest.objects.filter(pk=other.pk).update(status="failed", error="another error", processed_at=Now())
    by_error = admin_client.get(reverse(FAILED_LIST), {"error": OUTAGE}).content.decode()
    assert str(outage.request_id) in by_error and str(other.request_id) not in by_error
    assert "another error" in by_error  # a choice of the filter, with its count
    from django.contrib.contenttypes.models import ContentType

    gadgets = ContentType.objects.get_for_model(Gadget).pk
    by_model = admin_client.get(reverse(FAILED_LIST), {"content_type__id__exact": gadgets}).content.decode()
    assert str(other.request_id) in by_model and str(outage.request_id) not in by_model


def test_the_error_filter_offers_no_error_of_a_model_the_viewer_may_not_view(django_user_model, redis):
    """The list shows the request (the log's own data), not its error, nor the error among the filter's
    choices; and a guess of the error does not find it (that would confirm the guess)."""
    request = failed_request(redis)
    viewer = staff(django_user_model, "safeupdates.view_processedrequest")
    page = viewer.get(reverse(FAILED_LIST))
    assert page.status_code == 200
    assert str(request.request_id) in page.content.decode()
    assert "SECRET-HOST" not in page.content.decode()
    guessed = viewer.get(reverse(FAILED_LIST), {"error": OUTAGE}).content.decode()
    assert str(request.request_id) not in guessed


def test_an_operator_re_drives_a_failed_request_and_sees_it_applied(django_user_model, redis):
    request = failed_request(redis)
    operator = staff(django_user_model, *OPERATOR)
    page = redrive(operator, request)
    assert "1 request(s) of 1 record(s) made pending again and delivered" in page.content.decode()
    request.refresh_from_db()
    assert request.status == "pending"
    [job] = queue().jobs
    assert job.args == (str(request.request_id),)
    work()
    request.refresh_from_db()
    assert (request.status, request.attempts) == ("applied", 5)
    assert Profile.objects.get(pk=int(request.object_id)).active is True
    log = operator.get(reverse("admin:safeupdates_processedrequest_changelist"), {"status__exact": "applied"})
    assert str(request.request_id) in log.content.decode()  # what the operator sees: applied


def test_without_the_re_drive_permission_the_action_is_neither_offered_nor_run(django_user_model, redis):
    request = failed_request(redis)
    viewer = staff(django_user_model, "safeupdates.view_processedrequest", "testapp.change_profile")
    page = viewer.get(reverse(FAILED_LIST)).content.decode()
    assert str(request.request_id) in page and 'value="redrive"' not in page
    redrive(viewer, request)
    request.refresh_from_db()
    assert request.status == "failed" and queue().count == 0


def test_without_the_right_to_change_its_model_a_request_is_not_re_driven(django_user_model, redis):
    request = failed_request(redis)
    operator = staff(django_user_model, "safeupdates.view_processedrequest", "safeupdates.redrive_failedrequest")
    page = redrive(operator, request).content.decode()
    assert "1 request(s) not re-driven: you may not change testapp.profile" in page
    request.refresh_from_db()
    assert request.status == "failed" and queue().count == 0


def test_re_driving_twice_delivers_once(admin_client, redis):
    request = failed_request(redis)
    redrive(admin_client, request)
    again = redrive(admin_client, request).content.decode()
    assert "1 request(s) not re-driven: no longer failed or rejected" in again
    work()
    assert redrive(admin_client, request).status_code == 200
    request.refresh_from_db()
    assert (request.status, request.attempts) == ("applied", 5)
    assert queue().count == 0


@override_settings(SAFEUPDATES_DELIVERY="tasks", SAFEUPDATES_TASK_BACKEND="db")
def test_re_driving_twice_delivers_one_task_with_the_tasks_backend(admin_client, redis):
    """Django Tasks (django-tasks-db) cannot tell a record's task is waiting: each delivery is a task row,
    so the count of rows is the count of deliveries."""
    request = failed_request(redis)
    DBTaskResult.objects.all().delete()
    redrive(admin_client, request)
    redrive(admin_client, request)
    [task] = DBTaskResult.objects.filter(task_path=taskqueue.APPLY_TASK)
    assert task.args_kwargs["args"][0] == str(request.request_id)
    assert ProcessedRequest.objects.get(pk=request.pk).status == "pending"


def test_a_re_driven_rejected_request_still_invalid_is_rejected_again_and_writes_nothing(admin_client, redis):
    request = failed_request(redis, status="rejected", error="stored value not valid")
    ProcessedRequest.objects.filter(pk=request.pk).update(changes={"score": "not a number"})
    before = Profile.objects.get(pk=int(request.object_id))
    redrive(admin_client, request)
    work()
    request.refresh_from_db()
    assert (request.status, request.attempts) == ("rejected", 5)
    assert "score" in request.error
    after = Profile.objects.get(pk=int(request.object_id))
    assert (after.score, after.active, after.field_versions) == (before.score, before.active, before.field_versions)


def test_a_selection_of_many_requests_delivers_one_job_per_record(admin_client, redis):
    first = failed_request(redis)
    profile = Profile.objects.get(pk=int(first.object_id))
    second = enqueue_update(profile, newsletter=True)
    redis.flushdb()
    ProcessedRequest.objects.filter(pk=second.pk).update(status="failed", processed_at=Now())
    page = redrive(admin_client, first, second).content.decode()
    assert "2 request(s) of 1 record(s) made pending again and delivered" in page
    assert queue().count == 1
    work()
    profile.refresh_from_db()
    assert (profile.active, profile.newsletter) == (True, True)
    assert set(ProcessedRequest.objects.values_list("status", flat=True)) == {"applied"}


def relay_output(*args: str) -> str:
    out = io.StringIO()
    call_command("safeupdates_relay", *args, stdout=out, stderr=out)
    return out.getvalue()


def test_retry_failed_for_one_model_revives_only_its_failed_requests(redis):
    profiles = failed_request(redis)
    gadget = enqueue_update(Gadget.objects.create(label="g"), label="h")
    redis.flushdb()
    ProcessedRequest.objects.filter(pk=gadget.pk).update(status="failed", processed_at=Now())
    out = relay_output("--retry-failed", "--model", "testapp.Profile", "--older-than", "3600")
    assert "1 failed request(s) made pending again" in out
    assert ProcessedRequest.objects.get(pk=gadget.pk).status == "failed"
    work()
    assert ProcessedRequest.objects.get(pk=profiles.pk).status == "applied"
    assert "1 failed request(s) would be made pending again" in relay_output(
        "--retry-failed", "--model", "testapp.gadget", "--dry-run"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "testapp.Profile"], "--model goes with --retry-failed"),
        (["--retry-failed", "--model", "testapp.Nothing"], "--model 'testapp.Nothing' is not an installed model"),
        (["--retry-failed", "--model", "Profile"], "--model 'Profile' is not an installed model"),
        (["--retry-failed", "--model", "testapp.Review"], "--model .testapp.Review. is not updated through"),
    ],
)
def test_retry_failed_refuses_a_model_it_cannot_name(redis, args, message):
    request = failed_request(redis)
    with pytest.raises(CommandError, match=message):
        relay_output(*args)
    assert ProcessedRequest.objects.get(pk=request.pk).status == "failed"


def test_a_re_drive_in_a_rolled_back_transaction_delivers_nothing(redis):
    from safeupdates.jobs import redrive as redrive_requests

    request = failed_request(redis)
    with pytest.raises(RuntimeError), transaction.atomic():
        redrive_requests(ProcessedRequest.objects.filter(pk=request.pk))
        raise RuntimeError("rolled back")
    assert ProcessedRequest.objects.get(pk=request.pk).status == "failed"
    assert queue().count == 0


def test_a_request_no_longer_failed_in_a_selection_is_skipped_and_said_so(redis):
    """Two operators (or a double click) re-drive the same request: the second finds it pending, and
    neither changes it nor delivers it again."""
    from safeupdates.jobs import redrive as redrive_requests

    request = failed_request(redis)
    selection = ProcessedRequest.objects.filter(pk=request.pk)
    first, second = redrive_requests(selection), redrive_requests(selection)
    assert (first.requests, first.records, first.skipped) == (1, 1, 0)
    assert (second.requests, second.records, second.skipped) == (0, 0, 1)
    assert queue().count == 1


def test_a_model_without_an_admin_is_re_driven_by_whoever_holds_its_change_permission(django_user_model, redis):
    """``Gadget`` has no ``ModelAdmin`` to ask: its change permission decides (its view permission shows its
    requests but does not let them be re-driven, as it lets no row of it be written)."""
    gadget = Gadget.objects.create(label="before")
    request = enqueue_update(gadget, label="after")
    redis.flushdb()
    ProcessedRequest.objects.filter(pk=request.pk).update(status="failed", error=OUTAGE, processed_at=Now())
    log = ("safeupdates.view_processedrequest", "safeupdates.redrive_failedrequest")
    viewer = staff(django_user_model, *log, "testapp.view_gadget")
    assert str(request.request_id) in viewer.get(reverse(FAILED_LIST)).content.decode()
    page = redrive(viewer, request).content.decode()
    assert "1 request(s) not re-driven: you may not change testapp.gadget" in page
    assert ProcessedRequest.objects.get(pk=request.pk).status == "failed" and queue().count == 0
    operator = staff(django_user_model, *log, "testapp.change_gadget")
    page = redrive(operator, request).content.decode()
    assert "1 request(s) of 1 record(s) made pending again and delivered" in page
    work()
    assert ProcessedRequest.objects.get(pk=request.pk).status == "applied"
    assert Gadget.objects.get(pk=gadget.pk).label == "after"
