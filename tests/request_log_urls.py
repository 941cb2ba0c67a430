"""An admin site whose ``Profile`` admin refuses everyone but a superuser, beside the request log's admin
(``tests/test_request_log_permissions.py``: the model's own admin decides who may see a request's values)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import path

from safeupdates.admin import ProcessedRequestAdmin
from safeupdates.models import ProcessedRequest
from tests.testapp.admin import ProfileAdmin
from tests.testapp.models import Profile


class SuperusersOnlyProfileAdmin(ProfileAdmin):
    """A project's admin of profiles that no one but a superuser may view, whatever permissions they hold."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(getattr(request.user, "is_superuser", False))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(getattr(request.user, "is_superuser", False))


site = admin.AdminSite(name="admin")
site.register(ProcessedRequest, ProcessedRequestAdmin)
site.register(Profile, SuperusersOnlyProfileAdmin)

urlpatterns = [path("admin/", site.urls)]
