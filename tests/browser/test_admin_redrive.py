"""An operator re-drives a failed request from the admin, in headless Chromium against the live server,
and sees it applied. Screenshots as in test_admin_conflicts.py (``SAFEUPDATES_SCREENSHOTS=1``: into
``docs/screenshots/``)."""

from __future__ import annotations

import os
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

from playwright.sync_api import Page, expect
from rq import SimpleWorker

from demo_project.toggles.factories import PASSWORD, ProfileFactory, UserFactory
from demo_project.toggles.models import Profile
from safeupdates import enqueue_update
from safeupdates.models import ProcessedRequest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    return DOCS_SCREENSHOTS if os.environ.get("SAFEUPDATES_SCREENSHOTS") == "1" else tmp_path


@pytest.fixture(autouse=True)
def admin_static_files(settings: Any) -> None:
    settings.STATIC_ROOT = str(Path(django.contrib.admin.__file__).resolve().parent / "static")


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
