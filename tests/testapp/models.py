from __future__ import annotations

from django.db import models

from safeupdates.models import LockVersionMixin, SafeUpdateModel


class Profile(SafeUpdateModel):
    """A user's settings, toggled from queued jobs."""

    name = models.CharField(max_length=20, default="")
    active = models.BooleanField(default=False)
    newsletter = models.BooleanField(default=False)
    dark_mode = models.BooleanField(default=False)
    score = models.IntegerField(default=0)
    note = models.TextField(blank=True, default="")

    safe_update_fields = ("name", "active", "newsletter", "dark_mode", "score")

    class Meta:
        # A rule only the database knows, for the tests of values the database refuses.
        constraints = [
            models.CheckConstraint(condition=~models.Q(score=-13), name="testapp_profile_score_not_minus_13")
        ]

    def __str__(self) -> str:
        return self.name or f"profile {self.pk}"


class Document(LockVersionMixin):
    """A model with optimistic locking only (no manager of safeupdates)."""

    title = models.CharField(max_length=100)
    body = models.TextField(blank=True, default="")


class ReduceRun(models.Model):
    """One row per run of a fan-out's reduce, so that tests can count them."""

    batch_id = models.CharField(max_length=36)

    def __str__(self) -> str:
        return self.batch_id
