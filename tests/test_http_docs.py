"""The examples of ``docs/http.md`` run as written, with the quick start's ``Profile`` (a user's, with
``user`` NOT NULL: the demo app's model is that one).

Each block marked ``<!-- file: toggles/NAME -->`` is written, as it stands in the page, into a package
whose ``models`` module is the demo app's; the test routes the views as the page says and drives them
with Django's test client and DRF's.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User

if not apps.is_installed("demo_project.toggles"):
    pytest.skip("the demo app (the quick start's Profile) is not installed", allow_module_level=True)

from demo_project.toggles.models import Profile
from safeupdates.http import etag_for
from safeupdates.versions import next_version

pytestmark = pytest.mark.django_db

PAGE = Path(__file__).resolve().parent.parent / "docs" / "http.md"
_BLOCK = re.compile(r"<!-- file: toggles/(?P<name>\w+\.py) -->\n```python\n(?P<body>.*?)```", re.S)
PACKAGE = "http_docs_example"
# The routes as the page gives them, both in one URLconf: a project that takes both examples.
VIEW_ROUTE = re.search(r'`(path\("[^"]+", api\.profile_api\))`', PAGE.read_text())
DRF_ROUTE = re.search(r'`(router\.register\("[^"]+", api_drf\.ProfileViewSet, basename="profile"\))`', PAGE.read_text())
assert VIEW_ROUTE and DRF_ROUTE, "docs/http.md no longer says how to route its examples"
URLS = f"""
from django.urls import include, path

from . import api

urlpatterns = [{VIEW_ROUTE[1]}]
try:
    from rest_framework.routers import SimpleRouter

    from . import api_drf
except ImportError:  # DRF is an optional extra
    pass
else:
    router = SimpleRouter()
    {DRF_ROUTE[1]}
    urlpatterns += [path("", include(router.urls))]
"""


@pytest.fixture
def example(tmp_path: Path, settings: Any) -> Iterator[None]:
    """The page's blocks as ``http_docs_example/<file>``, routed by ``http_docs_example.urls``."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text("from demo_project.toggles.models import Profile  # noqa: F401\n")
    written = {m["name"]: m["body"] for m in _BLOCK.finditer(PAGE.read_text())}
    assert set(written) == {"api.py", "api_drf.py"}
    for name, body in written.items():
        (package / name).write_text(body)
    (package / "urls.py").write_text(URLS)
    sys.path.insert(0, str(tmp_path))
    settings.ROOT_URLCONF = f"{PACKAGE}.urls"
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[module]


def put(client: Any, url: str, body: Any, **headers: str) -> Any:
    data = body if isinstance(body, str) else json.dumps(body)
    return client.put(url, data, content_type="application/json", headers=headers)


def test_the_view_function_example(example: None, client: Any) -> None:
    ada, bob = User.objects.create_user("ada"), User.objects.create_user("bob")
    profile = Profile.objects.create(user=ada)
    url = f"/api/profile/{profile.pk}/"

    anonymous = client.get(url)
    assert anonymous.status_code == 302 and "login" in anonymous["Location"]  # the login check comes first
    assert put(client, url, {"active": True}, if_match=etag_for(profile)).status_code == 302

    client.force_login(ada)
    read = client.get(url)
    assert read.status_code == 200 and read.json() == {"active": False, "newsletter": False}
    seen = read["ETag"]
    assert put(client, url, {"active": True}).status_code == 428
    for bad in ({"active": "yes"}, {"active": 1}, {}, [], "not json", "null"):
        response = put(client, url, bad, if_match=seen)
        assert response.status_code == 400, bad
    assert Profile.objects.get().active is False

    written = put(client, url, {"active": True}, if_match=seen)
    assert written.status_code == 200 and written.json() == {"active": True, "newsletter": False}
    assert written["ETag"] != seen and Profile.objects.get().active is True

    Profile.objects.update_if_newer(profile.pk, version=next_version(), newsletter=True)
    stale = put(client, url, {"active": False}, if_match=written["ETag"])
    assert stale.status_code == 412
    assert [(c["field"], c["now"], c["seen"]) for c in stale.json()["changes"]] == [("newsletter", True, False)]
    assert Profile.objects.get().active is True

    client.force_login(bob)  # another user: the profile is not there for him, whatever he sends
    assert client.get(url).status_code == 404
    response = put(client, url, {"active": False}, if_match=written["ETag"])
    assert response.status_code == 412 and response.json() == {
        "detail": "If-Match: the record does not exist (any more); nothing was written."
    }


def test_the_rest_framework_example(example: None) -> None:
    pytest.importorskip("rest_framework", reason="Django REST framework is not installed")
    from rest_framework.test import APIClient

    api = APIClient()
    ada = User.objects.create_user("ada")
    assert api.get("/api/profiles/").status_code in (401, 403)
    assert api.post("/api/profiles/", {"active": True}, "json").status_code in (401, 403)

    api.force_authenticate(ada)
    created = api.post("/api/profiles/", {"active": True, "lock_version": 10**12}, "json")
    assert created.status_code == 201, created.content
    profile = Profile.objects.get()
    assert (profile.user, profile.active) == (ada, True)
    assert created["ETag"] == etag_for(profile, ["active", "newsletter"])
    again = api.post("/api/profiles/", {"active": False}, "json")
    assert again.status_code == 400 and Profile.objects.count() == 1

    url = f"/api/profiles/{profile.pk}/"
    changed = api.patch(url, {"newsletter": True}, "json", headers={"if_match": created["ETag"]})
    assert changed.status_code == 200 and changed.json()["newsletter"] is True
    stale = api.patch(url, {"active": False}, "json", headers={"if_match": created["ETag"]})
    assert stale.status_code == 412
    assert [(c["field"], c["now"]) for c in stale.json()["changes"]] == [("newsletter", True)]
    body = api.patch(url, {"active": False, "lock_version": profile.lock_version}, "json")
    assert body.status_code == 409 and Profile.objects.get().active is True
    assert api.patch(url, {"active": False, "lock_version": 2**63}, "json").status_code == 400
