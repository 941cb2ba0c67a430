"""The view to mount for Prometheus to scrape, like django-rq's ``/metrics``."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from safeupdates import conf
from safeupdates.contrib.prometheus.metrics import registry


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus' text format. With ``SAFEUPDATES_METRICS_TOKEN`` set, for a request with
    ``Authorization: Bearer <token>`` (or a staff user); without it, for logged-in staff users only."""
    token = conf.metrics_token()
    sent = request.headers.get("Authorization", "")
    allowed = bool(token) and constant_time_compare(sent, f"Bearer {token}")
    user = getattr(request, "user", None)
    if not allowed and not (user is not None and user.is_active and user.is_staff):
        response = HttpResponse("Send the metrics token (Authorization: Bearer ...) or log in as staff.", status=403)
        if token:
            response["WWW-Authenticate"] = 'Bearer realm="safeupdates metrics"'
        return response
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
