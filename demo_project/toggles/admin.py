"""Admin of the demo's profiles: ``lock_version`` read-only, a link to each profile's requests, and an
edit form that refuses to overwrite a profile changed since the form was opened (optimistic locking)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from demo_project.toggles.models import Profile
from safeupdates.models import ProcessedRequest


class ProfileForm(forms.ModelForm):  # type: ignore[type-arg]
    """Carries the ``lock_version`` the form was rendered with, so that saving a stale form fails."""

    loaded_lock_version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = Profile
        fields = ["user", "active", "newsletter", "dark_mode"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["loaded_lock_version"].initial = self.instance.lock_version

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        loaded = cleaned.get("loaded_lock_version")
        if self.instance.pk is not None and loaded is not None and loaded != self.instance.lock_version:
            raise ValidationError(
                "This profile was changed (by a queued update) after you opened this form "
                f"(lock_version {loaded} -> {self.instance.lock_version}). Reload the page and make your change again.",
                code="stale",
            )
        return cleaned


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Profiles with their versions; each links to its requests in the request log."""

    form = ProfileForm
    list_display = ["user", "active", "newsletter", "dark_mode", "lock_version", "requests_link"]
    list_filter = ["active", "newsletter", "dark_mode"]
    list_select_related = ["user"]
    search_fields = ["user__username"]
    readonly_fields = ["lock_version", "field_versions", "last_synced_at", "requests_link"]
    fields = ["user", "active", "newsletter", "dark_mode", "loaded_lock_version", *readonly_fields]

    @admin.display(description="requests")
    def requests_link(self, obj: Profile) -> str:
        """A link to the request log, filtered to this profile."""
        if obj.pk is None:
            return "-"
        content_type = ContentType.objects.get_for_model(Profile)
        count = ProcessedRequest.objects.filter(content_type=content_type, object_id=str(obj.pk)).count()
        url = reverse("admin:safeupdates_processedrequest_changelist")
        return format_html(
            '<a href="{}?content_type__id__exact={}&amp;object_id={}">{} request{}</a>',
            url,
            content_type.pk,
            obj.pk,
            count,
            "" if count == 1 else "s",
        )

    def save_model(self, request: HttpRequest, obj: Profile, form: Any, change: bool) -> None:
        loaded = form.cleaned_data.get("loaded_lock_version")
        if change and loaded is not None:
            # save() then writes only if the row still carries the version the form was opened with.
            obj.lock_version = loaded
        super().save_model(request, obj, form, change)
