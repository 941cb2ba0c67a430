"""Admin of the demo's profiles: ``SafeUpdateModelAdmin`` refuses to save over a profile that a queued
update changed since the page was shown, and links each profile to its requests in the request log."""

from __future__ import annotations

from django.contrib import admin

from demo_project.toggles.models import Profile
from safeupdates.admin import SafeUpdateModelAdmin


@admin.register(Profile)
class ProfileAdmin(SafeUpdateModelAdmin):
    """Profiles with their versions; each links to its requests in the request log."""

    list_display = ["user", "active", "newsletter", "dark_mode", "lock_version", "requests_link"]
    list_filter = ["active", "newsletter", "dark_mode"]
    list_select_related = ["user"]
    search_fields = ["user__username"]
    readonly_fields = ["lock_version", "field_versions", "last_synced_at", "requests_link"]
    fields = ["user", "active", "newsletter", "dark_mode", *readonly_fields]
