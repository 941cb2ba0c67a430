"""Views of one record, for ``tests/test_http.py``: the decorator, the CBV mixin, and Django's
``condition()`` as the racy baseline. ``BETWEEN_READ_AND_WRITE`` runs after a view read the record and
before it writes it, so a test can change the row right there."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.http import condition
from django.views.generic import View

from safeupdates.http import ConditionalMixin, conditional, etag_for
from tests.testapp.models import Profile

#: Callables run between a view's read of the record and its write.
BETWEEN_READ_AND_WRITE: list[Callable[[], Any]] = []


def _as_json(profile: Profile) -> dict[str, Any]:
    return {"id": profile.pk, "name": profile.name, "active": profile.active, "lock_version": profile.lock_version}


def _write(request: HttpRequest, profile: Profile, *, hooks: bool = True) -> HttpResponse:
    for hook in BETWEEN_READ_AND_WRITE if hooks else ():
        hook()
    if request.method == "DELETE":
        profile.delete()
        return HttpResponse(status=204)
    changes = json.loads(request.body or b"{}")
    for name in ("name", "active"):
        if name in changes:
            setattr(profile, name, changes[name])
    profile.save()
    return JsonResponse(_as_json(profile))


@conditional(Profile)
def profile_view(request: HttpRequest, profile: Profile, pk: int) -> HttpResponse:
    if request.method in ("GET", "HEAD"):
        return JsonResponse(_as_json(profile))
    return _write(request, profile)


@conditional(lambda request: Profile.objects.exclude(name="hidden"), require_if_match=True)
def strict_profile_view(request: HttpRequest, profile: Profile, pk: int) -> HttpResponse:
    if request.method in ("GET", "HEAD"):
        return JsonResponse(_as_json(profile))
    return _write(request, profile)


class ProfileView(ConditionalMixin, View):
    model = Profile
    require_if_match = True

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return JsonResponse(_as_json(self.get_object()))

    def put(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return _write(request, self.get_object())

    def delete(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return _write(request, self.get_object())


def _naive_etag(request: HttpRequest, pk: int) -> str:
    return etag_for(Profile.objects.get(pk=pk))


@condition(etag_func=_naive_etag)
def naive_profile_view(request: HttpRequest, pk: int) -> HttpResponse:
    """What Django's own ``condition()`` does: compare the ETag first, then load and write. The window
    is between its compare and the view's read."""
    for hook in BETWEEN_READ_AND_WRITE:
        hook()
    return _write(request, Profile.objects.get(pk=pk), hooks=False)


urlpatterns = [
    path("profiles/<int:pk>/", profile_view, name="profile"),
    path("strict/<int:pk>/", strict_profile_view, name="strict-profile"),
    path("cbv/<int:pk>/", ProfileView.as_view(), name="cbv-profile"),
    path("naive/<int:pk>/", naive_profile_view, name="naive-profile"),
]
