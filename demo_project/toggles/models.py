"""The demo's model: one ``Profile`` per user with three toggles that queued jobs may change."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models

from demo_project.toggles.plan import FIELDS
from safeupdates.models import SafeUpdateModel


class Profile(SafeUpdateModel):
    """A user's settings. Every click on the toggle page becomes a queued, versioned update of one field.

    ``safe_update_fields`` names the only fields that the job path may change; ``lock_version``,
    ``field_versions`` and ``last_synced_at`` come from :class:`~safeupdates.models.SafeUpdateModel`.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile")
    active = models.BooleanField(default=False)
    newsletter = models.BooleanField(default=False)
    dark_mode = models.BooleanField("dark mode", default=False)

    safe_update_fields = FIELDS

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"profile of {self.user}"

    @classmethod
    def for_user(cls, user: Any) -> Profile:
        """Return ``user``'s profile, creating it (all toggles off) on first use."""
        profile, _created = cls.objects.get_or_create(user=user)
        return profile

    def toggles(self) -> dict[str, bool]:
        """The stored value of every toggle, by field name."""
        return {name: bool(getattr(self, name)) for name in self.safe_update_fields}
