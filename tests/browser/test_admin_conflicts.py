"""The admin's conflict page, the request log and the re-drive of a failed request in headless Chromium,
against the live server.

Screenshots are taken on every run; with ``SAFEUPDATES_SCREENSHOTS=1`` they replace those in
``docs/screenshots/`` (shown in ``docs/admin.md``), else they go to the test's temporary directory.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import django.contrib.admin
import django_rq
import pytest
from django.apps import apps
from django.db.models.functions import Now

if not apps.is_installed("demo_project.toggles"):
    pytest.skip(
        "the demo app is not installed: add 'demo_project.toggles' to INSTALLED_APPS in tests/settings.py",
        allow_module_level=True,
    )

from playwright.sync_api import Browser, Page, expect
from rq import SimpleWorker

from demo_project.toggles.factories import PASSWORD, ProfileFactory, UserFactory
from demo_project.toggles.models import Profile
from safeupdates import enqueue_update
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where the screenshots go: the docs only when asked, so that a test run leaves the tree clean."""
    return DOCS_SCREENSHOTS if os.environ.get("SAFEUPDATES_SCREENSHOTS") == "1" else tmp_path


@pytest.fixture(autouse=True)
def admin_static_files(settings: Any) -> None:
    """The live server serves static files from STATIC_ROOT (it has no finders): point it at the admin's
    own, so that the pages (and their screenshots) look as they do for a user."""
    settings.STATIC_ROOT = str(Path(django.contrib.admin.__file__).resolve().parent / "static")


def admin_login(page: Page, username: str) -> None:
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")


def test_a_stale_change_form_shows_what_changed_and_saves_nothing(page: Page, screenshots: Path) -> None:
    boss = UserFactory.superuser(username="boss")
    profile = ProfileFactory(user__username="ann")
    admin_login(page, boss.username)
    page.goto(f"/admin/toggles/profile/{profile.pk}/change/")
    page.check("#id_active")  # the person's edit, while...
    page.check("#id_newsletter")

    # ... a queued toggle of active (and dark mode) lands (what a worker does).
    rid = uuid.uuid4()
    Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True, dark_mode=True)
    page.click("input[name=_save]")

    conflicts = page.locator("#safeupdates-conflicts")
    expect(conflicts).to_be_visible()
    expect(conflicts).to_contain_text("Not saved: this record was changed after you opened it")
    active = conflicts.locator("tr[data-field=active]")
    expect(active.locator(".seen")).to_have_text("False")
    expect(active.locator(".now")).to_have_text("True")
    expect(active.locator(".who")).to_contain_text(f"request {rid}")
    # Only the field both changed: dark mode (the toggle's alone) and newsletter (the person's) are no conflict.
    expect(conflicts.locator("tr.safeupdates-change")).to_have_count(1)
    expect(page.locator("#id_newsletter")).to_be_checked()  # the input is kept
    page.screenshot(path=str(screenshots / "admin-conflict.png"), full_page=True)
    stored = Profile.objects.get(pk=profile.pk)
    assert (stored.active, stored.newsletter, stored.dark_mode) == (True, False, True)

    # The reload shows the current values; the link goes to the request that changed it.
    request_link = active.locator(".who a").get_attribute("href")
    page.click("#safeupdates-reload")
    expect(page.locator("#id_active")).to_be_checked()
    expect(page.locator("#safeupdates-conflicts")).to_have_count(0)
    page.check("#id_newsletter")
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/toggles/profile/")
    assert Profile.objects.get(pk=profile.pk).newsletter is True
    page.goto(str(request_link))
    expect(page.locator(".field-request_id .readonly")).to_have_text(str(rid))


def test_two_staff_users_editing_different_fields_both_save(
    browser: Browser, page: Page, demo_site: str, screenshots: Path
) -> None:
    """Issue 53: Alice and Bob open the same record; each changes a field of their own and saves. Both
    saves land, whatever their order: neither is refused, and neither undoes the other."""
    alice, bob = UserFactory.superuser(username="alice"), UserFactory.superuser(username="bob")
    profile = ProfileFactory(user__username="carol")
    change = f"/admin/toggles/profile/{profile.pk}/change/"
    context = browser.new_context(base_url=demo_site, viewport={"width": 1200, "height": 860})
    context.set_default_timeout(15_000)
    try:
        bobs = context.new_page()
        admin_login(page, alice.username)
        admin_login(bobs, bob.username)
        page.goto(change)
        bobs.goto(change)  # both opened the record at the same version

        page.check("#id_newsletter")
        page.click("input[name=_save]")
        page.wait_for_url("**/admin/toggles/profile/")
        expect(page.locator(".messagelist .success")).to_contain_text("was changed successfully")

        bobs.check("#id_dark_mode")  # Bob's page still shows newsletter off
        expect(bobs.locator("#id_newsletter")).not_to_be_checked()
        bobs.click("input[name=_save]")
        bobs.wait_for_url("**/admin/toggles/profile/")
        expect(bobs.locator(".messagelist .success")).to_contain_text("was changed successfully")
        expect(bobs.locator("#safeupdates-conflicts")).to_have_count(0)
        row = bobs.locator("#result_list tbody tr").filter(has_text="carol")
        expect(row.locator(".field-newsletter img")).to_have_attribute("alt", "True")
        expect(row.locator(".field-dark_mode img")).to_have_attribute("alt", "True")
        expect(row.locator(".field-active img")).to_have_attribute("alt", "False")

        bobs.goto(change)  # the record holds both edits, each with the version of its own write
        expect(bobs.locator("#id_newsletter")).to_be_checked()
        expect(bobs.locator("#id_dark_mode")).to_be_checked()
        bobs.screenshot(path=str(screenshots / "admin-both-saved.png"), full_page=True)
    finally:
        context.close()
    stored = Profile.objects.get(pk=profile.pk)
    assert (stored.active, stored.newsletter, stored.dark_mode) == (False, True, True)


def test_the_request_log_explains_a_stale_request(page: Page, screenshots: Path) -> None:
    boss = UserFactory.superuser(username="boss")
    profile = ProfileFactory(user__username="ann")
    late, newer = next_version(), next_version()
    Profile.objects.update_if_newer(profile.pk, version=newer, request_id=uuid.uuid4(), active=True)
    Profile.objects.update_if_newer(profile.pk, version=late, request_id=uuid.uuid4(), active=False, newsletter=True)
    holder = ProcessedRequest.objects.get(version=newer)
    stale = ProcessedRequest.objects.get(version=late)
    assert stale.status == "applied"  # newsletter was not held by anything newer
    Profile.objects.update_if_newer(profile.pk, version=late, request_id=uuid.uuid4(), active=False)
    lost = ProcessedRequest.objects.get(version=late, status="stale")

    admin_login(page, boss.username)
    page.goto(f"/admin/toggles/profile/{profile.pk}/change/")
    page.click("a.safeupdates-timeline")  # the record's request timeline
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    row = rows.filter(has_text=str(lost.request_id))
    expect(row.locator(".field-wanted")).to_have_text("active=False")
    expect(row.locator(".field-outcome")).to_have_text(f"active: held by v{newer} (request {holder.request_id})")
    page.set_viewport_size({"width": 1500, "height": 1000})
    page.click("#toggle-nav-sidebar")  # room for the columns
    # The page's top: the test project's "By model" filter lists the dozens of models of Django's ported tests.
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(screenshots / "request-log.png"))
    page.click("#toggle-nav-sidebar")
    row.locator(".field-outcome a").click()
    expect(page.locator(".field-request_id .readonly")).to_have_text(str(holder.request_id))


def test_an_operator_re_drives_a_failed_request_and_sees_it_applied(page: Page, screenshots: Path, redis) -> None:
    boss = UserFactory.superuser(username="boss")
    profile = ProfileFactory(user__username="ann", active=False)
    request = enqueue_update(profile, active=True)
    redis.flushdb()  # its job ran out of retries: nothing left on the queue
    ProcessedRequest.objects.filter(pk=request.pk).update(
        status="failed",
        error="OperationalError: server closed the connection unexpectedly",
        attempts=4,
        processed_at=Now(),
    )

    page.goto("/admin/login/?next=/admin/safeupdates/failedrequest/")
    page.fill("#id_username", boss.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/safeupdates/failedrequest/")
    row = page.locator("#result_list tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("server closed the connection unexpectedly")
    # The model filter offers the models with failed requests, not every model of the project.
    models = page.locator("#changelist-filter").get_by_role("link", name="Toggles (demo) | profile")
    expect(models).to_have_count(1)
    expect(page.locator("#changelist-filter").get_by_role("link", name="Testapp | profile")).to_have_count(0)
    page.screenshot(path=str(screenshots / "admin-failed-requests.png"), full_page=True)

    row.locator("input[name=_selected_action]").check()
    page.select_option("select[name=action]", "redrive")
    page.click("button[name=index]")
    expect(page.locator(".messagelist")).to_contain_text("1")
    expect(page.locator("#result_list tbody tr")).to_have_count(0)  # pending now: off the list
    assert ProcessedRequest.objects.get(pk=request.pk).status == "pending"

    queue = django_rq.get_queue("default")
    assert queue.count == 1  # delivered on commit
    SimpleWorker([queue], connection=queue.connection).work(burst=True)
    page.goto(f"/admin/safeupdates/processedrequest/{request.pk}/change/")
    expect(page.locator("body")).to_contain_text("applied")
    page.screenshot(path=str(screenshots / "admin-redriven-request.png"), full_page=True)
    assert Profile.objects.get(pk=profile.pk).active is True
