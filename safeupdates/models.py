"""The models of safeupdates: ``SafeUpdateModel``, the abstract base of your models, and the app's tables.

``ProcessedRequest`` is the request log: outbox for the job path, idempotency record, and audit trail in
one table. ``SafeUpdateModel`` is the two mixins of the save path (:mod:`safeupdates.write.mixins`, both
importable from here too) with :class:`~safeupdates.managers.SafeUpdateManager`.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any, ClassVar

from django.apps import apps
from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from safeupdates.database.statements import BASE_VERSION_KEY
from safeupdates.lifecycle import TERMINAL_STATUSES, RequestKind, RequestLogQuerySet, RequestStatus
from safeupdates.managers import SafeUpdateManager
from safeupdates.write.mixins import (
    LockVersionMixin,
    NotedValues,
    SyncedAtMixin,
    checked_per_row,
    only_changes,
)


def _require_installed() -> None:
    """Refuse to define the app's tables outside an installed ``safeupdates``: Django would end every command
    in a RuntimeError about ``ProcessedRequest``'s app_label, which does not say what to add. (Before the app
    registry is populated Django raises its own AppRegistryNotReady, which says enough.)"""
    if apps.apps_ready and not any(config.name == "safeupdates" for config in apps.get_app_configs()):
        raise ImproperlyConfigured(
            "'safeupdates' is not in INSTALLED_APPS, but safeupdates.models is imported (by a model of the "
            "project, or an import of safeupdates'). Add 'safeupdates' to INSTALLED_APPS, after "
            "'django.contrib.contenttypes'."
        )


_require_installed()

__all__ = [
    "BASE_VERSION_KEY",
    "TERMINAL_STATUSES",
    "ChangesEncoder",
    "FailedRequest",
    "LockVersionMixin",
    "NotedValues",
    "ProcessedRequest",
    "RequestKind",
    "RequestLogManager",
    "RequestStatus",
    "SafeUpdateModel",
    "SyncedAtMixin",
    "VersionCounter",
    "WaitingMessage",
    "checked_per_row",
    "only_changes",
]


class SafeUpdateModel(LockVersionMixin, SyncedAtMixin):
    """Abstract base of a model updated by queued jobs: both mixins and :class:`SafeUpdateManager`.

    Name the fields that queued jobs may change in ``safe_update_fields``; the job path refuses all
    others.
    """

    safe_update_fields: ClassVar[tuple[str, ...]] = ()

    objects = SafeUpdateManager()

    class Meta:
        abstract = True


class ChangesEncoder(DjangoJSONEncoder):
    """JSON encoder of the request log's ``changes``: datetimes and times keep their microseconds
    (``DjangoJSONEncoder`` cuts them to milliseconds, and the job writes what the log holds)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, datetime.datetime | datetime.time):
            text = o.isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        return super().default(o)


#: The request log's manager: every change of a request's status is a method of its QuerySet.
RequestLogManager = models.Manager.from_queryset(RequestLogQuerySet)


class ProcessedRequest(models.Model):
    """One update request: outbox row while ``pending``, then its outcome and idempotency record.

    ``created_at`` and ``processed_at`` come from the database's clock, never from a worker's. Its
    status changes only through its manager's methods (:mod:`safeupdates.lifecycle`).
    """

    Status = RequestStatus
    Kind = RequestKind

    request_id = models.UUIDField(_("request id"), unique=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(_("kind"), max_length=16, choices=RequestKind.choices, default=RequestKind.UPDATE)
    # Null for requests that target no row (a keyed task of @idempotent). No database constraint: every
    # request INSERT would check it at commit with a FOR KEY SHARE lock on the one content type row that
    # a burst of requests shares (measured: 8% of a recorded update_if_newer). Deleting a content type
    # still cascades, through Django. No index of its own: safeupdates_target_version starts with it.
    content_type = models.ForeignKey(
        ContentType,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name=_("model"),
        null=True,
        blank=True,
        db_constraint=False,
        db_index=False,
    )
    object_id = models.CharField(_("object id"), max_length=255, blank=True, default="")
    key = models.CharField(_("key"), max_length=255, blank=True, default="")
    target = GenericForeignKey("content_type", "object_id")
    version = models.BigIntegerField(_("version"), null=True, blank=True)
    changes = models.JSONField(_("changes"), default=dict, encoder=ChangesEncoder)
    status = models.CharField(_("status"), max_length=16, choices=RequestStatus.choices, default=RequestStatus.PENDING)
    error = models.TextField(_("error"), blank=True, default="")
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    queue = models.CharField(_("queue"), max_length=100, blank=True, default="")
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    processed_at = models.DateTimeField(_("processed at"), null=True, blank=True)
    # The client timestamp of a timestamp-mode request (update_if_newer(synced_at=...)): what it was
    # compared with, kept so that a stale one can be explained.
    synced_at = models.DateTimeField(_("synced at"), null=True, blank=True)

    objects = RequestLogManager()

    class Meta:
        verbose_name = _("processed request")
        verbose_name_plural = _("processed requests")
        # The values (changes, error) of a request of no record: a task's, a batch item's. The values of a
        # record's request are shown to whoever may view its model (safeupdates.admin.permissions).
        permissions = [("view_recordless_values", _("Can view the values of requests with no record"))]
        indexes = [
            models.Index(fields=["content_type", "object_id", "-version"], name="safeupdates_target_version"),
            # The requests still to apply, per record: a job finds its record's pending requests here
            # in version order without reading the record's whole history, enqueue_update() sees whether
            # a job is likely queued, and the relay scans only what is pending.
            models.Index(
                fields=["content_type", "object_id", "version"],
                name="safeupdates_pending",
                condition=models.Q(status="pending"),
            ),
            # The outcomes, by status and time: the last hour's per status and the failed requests
            # (safeupdates_status, the metrics) without reading the history. Pending rows stay out, so
            # enqueue_update() never writes this index.
            models.Index(
                fields=["status", "processed_at"],
                name="safeupdates_outcomes",
                condition=~models.Q(status="pending"),
            ),
            # The log in creation order: safeupdates_purge's batches, the admin's default order and
            # date hierarchy read it here instead of scanning the log (migration 0002 builds it
            # CONCURRENTLY on PostgreSQL).
            models.Index(fields=["created_at", "id"], name="safeupdates_created"),
        ]
        constraints = [
            # An @idempotent task is its key among tasks, never a request id: no id a client sends can
            # collide with or squat it (safeupdates.idempotency).
            models.UniqueConstraint(fields=["key"], condition=models.Q(kind="task"), name="safeupdates_task_key"),
        ]

    def __str__(self) -> str:
        if self.kind != RequestKind.UPDATE:
            return f"{self.kind.replace('_', ' ')} {self.key} ({self.status})"  # no version to show: its key
        return f"{self.request_id} {self.status} v{self.version}"

    @property
    def is_terminal(self) -> bool:
        """True once the request reached an outcome that will not change any more."""
        return self.status in TERMINAL_STATUSES


class FailedRequest(ProcessedRequest):
    """The failed and rejected requests of the log, as the admin lists them to be re-driven
    (:mod:`safeupdates.admin.failed`): a proxy, no table of its own. Its permission ``redrive_failedrequest``
    lets a user re-drive them (of the models the user may change)."""

    class Meta:
        proxy = True
        verbose_name = _("failed request")
        verbose_name_plural = _("failed and rejected requests")
        permissions = [("redrive_failedrequest", _("Can re-drive failed and rejected requests"))]


class VersionCounter(models.Model):
    """The version source on databases without sequences: one row, incremented under a write lock."""

    value = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = _("version counter")

    def __str__(self) -> str:
        return str(self.value)


class WaitingMessage(models.Model):
    """A record's apply message that is published and not yet started (Celery delivery: one per record).

    Written by the delivery before it publishes the message, deleted by the message's task when it starts,
    before it reads the pending requests: a request committed while the row exists is read by that message,
    so it publishes nothing. A row whose message was lost (a broker restarted empty, a crash between the
    row and the publish) only makes later requests of the record wait for the relay, which delivers every
    overdue pending request whatever this table says; the relay's message deletes the row.
    """

    content_type_id = models.IntegerField()
    object_id = models.CharField(max_length=255)
    task_id = models.CharField(max_length=64)
    published_at = models.DateTimeField(db_default=Now())

    class Meta:
        verbose_name = _("waiting apply message")
        constraints = [
            models.UniqueConstraint(fields=["content_type_id", "object_id"], name="safeupdates_one_waiting_message")
        ]

    def __str__(self) -> str:
        return f"{self.content_type_id}:{self.object_id} ({self.task_id})"
