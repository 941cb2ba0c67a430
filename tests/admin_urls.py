"""The default admin, and an admin site of its own for the models of ``tests/test_admin_conflicts.py``
(a site with another name: its pages must link within it)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from safeupdates.admin import SafeUpdateModelAdmin
from tests.testapp.models import Attachment, Profile

site = admin.AdminSite(name="surfaces")


@admin.register(Attachment, site=site)
class AttachmentAdmin(SafeUpdateModelAdmin):
    fields = ["title", "file", "spot", "blob"]
    readonly_fields = ["blob"]
    list_display = ["title", "spot"]


@admin.register(Profile, site=site)
class ProfileAdmin(SafeUpdateModelAdmin):
    """Profiles with an action, on a site whose name is not ``admin``."""

    list_display = ["name", "active"]
    actions = ["add_a_point"]

    @admin.action(description="Add a point")
    def add_a_point(self, request, queryset):  # type: ignore[no-untyped-def]
        for profile in queryset:
            profile.score += 1
            profile.save()


urlpatterns = [path("admin/", admin.site.urls), path("surfaces/", site.urls)]
