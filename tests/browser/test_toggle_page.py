"""The toggle page and the admin in headless Chromium, against the live server and a real RQ worker."""

from __future__ import annotations

import pytest
from django.apps import apps

if not apps.is_installed("demo_project.toggles"):
    pytest.skip(
        "the demo app is not installed: add 'demo_project.toggles' to INSTALLED_APPS in tests/settings.py",
        allow_module_level=True,
    )

from playwright.sync_api import Page, expect

from demo_project.toggles.factories import PASSWORD, ProfileFactory, UserFactory
from demo_project.toggles.models import Profile
from demo_project.toggles.views import FORBIDDEN
from safeupdates import enqueue_update
from safeupdates.models import ProcessedRequest
from tests.workers import Workers, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def log_in(page: Page, username: str) -> None:
    page.goto("/accounts/login/?next=/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/profiles/*/")


def requests_of(profile: Profile) -> list[ProcessedRequest]:
    return list(ProcessedRequest.objects.filter(object_id=str(profile.pk)).order_by("version"))


@pytest.mark.workers
def test_many_fast_clicks_settle_to_the_last_click(page: Page, workers: Workers) -> None:
    profile = ProfileFactory()
    workers.start(1)
    log_in(page, profile.user.username)

    clicks = {"active": 9, "newsletter": 4, "dark_mode": 1}  # from off: ends on, off, on
    for field, count in clicks.items():
        for _ in range(count):
            page.click(f"#toggle-{field}")
    page.click("#burst")  # nine more clicks on "active": ends off

    expect(page.locator("#sync-status")).to_have_attribute("data-settled", "true", timeout=60_000)
    final = {"active": False, "newsletter": False, "dark_mode": True}
    # The server's truth first: when it is wrong, the message shows every request, not only the page.
    profile.refresh_from_db()
    requests = requests_of(profile)
    log = "\n".join(f"v{r.version} {r.changes} {r.status} {r.error}" for r in requests)
    shown = page.locator("#error").text_content()
    assert (profile.toggles(), len(requests)) == (final, 9 + 4 + 1 + 9), f"page error: {shown!r}\n{log}"
    for field, value in final.items():
        expect(page.locator(f"#stored-{field}")).to_have_text("on" if value else "off")
        expect(page.locator(f"#toggle-{field}")).to_have_attribute("aria-checked", str(value).lower())
        expect(page.locator(f"#sync-{field}")).to_have_text("saved")
    expect(page.locator("body")).to_have_class("dark")

    expect(page.locator("#lock-version")).to_have_text(str(profile.lock_version))
    assert {r.status for r in requests} <= {"applied", "stale"}, log
    for field, value in final.items():
        newest = [r for r in requests if field in r.changes][-1]
        assert (newest.changes[field], newest.status) == (value, "applied")
    # The page lists the latest requests, newest first, each settled.
    rows = page.locator("#requests tbody tr")
    expect(rows).to_have_count(12)
    expect(rows.first).to_contain_text(f"v{requests[-1].version}")
    assert set(rows.evaluate_all("rows => rows.map(r => r.dataset.status)")) <= {"applied", "stale"}


def test_another_users_profile_is_refused(page: Page, demo_site: str) -> None:
    mine, theirs = ProfileFactory(), ProfileFactory()
    log_in(page, mine.user.username)
    token = page.get_attribute("#app", "data-csrf")

    response = page.goto(f"/profiles/{theirs.pk}/")
    assert response is not None and response.status == 403
    expect(page.locator("main")).to_contain_text(FORBIDDEN)

    posted = page.request.post(
        f"{demo_site}/profiles/{theirs.pk}/toggle/",
        form={"field": "active", "value": "true"},
        headers={"X-CSRFToken": str(token)},
    )
    assert posted.status == 403
    assert posted.json() == {"error": FORBIDDEN}
    theirs.refresh_from_db()
    assert theirs.active is False
    assert requests_of(theirs) == []


def test_bad_input_shows_the_servers_message(page: Page) -> None:
    profile = ProfileFactory()
    log_in(page, profile.user.username)
    # A tampered page: the switch now names a field that queued jobs may not change.
    page.eval_on_selector("#toggle-active", "el => { el.dataset.field = 'lock_version'; }")
    page.click("#toggle-active")
    expect(page.locator("#error")).to_contain_text("'lock_version' is not a toggle")
    assert requests_of(profile) == []


@pytest.mark.workers
def test_admin_lists_the_requests(page: Page, workers: Workers) -> None:
    profile = ProfileFactory(user=UserFactory.superuser())
    other = ProfileFactory()
    workers.start(1)
    enqueue_update(profile, active=True)
    enqueue_update(profile, newsletter=True)
    enqueue_update(profile, active=False)
    enqueue_update(other, dark_mode=True)
    assert wait_until(lambda: not ProcessedRequest.objects.filter(status="pending").exists(), 30)

    log_in(page, profile.user.username)
    page.click("text=Admin")
    page.goto("/admin/toggles/profile/")
    row = page.locator("#result_list tbody tr", has_text=profile.user.username)
    expect(row).to_contain_text(str(Profile.objects.get(pk=profile.pk).lock_version))
    row.get_by_role("link", name="3 requests").click()

    listed = page.locator("#result_list tbody tr")
    expect(listed).to_have_count(3)
    for request in requests_of(profile):
        expect(page.locator("#result_list")).to_contain_text(str(request.request_id))
    expect(page.locator("#result_list")).not_to_contain_text(str(requests_of(other)[0].request_id))

    # lock_version is shown read-only on the profile's change page.
    page.goto(f"/admin/toggles/profile/{profile.pk}/change/")
    expect(page.locator(".field-lock_version .readonly")).to_have_text(
        str(Profile.objects.get(pk=profile.pk).lock_version)
    )
    expect(page.locator("input[name=lock_version]")).to_have_count(0)
