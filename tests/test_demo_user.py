"""``manage.py demo_user``: the user of the toggle page and the admin."""

from __future__ import annotations

from io import StringIO

import pytest
from django.apps import apps

if not apps.is_installed("demo_project.toggles"):
    pytest.skip(
        "the demo app is not installed: add 'demo_project.toggles' to INSTALLED_APPS in tests/settings.py",
        allow_module_level=True,
    )

from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

from demo_project.toggles.models import Profile

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("demo_user", *args, stdout=out)
    return out.getvalue()


def test_creates_the_demo_superuser_with_a_profile() -> None:
    output = run()
    user = get_user_model().objects.get(username="demo")
    assert (user.is_staff, user.is_superuser) == (True, True)
    assert authenticate(username="demo", password="demo") == user
    assert Profile.objects.get(user=user).toggles() == {"active": False, "newsletter": False, "dark_mode": False}
    assert output.startswith("Created superuser 'demo' (password 'demo') with profile ")
    assert "log in at http://127.0.0.1:8000/" in output


def test_run_again_resets_the_password_and_keeps_the_profile() -> None:
    run("--password", "first")
    profile = Profile.objects.get(user__username="demo")
    output = run("--password", "second")
    assert output.startswith("Updated superuser 'demo'")
    assert authenticate(username="demo", password="second") is not None
    assert Profile.objects.get(user__username="demo") == profile


def test_keep_existing_leaves_the_user_alone() -> None:
    run("--password", "mine")
    assert run("--keep-existing").strip() == "User 'demo' exists; left as it is."
    assert authenticate(username="demo", password="mine") is not None


def test_plain_user() -> None:
    run("--username", "alice", "--password", "pw", "--no-superuser")
    user = get_user_model().objects.get(username="alice")
    assert (user.is_staff, user.is_superuser) == (False, False)
    assert Profile.objects.filter(user=user).exists()
