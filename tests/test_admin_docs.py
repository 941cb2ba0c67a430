"""The examples of ``docs/admin.md`` run as written, with the quick start's ``Profile`` (the demo app's).

Its ``toggles/admin.py`` is the quick start's, which ``tests/test_quickstart.py`` runs in a project of its
own; its ``toggles/forms.py`` is imported here from a package whose ``models`` module is the demo app's,
routed, and driven with Django's test client.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User

from tests.docs_blocks import example_package, file_blocks
from tests.htmlforms import form_data

if not apps.is_installed("demo_project.toggles"):
    pytest.skip("the demo app (the quick start's Profile) is not installed", allow_module_level=True)

from demo_project.toggles.models import Profile
from safeupdates.versions import next_version

pytestmark = pytest.mark.django_db

PACKAGE = "admin_docs_example"
URLS = """
from django.http import HttpResponse
from django.urls import path

from . import forms

urlpatterns = [
    path("settings/", lambda request: HttpResponse("the settings page"), name="settings"),
    path("profile/<int:pk>/", forms.ProfileUpdate.as_view()),
]
"""
TEMPLATE = '<form method="post">{% csrf_token %}{{ form }}<button>Save</button></form>'


def test_the_admin_example_is_the_quick_starts():
    assert file_blocks("docs/admin.md")["toggles/admin.py"] == file_blocks("docs/quickstart.md")["toggles/admin.py"]


@pytest.fixture
def example(tmp_path: Path, settings: Any) -> Iterator[None]:
    """The page's ``toggles/forms.py`` as ``admin_docs_example/forms.py``, its view routed, and the
    template its comment names (``{{ form }}``, as the page says)."""
    blocks = file_blocks("docs/admin.md")
    assert set(blocks) == {"toggles/admin.py", "toggles/forms.py"}
    files = {"forms.py": blocks["toggles/forms.py"], "urls.py": URLS}
    with example_package(tmp_path, PACKAGE, files):
        (tmp_path / "templates" / "toggles").mkdir(parents=True)
        (tmp_path / "templates" / "toggles" / "profile_form.html").write_text(TEMPLATE)
        settings.ROOT_URLCONF = f"{PACKAGE}.urls"
        settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [str(tmp_path / "templates")]}]
        yield


def test_the_form_and_update_view_example(example: None, client: Any) -> None:
    from admin_docs_example.forms import ProfileForm  # type: ignore[import-not-found]

    profile = Profile.objects.create(user=User.objects.create_user("ada"))
    assert "safeupdates_token" in str(ProfileForm(instance=profile))

    url = f"/profile/{profile.pk}/"
    seen = form_data(client.get(url).content)
    rid = uuid.uuid4()
    assert Profile.objects.update_if_newer(profile.pk, version=next_version(), request_id=rid, active=True).applied

    # The page was opened before the toggle landed: an edit of the field it changed is refused...
    refused = client.post(url, {**seen, "active": "on", "newsletter": "on"})
    assert refused.status_code == 200
    form = refused.context["form"]
    assert set(form.errors) == {"__all__", "active"} and form.safeupdates_conflict.fields == ["active"]
    assert (Profile.objects.get().active, Profile.objects.get().newsletter) == (True, False)

    # ... an edit of another field lands beside it.
    saved = client.post(url, {**seen, "newsletter": "on"})
    assert saved.status_code == 302 and saved["Location"] == "/settings/"
    assert (Profile.objects.get().active, Profile.objects.get().newsletter) == (True, True)
