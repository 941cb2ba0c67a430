"""Views of one record, for ``tests/test_http.py``: the decorator, the CBV mixin, and Django's
``condition()`` as the racy baseline. ``BETWEEN_READ_AND_WRITE`` runs after a view read the record and
before it writes it, so a test can change the row right there."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.http import condition
from django.views.generic import View

from safeupdates.http import ConditionalMixin, conditional, etag_for
from tests.testapp.models import Attachment, Document, Everything, Profile

#: Callables run between a view's read of the record and its write.
BETWEEN_READ_AND_WRITE: list[Callable[[], Any]] = []
#: Values the noting views set themselves (a server-computed note, a score) before they save: fields
#: the client never sees.
VIEW_SETS: dict[str, Any] = {}


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


@conditional(Profile, conflict_fields=["name", "active"])
def fields_view(request: HttpRequest, profile: Profile, pk: int) -> HttpResponse:
    """Saves only the fields the body names (``save(update_fields=...)``): a PATCH."""
    if request.method in ("GET", "HEAD"):
        return JsonResponse(_as_json(profile))
    for hook in BETWEEN_READ_AND_WRITE:
        hook()
    changes = json.loads(request.body or b"{}")
    for name, value in changes.items():
        setattr(profile, name, value)
    profile.save(update_fields=list(changes))
    return JsonResponse(_as_json(profile))


class ProfileView(ConditionalMixin, View):
    model = Profile
    require_if_match = True

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return JsonResponse(_as_json(self.get_object()))

    def put(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return _write(request, self.get_object())

    def delete(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return _write(request, self.get_object())


@conditional(Profile, conflict_fields=["name", "active"])
def declared_view(request: HttpRequest, profile: Profile, pk: int) -> HttpResponse:
    """Shows ``name`` and ``active`` only, and says so: a conflict may show their values."""
    if request.method in ("GET", "HEAD"):
        return JsonResponse({"name": profile.name, "active": profile.active})
    return _write(request, profile)


@conditional(Profile, permission=lambda request, profile: profile.name == request.headers.get("X-Owner"))
def owned_view(request: HttpRequest, profile: Profile, pk: int) -> HttpResponse:
    """Only the owner (here: the X-Owner header) may read or write the record."""
    if request.method in ("GET", "HEAD"):
        return JsonResponse(_as_json(profile))
    return _write(request, profile)


@conditional(lambda request: Profile.objects.filter(pk=request.user))
def per_user_view(request: HttpRequest, profile: Profile, pk: int) -> HttpResponse:
    """A queryset per user that an anonymous user cannot even build (as ``filter(user=request.user)``)."""
    return JsonResponse(_as_json(profile))


@conditional(Profile)
def writes_another_view(request: HttpRequest, profile: Profile, pk: int) -> HttpResponse:
    """Writes its record, then a stale copy of another record: that conflict is the view's own."""
    profile.name = "written"
    profile.save()
    other = Document.objects.get()
    Document.objects.filter(pk=other.pk).update(lock_version=other.lock_version + 1)
    other.title = "over"
    other.save()
    return JsonResponse(_as_json(profile))


@conditional(Profile)
def writes_another_first_view(request: HttpRequest, profile: Profile, pk: int) -> HttpResponse:
    """Writes another record, then its own (which moved on meanwhile)."""
    other = Document.objects.get()
    other.title = "written by the view"
    other.save()
    return _write(request, profile)


class LoggedInProfileView(ConditionalMixin, LoginRequiredMixin, View):
    """The login check comes after ConditionalMixin in the bases: it still runs before any precondition."""

    model = Profile
    raise_exception = True

    def put(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return _write(request, self.get_object())


class OwnedProfileView(ConditionalMixin, View):
    model = Profile

    def has_object_permission(self, request: HttpRequest, obj: Any) -> bool:
        return bool(obj.name == request.headers.get("X-Owner"))

    def put(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return _write(request, self.get_object())


@conditional(Attachment, conflict_fields=["title", "file", "blob", "spot"])
def attachment_view(request: HttpRequest, attachment: Attachment, pk: int) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        for hook in BETWEEN_READ_AND_WRITE:
            hook()
        attachment.title = json.loads(request.body)["title"]
        attachment.save()
    return JsonResponse({"title": attachment.title, "file": attachment.file.name, "spot": str(attachment.spot)})


def _naive_etag(request: HttpRequest, pk: int) -> str:
    return etag_for(Profile.objects.get(pk=pk))


@condition(etag_func=_naive_etag)
def naive_profile_view(request: HttpRequest, pk: int) -> HttpResponse:
    """What Django's own ``condition()`` does: compare the ETag first, then load and write. The window
    is between its compare and the view's read."""
    for hook in BETWEEN_READ_AND_WRITE:
        hook()
    return _write(request, Profile.objects.get(pk=pk), hooks=False)


#: The fields of Everything a client's JSON may set as they are (JSON has their types).
EVERYTHING_JSON_FIELDS = ("flag", "count", "big", "ratio", "name", "text", "slug", "email", "url", "data")


def _write_everything(request: HttpRequest, record: Everything) -> HttpResponse:
    for name, value in json.loads(request.body or b"{}").items():
        if name in EVERYTHING_JSON_FIELDS:
            setattr(record, name, value)
    record.save()
    return JsonResponse({"id": record.pk})


@conditional(Everything)
def everything_view(request: HttpRequest, record: Everything, pk: int) -> HttpResponse:
    """Writes what a client's JSON body holds: a NaN, a lone surrogate, a huge int, as ``json.loads`` makes them."""
    return _write_everything(request, record)


class EverythingView(ConditionalMixin, View):
    model = Everything

    def put(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return _write_everything(request, self.get_object())


def _write_noted(request: HttpRequest, profile: Profile) -> HttpResponse:
    changes = json.loads(request.body or b"{}")
    for name in ("name", "active"):
        if name in changes:
            setattr(profile, name, changes[name])
    for name, value in VIEW_SETS.items():
        setattr(profile, name, value)
    profile.save()
    return JsonResponse({"name": profile.name, "active": profile.active})


@conditional(Profile, conflict_fields=["name", "active"])
def noting_view(request: HttpRequest, profile: Profile, pk: int) -> HttpResponse:
    """Shows ``name`` and ``active``; writes the client's, and values of its own (``VIEW_SETS``) in
    fields the client never sees."""
    if request.method in ("GET", "HEAD"):
        return JsonResponse({"name": profile.name, "active": profile.active})
    return _write_noted(request, profile)


class NotingView(ConditionalMixin, View):
    model = Profile
    conflict_fields = ("name", "active")

    def put(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return _write_noted(request, self.get_object())


urlpatterns = [
    path("noting/<int:pk>/", noting_view),
    path("cbv-noting/<int:pk>/", NotingView.as_view()),
    path("everything/<int:pk>/", everything_view),
    path("cbv-everything/<int:pk>/", EverythingView.as_view()),
    path("profiles/<int:pk>/", profile_view, name="profile"),
    path("fields/<int:pk>/", fields_view),
    path("strict/<int:pk>/", strict_profile_view, name="strict-profile"),
    path("cbv/<int:pk>/", ProfileView.as_view(), name="cbv-profile"),
    path("naive/<int:pk>/", naive_profile_view, name="naive-profile"),
    path("declared/<int:pk>/", declared_view),
    path("owned/<int:pk>/", owned_view),
    path("per-user/<int:pk>/", per_user_view),
    path("writes-another/<int:pk>/", writes_another_view),
    path("writes-another-first/<int:pk>/", writes_another_first_view),
    path("logged-in/<int:pk>/", LoggedInProfileView.as_view()),
    path("cbv-owned/<int:pk>/", OwnedProfileView.as_view()),
    path("attachments/<int:pk>/", attachment_view),
]
