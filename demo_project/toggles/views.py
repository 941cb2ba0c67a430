"""The toggle page: every click POSTs to :func:`toggle`, which records a versioned request with
``enqueue_update``; the page polls :func:`state` to show the stored values and the requests settling."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from demo_project.toggles.models import Profile
from safeupdates import enqueue_update
from safeupdates.exceptions import InvalidUpdate
from safeupdates.models import ProcessedRequest, RequestStatus

#: How many of the latest requests the page lists.
LATEST = 12
TRUE_WORDS = frozenset({"true", "on", "1", "yes"})
FALSE_WORDS = frozenset({"false", "off", "0", "no"})
FORBIDDEN = "This is not your profile: you can only see and change your own."


def _profile_of(request: HttpRequest, pk: int) -> Profile:
    """The profile ``pk``, if it belongs to the user making the request (else ``PermissionDenied``)."""
    profile = get_object_or_404(Profile.objects.select_related("user"), pk=pk)
    if profile.user_id != request.user.pk:
        raise PermissionDenied(FORBIDDEN)
    return profile


def _error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _shown(text: str) -> str:
    """``text`` quoted for an error message, cut short: an error never echoes a whole (huge) input."""
    return repr(text if len(text) <= 40 else f"{text[:40]}...")


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """Send the user to their own profile's page (created on first visit)."""
    return HttpResponseRedirect(reverse("toggles:profile", args=[Profile.for_user(request.user).pk]))


@login_required
@require_GET
@never_cache
def profile_page(request: HttpRequest, pk: int) -> HttpResponse:
    """The toggle page of the user's own profile; 403 for anybody else's."""
    try:
        profile = _profile_of(request, pk)
    except PermissionDenied:
        return render(request, "toggles/forbidden.html", {"message": FORBIDDEN}, status=403)
    return render(
        request,
        "toggles/profile.html",
        {
            "profile": profile,
            "state": state_of(profile),
            "toggles": [
                {
                    "name": name,
                    "label": getattr(Profile._meta.get_field(name), "verbose_name", name),
                    "value": getattr(profile, name),
                    "version": profile.field_version(name),
                }
                for name in Profile.safe_update_fields
            ],
            "content_type_id": ContentType.objects.get_for_model(Profile).pk,
        },
    )


@login_required
@require_POST
def toggle(request: HttpRequest, pk: int) -> JsonResponse:
    """Record one click: POST ``field`` (a toggle's name), ``value`` (``true`` or ``false``) and optionally
    ``request_id`` (a UUID naming the click, so that a retry is recorded once).

    Answers 202 with the pending request; 400 with a message saying what is wrong with the input,
    whatever was posted; 403 for another user's profile. The write itself happens later, in a worker.
    """
    try:
        profile = _profile_of(request, pk)
    except PermissionDenied:
        return _error(FORBIDDEN, 403)
    names = ", ".join(Profile.safe_update_fields)
    field = request.POST.get("field", "").strip()
    raw = request.POST.get("value", "").strip()
    if not field:
        return _error(f"Missing 'field': say which toggle to change, one of: {names}.", 400)
    # Only a toggle's name reaches enqueue_update(**changes): any other name could be one of its own
    # parameters (obj_or_model, pk, queue, request_id) and collide with it.
    if field not in Profile.safe_update_fields:
        return _error(f"{_shown(field)} is not a toggle; 'field' must be one of: {names}.", 400)
    if not raw:
        return _error("Missing 'value': send true or false.", 400)
    if raw.lower() not in TRUE_WORDS | FALSE_WORDS:
        return _error(f"{_shown(raw)} is not a toggle's value: send true or false.", 400)
    changes: dict[str, Any] = {field: raw.lower() in TRUE_WORDS}
    request_id = request.POST.get("request_id", "").strip() or None
    try:
        recorded = enqueue_update(profile, request_id=request_id, **changes)
    except InvalidUpdate as exc:
        return _error(str(exc), 400)
    return JsonResponse({"request": _request_json(recorded)}, status=202)


@login_required
@require_GET
@never_cache
def state(request: HttpRequest, pk: int) -> JsonResponse:
    """The stored toggles, the version and the latest requests of the user's own profile, as JSON."""
    try:
        profile = _profile_of(request, pk)
    except PermissionDenied:
        return _error(FORBIDDEN, 403)
    return JsonResponse(state_of(profile))


def state_of(profile: Profile) -> dict[str, Any]:
    """What the page shows: stored values, per-field versions, pending fields and the latest requests.

    The request log is read before the record: a request a worker applies in between is then either
    still pending here or in the values read after it. The other way round, the state could say "nothing
    pending" beside the value the worker had just replaced, and the page take that value for the final one.
    """
    requests = ProcessedRequest.objects.filter(
        content_type=ContentType.objects.get_for_model(Profile), object_id=str(profile.pk)
    )
    pending_changes = list(requests.filter(status=RequestStatus.PENDING).values_list("changes", flat=True))
    pending_fields = set()
    for changes in pending_changes:
        pending_fields.update(changes)
    total = requests.count()
    latest = list(requests.order_by("-version")[:LATEST])
    profile.refresh_from_db()
    return {
        "profile": {
            "id": profile.pk,
            "user": profile.user.get_username(),
            "toggles": profile.toggles(),
            "versions": {name: profile.field_version(name) for name in Profile.safe_update_fields},
            "lock_version": profile.lock_version,
        },
        "pending": len(pending_changes),
        "total": total,
        "pending_fields": sorted(pending_fields),
        "requests": [_request_json(r) for r in latest],
    }


def _request_json(request: ProcessedRequest) -> dict[str, Any]:
    return {
        "request_id": str(request.request_id),
        "version": request.version,
        "changes": request.changes,
        "status": request.status,
        "error": request.error,
        "created_at": request.created_at.isoformat() if hasattr(request.created_at, "isoformat") else None,
        "processed_at": request.processed_at.isoformat() if request.processed_at else None,
    }
