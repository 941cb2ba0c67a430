"""Model mixins that make a model safe to update from queued jobs, and the request log.

``LockVersionMixin`` adds optimistic locking (``lock_version``) and the per-field versions that the
guarded write of :meth:`SafeUpdateQuerySet.update_if_newer` compares against. ``ProcessedRequest`` is
the request log: outbox for the job path, idempotency record, and audit trail in one table.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable
from typing import Any, ClassVar

from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, models, transaction
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from safeupdates.exceptions import StaleObjectError
from safeupdates.managers import SafeUpdateManager
from safeupdates.versions import next_version

__all__ = [
    "BASE_VERSION_KEY",
    "Batch",
    "BatchStatus",
    "ChangesEncoder",
    "LockVersionMixin",
    "ProcessedRequest",
    "RequestKind",
    "RequestStatus",
    "SafeUpdateModel",
    "SyncedAtMixin",
    "VersionCounter",
]

#: Key of ``field_versions`` that holds the version of the last full ``save()``: the version of every
#: field that has no entry of its own.
BASE_VERSION_KEY = "*"


class LockVersionMixin(models.Model):
    """Adds ``lock_version`` (optimistic locking) and ``field_versions`` (per-field versions).

    ``save()`` writes only if the row still carries the ``lock_version`` this instance was loaded with,
    else raises :class:`~safeupdates.exceptions.StaleObjectError` and leaves the instance as it was. A
    successful save takes a fresh version from :func:`safeupdates.versions.next_version`, so a direct
    edit supersedes every request allocated before it. ``field_versions`` maps field names to the
    version of their last write; ``"*"`` holds the version of the last full save.
    """

    lock_version = models.BigIntegerField(_("lock version"), default=0, editable=False)
    field_versions = models.JSONField(_("field versions"), default=dict, editable=False)

    # Set only while save() runs: the version the row must still carry for the UPDATE to match.
    _safeupdates_expected: int | None = None

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        using = kwargs.get("using") or self._state.db or "default"
        update_fields: Iterable[str] | None = kwargs.get("update_fields")
        if update_fields is not None:
            update_fields = list(update_fields)
            if not update_fields:
                return  # Django's own contract: an empty update_fields saves nothing
        loaded_version, loaded_field_versions = self.lock_version, self.field_versions
        new_version = next_version(using)
        if update_fields is None:
            self.field_versions = {BASE_VERSION_KEY: new_version}
        else:
            names = [
                self._meta.get_field(name).name
                for name in update_fields
                if name not in ("lock_version", "field_versions")
            ]
            self.field_versions = {**(loaded_field_versions or {}), **dict.fromkeys(names, new_version)}
            kwargs["update_fields"] = {*names, "lock_version", "field_versions"}
        self.lock_version = new_version
        self._safeupdates_expected = loaded_version
        try:
            if connections[using].in_atomic_block:
                # A savepoint, so that a StaleObjectError leaves the caller's transaction usable.
                with transaction.atomic(using=using):
                    super().save(*args, **kwargs)
            else:
                super().save(*args, **kwargs)
        except BaseException:
            self.lock_version, self.field_versions = loaded_version, loaded_field_versions
            raise
        finally:
            self._safeupdates_expected = None

    save.alters_data = True  # type: ignore[attr-defined]

    def _do_update(  # type: ignore[override]
        self,
        base_qs: models.QuerySet[Any],
        using: str | None,
        pk_val: Any,
        values: Any,
        update_fields: Iterable[str] | None,
        forced_update: bool,
    ) -> bool:
        expected = self._safeupdates_expected
        if expected is None:
            # Not called from save(): fixture loading (save_base(raw=True)) is not checked.
            return bool(super()._do_update(base_qs, using, pk_val, values, update_fields, forced_update))
        if base_qs.filter(pk=pk_val, lock_version=expected)._update(values) > 0:  # type: ignore[attr-defined]
            return True
        if base_qs.filter(pk=pk_val).exists():
            raise StaleObjectError(
                f"{self._meta.label} pk={pk_val!r} was changed after it was loaded "
                f"(lock_version {expected}); reload it with refresh_from_db() and apply your change again."
            )
        # The row is gone: let Django fall back to an INSERT (or raise, under force_update).
        return False

    def field_version(self, name: str) -> int:
        """Return the version of the last write of field ``name`` as loaded on this instance."""
        versions = self.field_versions or {}
        # A JSON null (written on SQLite by earlier releases) means "no entry of its own".
        for key in (name, BASE_VERSION_KEY):
            if versions.get(key) is not None:
                return int(versions[key])
        return 0


class SyncedAtMixin(models.Model):
    """Adds ``last_synced_at``: the newest client timestamp applied in timestamp mode."""

    last_synced_at = models.DateTimeField(_("last synced at"), null=True, blank=True, editable=False)

    class Meta:
        abstract = True


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


class RequestStatus(models.TextChoices):
    """Status of a :class:`ProcessedRequest`. Every status but ``pending`` is terminal."""

    PENDING = "pending", _("pending")
    APPLIED = "applied", _("applied")
    STALE = "stale", _("stale")
    REJECTED = "rejected", _("rejected")
    FAILED = "failed", _("failed")


class RequestKind(models.TextChoices):
    """What a :class:`ProcessedRequest` records."""

    UPDATE = "update", _("update of a row")
    TASK = "task", _("idempotent task")
    BATCH_ITEM = "batch_item", _("batch item")


TERMINAL_STATUSES = frozenset(RequestStatus) - {RequestStatus.PENDING}


class ProcessedRequest(models.Model):
    """One update request: outbox row while ``pending``, then its outcome and idempotency record.

    ``created_at`` and ``processed_at`` come from the database's clock, never from a worker's.
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

    class Meta:
        verbose_name = _("processed request")
        verbose_name_plural = _("processed requests")
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
        ]
        constraints = [
            # An @idempotent task is its key among tasks, never a request id: no id a client sends can
            # collide with or squat it (safeupdates.idempotency).
            models.UniqueConstraint(fields=["key"], condition=models.Q(kind="task"), name="safeupdates_task_key"),
        ]

    def __str__(self) -> str:
        return f"{self.request_id} {self.status} v{self.version}"

    @property
    def is_terminal(self) -> bool:
        """True once the request reached an outcome that will not change any more."""
        return self.status in TERMINAL_STATUSES


class VersionCounter(models.Model):
    """The version source on databases without sequences: one row, incremented under a write lock."""

    value = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = _("version counter")

    def __str__(self) -> str:
        return str(self.value)


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
        verbose_name = _("batch")
        verbose_name_plural = _("batches")
        indexes = [models.Index(fields=["status", "created_at"], name="safeupdates_batch_status")]

    def __str__(self) -> str:
        return f"batch {self.batch_id} {self.succeeded + self.failed}/{self.total}"

    @property
    def progress(self) -> float:
        """Fraction of the items that have finished, from 0.0 to 1.0."""
        return (self.succeeded + self.failed) / self.total if self.total else 1.0
