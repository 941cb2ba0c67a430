"""The tables of ``fan_out()``: a batch, and its items."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

__all__ = ["Batch", "BatchItem", "BatchStatus"]


class BatchStatus(models.TextChoices):
    """Status of a :class:`Batch`."""

    RUNNING = "running", _("running")
    DONE = "done", _("done")
    REDUCE_FAILED = "reduce_failed", _("reduce failed")


class Batch(models.Model):
    """A fan-out of item jobs and the reduce that runs once every item has finished.

    ``succeeded`` and ``failed`` are counted in PostgreSQL, each item once, in the transaction that
    records the item's outcome; the transaction that counts the last item marks the batch ``done`` and
    enqueues the reduce. ``reduced_at`` is set when the reduce has run, exactly once. A reduce that
    raises is counted in ``reduce_attempts`` and run again by the relay, at most once every
    ``SAFEUPDATES_RELAY_AFTER`` seconds, until ``SAFEUPDATES_REDUCE_ATTEMPTS`` attempts have failed: the
    batch is then ``reduce_failed``.
    """

    Status = BatchStatus

    batch_id = models.UUIDField(_("batch id"), unique=True, default=uuid.uuid4, editable=False)
    item_func = models.CharField(_("item function"), max_length=255)
    then = models.CharField(_("reduce function"), max_length=255, blank=True, default="")
    queue = models.CharField(_("queue"), max_length=100)
    retries = models.PositiveIntegerField(_("retries per item"), default=0)
    total = models.PositiveIntegerField(_("items"))
    succeeded = models.PositiveIntegerField(_("succeeded"), default=0)
    failed = models.PositiveIntegerField(_("failed"), default=0)
    status = models.CharField(_("status"), max_length=16, choices=BatchStatus.choices, default=BatchStatus.RUNNING)
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    reduced_at = models.DateTimeField(_("reduced at"), null=True, blank=True)
    reduce_attempts = models.PositiveIntegerField(_("failed reduce attempts"), default=0)
    reduce_error = models.TextField(_("last reduce error"), blank=True, default="")
    reduce_failed_at = models.DateTimeField(_("last reduce failure"), null=True, blank=True)

    class Meta:
        # Explicit: imported without its app installed, the model would otherwise take the label of
        # the app that contains its module, "safeupdates", and makemigrations would offer to write it
        # into the library's own migrations. Under this label, a registry without the app ignores it.
        app_label = "safeupdates_batches"
        verbose_name = _("batch")
        verbose_name_plural = _("batches")
        indexes = [models.Index(fields=["status", "created_at"], name="safeupdates_batch_status")]

    def __str__(self) -> str:
        return f"batch {self.batch_id} {self.succeeded + self.failed}/{self.total}"

    @property
    def progress(self) -> float:
        """Fraction of the items that have finished, from 0.0 to 1.0."""
        return (self.succeeded + self.failed) / self.total if self.total else 1.0


class BatchItem(models.Model):
    """Item ``index`` of a :class:`Batch`. Its outcome is recorded by the request log's row of
    ``request_id`` (kind ``batch_item``), which its job locks, runs and marks."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="items", verbose_name=_("batch"))
    index = models.PositiveIntegerField(_("index"))
    request_id = models.UUIDField(_("request id"), unique=True, editable=False)

    class Meta:
        app_label = "safeupdates_batches"  # explicit, as Batch's
        verbose_name = _("batch item")
        verbose_name_plural = _("batch items")
        constraints = [models.UniqueConstraint(fields=["batch", "index"], name="safeupdates_batch_item_index")]

    def __str__(self) -> str:
        return f"item {self.index} of batch #{self.batch_id}"
