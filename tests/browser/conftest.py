"""Headless Chromium for the browser tests, driven through Playwright's Python API.

No browser can be downloaded here, so Playwright drives the system's Chromium (Debian's ``chromium``
package, or the binary named by ``CHROMIUM``). Without it, the browser tests skip and say how to install it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.conf import settings
from django.test import override_settings

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session", autouse=True)
def static_url_for_live_server() -> Iterator[None]:
    """pytest-django's live server serves static files under ``STATIC_URL`` and fails every request when
    it is unset, as in settings without ``django.contrib.staticfiles``: give it one. Session-scoped, so
    that it is in place before the (session-scoped) live server starts."""
    if settings.STATIC_URL is not None:
        yield
        return
    with override_settings(STATIC_URL="/static/"):
        yield


@pytest.fixture(scope="module")
def browser(django_db_setup: None) -> Iterator[Browser]:
    """One headless Chromium per test module, started once the test database exists."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Chromium is not installed at {CHROMIUM}: `apt-get install -y chromium`, or set CHROMIUM.")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop running in this thread while it is open, which Django
    # takes for an async context and refuses ORM calls. The tests' ORM calls are plain synchronous code
    # all the same, so allow them, for as long as Playwright is open only.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def demo_site(settings: Any, live_server: Any) -> str:
    """The demo project's URLs served by pytest-django's live server; returns its base URL."""
    settings.ROOT_URLCONF = "demo_project.urls"
    return str(live_server.url)


@pytest.fixture
def page(browser: Browser, demo_site: str) -> Iterator[Page]:
    """A fresh browser tab (own cookies) on the demo site; relative URLs resolve against it."""
    context = browser.new_context(base_url=demo_site, viewport={"width": 1200, "height": 860})
    context.set_default_timeout(15_000)
    tab = context.new_page()
    yield tab
    context.close()
