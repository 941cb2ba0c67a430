"""The demo's toggle page and its JSON endpoints: login, ownership (403), input errors (400) and CSRF."""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps

if not apps.is_installed("demo_project.toggles"):
    pytest.skip(
        "the demo app is not installed: add 'demo_project.toggles' to INSTALLED_APPS in tests/settings.py",
        allow_module_level=True,
    )

from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from demo_project.toggles.factories import ProfileFactory
from demo_project.toggles.models import Profile
from demo_project.toggles.views import FORBIDDEN
from safeupdates.models import ProcessedRequest

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def demo_urls(settings: Any) -> None:
    settings.ROOT_URLCONF = "demo_project.urls"


@pytest.fixture
def profile() -> Profile:
    return ProfileFactory()


@pytest.fixture
def user_client(client: Client, profile: Profile) -> Client:
    client.force_login(profile.user)
    return client


def toggle_url(profile: Profile) -> str:
    return reverse("toggles:toggle", args=[profile.pk])


def test_pages_require_login(client: Client, profile: Profile) -> None:
    for url in [
        reverse("toggles:home"),
        reverse("toggles:profile", args=[profile.pk]),
        reverse("toggles:state", args=[profile.pk]),
    ]:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))
    assert client.post(toggle_url(profile), {"field": "active", "value": "true"}).status_code == 302
    assert not ProcessedRequest.objects.exists()


def test_home_redirects_to_a_profile_created_on_first_visit(client: Client, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("newcomer")
    client.force_login(user)
    response = client.get(reverse("toggles:home"))
    profile = Profile.objects.get(user=user)
    assert response.status_code == 302
    assert response["Location"] == reverse("toggles:profile", args=[profile.pk])


def test_page_shows_the_stored_state(user_client: Client, profile: Profile) -> None:
    Profile.objects.filter(pk=profile.pk).update(newsletter=True)
    response = user_client.get(reverse("toggles:profile", args=[profile.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert f"Settings of {profile.user.username}" in html
    assert 'id="toggle-newsletter"' in html
    assert 'id="initial-state"' in html
    state = response.context["state"]
    assert state["profile"]["toggles"] == {"active": False, "newsletter": True, "dark_mode": False}
    assert state["profile"]["lock_version"] == profile.lock_version
    assert 'name="csrfmiddlewaretoken"' in html  # the logout form; the page's POSTs send X-CSRFToken


def test_toggle_records_a_pending_request_and_enqueues_on_commit(
    user_client: Client, profile: Profile, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        response = user_client.post(toggle_url(profile), {"field": "active", "value": "true"})
    assert response.status_code == 202
    request = ProcessedRequest.objects.get()
    assert request.status == "pending"
    assert request.changes == {"active": True}
    assert request.object_id == str(profile.pk)
    assert response.json()["request"]["request_id"] == str(request.request_id)
    assert response.json()["request"]["version"] == request.version
    assert len(callbacks) == 1  # the job is enqueued when the transaction commits
    profile.refresh_from_db()
    assert profile.active is False  # written later, by a worker


@pytest.mark.parametrize("value, expected", [("true", True), ("false", False), ("on", True), ("0", False)])
def test_toggle_accepts_the_usual_spellings_of_a_boolean(
    user_client: Client, profile: Profile, value: str, expected: bool
) -> None:
    assert user_client.post(toggle_url(profile), {"field": "dark_mode", "value": value}).status_code == 202
    assert ProcessedRequest.objects.get().changes == {"dark_mode": expected}


@pytest.mark.parametrize(
    "data, message",
    [
        ({"value": "true"}, "Missing 'field': say which toggle to change, one of: active, newsletter, dark_mode."),
        ({"field": "active"}, "Missing 'value': send true or false."),
        ({"field": "active", "value": "maybe"}, "'maybe' is not a toggle's value: send true or false."),
        ({"field": "active", "value": "t"}, "'t' is not a toggle's value: send true or false."),
        ({"field": "active", "value": "\x00"}, "is not a toggle's value: send true or false."),
        ({"field": "colour", "value": "true"}, "'colour' is not a toggle; 'field' must be one of: active, newsletter,"),
        ({"field": "user", "value": "1"}, "'user' is not a toggle"),
        ({"field": "lock_version", "value": "9"}, "'lock_version' is not a toggle"),
        ({"field": "queue", "value": "true"}, "'queue' is not a toggle; 'field' must be one of: active,"),
        ({"field": "pk", "value": "true"}, "'pk' is not a toggle"),
        # Keyword arguments of enqueue_update() itself: as **changes they collided with its parameters (500).
        ({"field": "obj_or_model", "value": "true"}, "'obj_or_model' is not a toggle"),
        ({"field": "request_id", "value": "true"}, "'request_id' is not a toggle"),
        ({"field": "active", "value": "true", "request_id": "x" * 100_000}, "request_id must be a UUID, got 'xxxx"),
        ({"field": "active", "value": "true", "request_id": "\x00"}, "request_id must be a UUID"),
        ({"field": "active", "value": "true", "request_id": "1" * 33}, "request_id must be a UUID"),
    ],
)
def test_bad_input_is_a_400_with_a_clear_message(
    user_client: Client, profile: Profile, data: dict[str, str], message: str
) -> None:
    response = user_client.post(toggle_url(profile), data)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert len(response.json()["error"]) < 300, "the error echoes the whole input"
    assert not ProcessedRequest.objects.exists()


def test_a_retried_click_is_recorded_once(user_client: Client, profile: Profile) -> None:
    click = {"field": "newsletter", "value": "true", "request_id": "0b7e2c56-5d1f-4c55-9a43-0d6e1b7c7a01"}
    first = user_client.post(toggle_url(profile), click)
    again = user_client.post(toggle_url(profile), click)
    assert (first.status_code, again.status_code) == (202, 202)
    assert first.json() == again.json()
    assert ProcessedRequest.objects.get().request_id.hex == "0b7e2c565d1f4c559a430d6e1b7c7a01"


def test_a_request_id_is_a_uuid(user_client: Client, profile: Profile) -> None:
    response = user_client.post(toggle_url(profile), {"field": "active", "value": "true", "request_id": "12"})
    assert response.status_code == 400
    assert response.json() == {"error": "request_id must be a UUID, got '12'."}


def test_another_users_profile_is_forbidden(user_client: Client) -> None:
    other = ProfileFactory()
    page = user_client.get(reverse("toggles:profile", args=[other.pk]))
    assert page.status_code == 403
    assert FORBIDDEN in page.content.decode()
    for response in [
        user_client.post(toggle_url(other), {"field": "active", "value": "true"}),
        user_client.get(reverse("toggles:state", args=[other.pk])),
    ]:
        assert response.status_code == 403
        assert response.json() == {"error": FORBIDDEN}
    assert not ProcessedRequest.objects.exists()


def test_unknown_profile_is_a_404(user_client: Client) -> None:
    assert (
        user_client.post(reverse("toggles:toggle", args=[999999]), {"field": "active", "value": "1"}).status_code == 404
    )


def test_toggle_only_accepts_post(user_client: Client, profile: Profile) -> None:
    assert user_client.get(toggle_url(profile)).status_code == 405


def test_toggle_is_csrf_protected(profile: Profile) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(profile.user)
    refused = client.post(toggle_url(profile), {"field": "active", "value": "true"})
    assert refused.status_code == 403
    assert not ProcessedRequest.objects.exists()

    page = client.get(reverse("toggles:profile", args=[profile.pk]))
    token = str(page.context["csrf_token"])
    accepted = client.post(toggle_url(profile), {"field": "active", "value": "true"}, headers={"X-CSRFToken": token})
    assert accepted.status_code == 202
    assert ProcessedRequest.objects.count() == 1


def test_state_lists_the_latest_requests_and_pending_fields(user_client: Client, profile: Profile) -> None:
    for field, value in [("active", "true"), ("newsletter", "true"), ("active", "false")]:
        assert user_client.post(toggle_url(profile), {"field": field, "value": value}).status_code == 202
    state = user_client.get(reverse("toggles:state", args=[profile.pk])).json()
    assert state["pending"] == 3
    assert state["total"] == 3
    assert state["pending_fields"] == ["active", "newsletter"]
    versions = [r["version"] for r in state["requests"]]
    assert versions == sorted(versions, reverse=True)
    assert [r["changes"] for r in state["requests"]] == [{"active": False}, {"newsletter": True}, {"active": True}]
    assert {r["status"] for r in state["requests"]} == {"pending"}
    # Nothing applied yet: every field still carries the version of the profile's creation.
    assert state["profile"]["versions"] == dict.fromkeys(Profile.safe_update_fields, profile.lock_version)


def test_a_request_id_of_another_profile_or_of_a_task_is_a_400(user_client: Client, profile: Profile) -> None:
    other = ProfileFactory()
    used = "0b7e2c56-5d1f-4c55-9a43-0d6e1b7c7a02"
    client = Client()
    client.force_login(other.user)
    assert client.post(toggle_url(other), {"field": "active", "value": "1", "request_id": used}).status_code == 202
    response = user_client.post(toggle_url(profile), {"field": "active", "value": "1", "request_id": used})
    assert response.status_code == 400
    assert "already used for another object" in response.json()["error"]


def test_an_out_of_range_profile_id_is_a_404(user_client: Client) -> None:
    url = reverse("toggles:toggle", args=[2**70])
    assert user_client.post(url, {"field": "active", "value": "1"}).status_code == 404


TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=60)
FIELDS = [*Profile.safe_update_fields, "obj_or_model", "pk", "queue", "request_id", "user", "lock_version", "id"]
WORDS = ["true", "false", "on", "0", "yes", "No", " TRUE ", "t", "2", "None", ""]


@hypothesis_settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=st.one_of(st.none(), st.sampled_from(FIELDS), TEXT),
    value=st.one_of(st.none(), st.sampled_from(WORDS), TEXT),
    request_id=st.one_of(st.none(), st.uuids().map(str), st.sampled_from(["", "0", "x" * 5000]), TEXT),
    extra=st.dictionaries(TEXT, TEXT, max_size=3),
)
def test_whatever_is_posted_the_answer_is_never_a_500(
    user_client: Client, profile: Profile, field: str | None, value: str | None, request_id: str | None, extra: dict
) -> None:
    named = {"field": field, "value": value, "request_id": request_id}
    data = {**extra, **{name: text for name, text in named.items() if text is not None}}
    recorded = ProcessedRequest.objects.count()
    response = user_client.post(toggle_url(profile), data)
    assert response.status_code in (202, 400), response.content
    body = response.json()
    assert set(body) == ({"request"} if response.status_code == 202 else {"error"})
    assert ProcessedRequest.objects.count() - recorded == (1 if response.status_code == 202 else 0) or (
        response.status_code == 202 and request_id  # a request id recorded before: the same request again
    )


def test_the_state_is_never_settled_with_a_value_a_worker_replaced_while_it_was_read(
    user_client: Client, profile: Profile
) -> None:
    """A worker that applies the last request while the page's state is read: the state says either that a
    request is pending or the applied value, never "nothing pending" beside the value before it. (The page
    takes "nothing pending" for settled and shows the stored value as final.)"""
    from django.db import connection

    from safeupdates.pipeline.apply import apply_update

    assert user_client.post(toggle_url(profile), {"field": "active", "value": "true"}).status_code == 202
    request = ProcessedRequest.objects.get()
    applied: list[str] = []

    log_table = ProcessedRequest._meta.db_table

    def worker_before_the_log_is_read(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not applied and log_table in sql:
            applied.append("running")  # the worker's own statements pass through here too
            applied.append(apply_update(str(request.request_id)))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(worker_before_the_log_is_read):
        state = user_client.get(reverse("toggles:state", args=[profile.pk])).json()
    assert applied and ProcessedRequest.objects.get().status == "applied"
    assert state["pending"] > 0 or state["profile"]["toggles"]["active"] is True, state
