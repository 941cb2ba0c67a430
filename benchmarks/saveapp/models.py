"""The table shape of ``testapp.Profile`` three times: plain Django, django-concurrency, safeupdates.

The app has no migrations: the benchmark creates its tables with ``migrate --run-syncdb``, so no
migration can drift from these models.
"""

from __future__ import annotations

from concurrency.fields import IntegerVersionField
from django.db import models

from safeupdates.models import LockVersionMixin


class Row(models.Model):
    """The fields every contender saves (``testapp.Profile``'s, without its constraint)."""

    name = models.CharField(max_length=20, default="")
    active = models.BooleanField(default=False)
    newsletter = models.BooleanField(default=False)
    dark_mode = models.BooleanField(default=False)
    score = models.IntegerField(default=0)
    note = models.TextField(blank=True, default="")

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{type(self).__name__} {self.pk}"


class PlainRow(Row):
    """Plain Django: ``save()`` is one ``UPDATE ... WHERE id = %s``."""


class ConcurrencyRow(Row):
    """django-concurrency's optimistic locking: a version from the clock, checked in the UPDATE."""

    version = IntegerVersionField()


class LockVersionRow(LockVersionMixin, Row):
    """safeupdates' optimistic locking (``LockVersionMixin.save()``)."""
