"""Model mixins that make a model safe to update from queued jobs, and the request log.

``LockVersionMixin`` adds optimistic locking (``lock_version``) and the per-field versions that the
guarded write of :meth:`SafeUpdateQuerySet.update_if_newer` compares against. ``ProcessedRequest`` is
the request log: outbox for the job path, idempotency record, and audit trail in one table.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple

from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from safeupdates.exceptions import InvalidUpdate, StaleObjectError
from safeupdates.guard import (
    BASE_VERSION_KEY,
    SAVE_VERSION_CTE,
    concrete_field,
    saved_versions,
    stored_version,
    versions_model,
)
from safeupdates.internals import UPDATE_RETURNS_ROWS, update_returning
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


class _Save(NamedTuple):
    """What a running ``save()`` tells ``_do_update``."""

    expected: tuple[int | None, ...]  # lock_versions the row may carry for the UPDATE to match, in order
    version: int | None  # the version taken before the statement (None: taken inside it, PostgreSQL)
    names: tuple[str, ...] | None  # the fields written with update_fields (None: a full save)


class LockVersionMixin(models.Model):
    """Adds ``lock_version`` (optimistic locking) and ``field_versions`` (per-field versions).

    ``save()`` writes only if the row still carries the ``lock_version`` this instance was loaded with,
    else raises :class:`~safeupdates.exceptions.StaleObjectError` and leaves the instance as it was. A
    successful save takes a fresh version from :func:`safeupdates.versions.next_version`, so a direct
    edit supersedes every request allocated before it. ``lock_version`` is a change token: every write
    through safeupdates moves it. ``field_versions`` maps field names to the version of their last
    write; ``"*"`` holds the version of the last full save. ``delete()`` is checked the same way.
    """

    lock_version = models.BigIntegerField(_("lock version"), default=0, editable=False)
    field_versions = models.JSONField(_("field versions"), default=dict, editable=False)

    # Set only while save() runs.
    _safeupdates_save: _Save | None = None
    # The versions this instance loaded or saved since its saves were last known committed: the row
    # carries one of them if the transactions of later saves rolled back. Versions are unique, so a row
    # carrying one was last written (or loaded) by this instance, and saving over it loses nothing.
    _safeupdates_uncommitted: tuple[int, ...] = ()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        deferred = self.get_deferred_fields()
        if "lock_version" in deferred:
            raise InvalidUpdate(
                f"{self._meta.label} pk={self.pk!r} was loaded without lock_version (.only()/.defer()), so "
                "its save cannot be checked; load lock_version too, e.g. .only(..., 'lock_version')."
            )
        update_fields: Iterable[str] | None = kwargs.get("update_fields")
        if update_fields is None and deferred and not kwargs.get("force_insert") and using == self._state.db:
            # What Model.save() does with deferred fields: write only the loaded ones, so that fields
            # never loaded are not marked as written either.
            update_fields = [
                f.attname
                for f in self._meta.concrete_fields
                if not f.primary_key and f.attname not in deferred and not f.generated
            ]
        names: tuple[str, ...] | None = None
        if update_fields is not None:
            requested = {self._meta.get_field(name).name for name in update_fields}
            if not requested:
                return  # Django's own contract: an empty update_fields saves nothing
            names = tuple(sorted(requested - {"lock_version", "field_versions"}))
            kwargs["update_fields"] = {*names, "lock_version", "field_versions"}
        loaded_version = self.lock_version
        loaded_versions = self.__dict__.get("field_versions", _DEFERRED)
        connection = connections[using]
        # On PostgreSQL an UPDATE takes its versions from the sequence inside the statement: one round
        # trip, as a plain save. An INSERT (and SQLite) takes it first.
        inserting = self._state.adding or kwargs.get("force_insert")
        version = None if connection.vendor == "postgresql" and not inserting else next_version(using)
        if version is not None:
            self.lock_version = version
            if names is None:
                self.field_versions = {BASE_VERSION_KEY: version}
        expected = (loaded_version, *(v for v in self._safeupdates_uncommitted if v != loaded_version))
        self._safeupdates_save = _Save(expected, version, names)
        try:
            if connection.in_atomic_block:
                # A savepoint, so that a StaleObjectError leaves the caller's transaction usable.
                with transaction.atomic(using=using):
                    super().save(*args, **kwargs)
            else:
                super().save(*args, **kwargs)
        except BaseException:
            self.lock_version = loaded_version
            if loaded_versions is _DEFERRED:
                self.__dict__.pop("field_versions", None)
            else:
                self.field_versions = loaded_versions
            raise
        finally:
            self._safeupdates_save = None
        self._track_commit(connection, loaded_version, self.lock_version)

    save.alters_data = True  # type: ignore[attr-defined]

    def _track_commit(self, connection: BaseDatabaseWrapper, loaded_version: int | None, new_version: int) -> None:
        """Remember what the row carries if the save's transaction rolls back, until it commits.

        Django has no rollback hook: the version a rolled-back save set stays on the instance, and its
        next save would raise a false StaleObjectError. So that save also accepts the version before.
        """
        if not connection.in_atomic_block:
            self._safeupdates_uncommitted = ()
            return
        if loaded_version is not None and loaded_version not in self._safeupdates_uncommitted:
            self._safeupdates_uncommitted += (loaded_version,)

        def committed() -> None:
            if self.lock_version == new_version:
                self._safeupdates_uncommitted = ()

        transaction.on_commit(committed, using=connection.alias)

    def _do_update(
        self,
        base_qs: models.QuerySet[Any],
        using: str | None,
        pk_val: Any,
        values: Any,
        update_fields: Iterable[str] | None,
        forced_update: bool,
        *returning: Any,
    ) -> Any:
        # ``returning``: Django 6.0 added ``returning_fields`` and returns rows instead of a bool; it is
        # passed through untouched, so the same override serves 5.2 and 6.x.
        save = self._safeupdates_save
        if save is None or base_qs.model is not versions_model(type(self)):
            # Not called from save() (fixture loading, save_base(raw=True), is not checked), or the
            # child table of multi-table inheritance: the parent's table, saved first, was checked.
            return super()._do_update(base_qs, using, pk_val, values, update_fields, forced_update, *returning)
        lock_field, versions_field = (concrete_field(type(self), name) for name in ("lock_version", "field_versions"))
        lock_value, versions_value = saved_versions(
            connections[using or "default"], versions_field, save.names, save.version
        )
        values = [
            (field, model, {lock_field: lock_value, versions_field: versions_value}.get(field, value))
            for field, model, value in values
        ]
        # Django 6.0+ asks for fields to return (generated fields, expressions); ours come after them.
        asked: list[Any] = list(returning[0]) if returning and returning[0] else []
        fields = [*asked, lock_field, versions_field]
        loaded, *earlier = save.expected
        rows = base_qs.filter(pk=pk_val)
        # PostgreSQL: the statement takes its version itself (SAVE_VERSION_CTE), one round trip in all.
        with_clause = SAVE_VERSION_CTE if save.version is None else ""
        updated = update_returning(rows.filter(lock_version=loaded), values, fields, with_clause=with_clause)
        if not updated and earlier:
            # A save of this instance whose transaction rolled back left it a version the row never got.
            updated = update_returning(rows.filter(lock_version__in=earlier), values, fields, with_clause=with_clause)
        if updated:
            *returned, self.lock_version, self.field_versions = updated[0]
            return [tuple(returned)] if UPDATE_RETURNS_ROWS else True
        if rows.exists():
            raise StaleObjectError(
                f"{self._meta.label} pk={pk_val!r} was changed after it was loaded "
                f"(lock_version {loaded}); reload it with refresh_from_db() and apply your change again."
            )
        if not self._state.adding:
            # Loaded from the row, which someone deleted since: an INSERT would undo their delete.
            raise StaleObjectError(
                f"{self._meta.label} pk={pk_val!r} was deleted after it was loaded; save(force_insert=True) "
                "creates it again, if that is what you mean."
            )
        # A new instance with a primary key of its own: Django falls back to an INSERT (or raises,
        # under force_update or update_fields). It took its version before the statement.
        return [] if UPDATE_RETURNS_ROWS else False

    def delete(self, using: str | None = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        """Delete the row if it still carries this instance's ``lock_version``, else raise
        :class:`~safeupdates.exceptions.StaleObjectError` and delete nothing."""
        if self.pk is None:
            return super().delete(using=using, keep_parents=keep_parents)  # Django's own error
        if "lock_version" in self.get_deferred_fields():
            raise InvalidUpdate(
                f"{self._meta.label} pk={self.pk!r} was loaded without lock_version (.only()/.defer()), so "
                "its delete cannot be checked; load lock_version too, e.g. .only(..., 'lock_version')."
            )
        using = using or router.db_for_write(type(self), instance=self)
        rows = versions_model(type(self))._base_manager.using(using).filter(pk=self.pk)
        expected = [v for v in (self.lock_version, *self._safeupdates_uncommitted) if v is not None]
        with transaction.atomic(using=using):
            # The checked UPDATE writes nothing new but locks the row, so it cannot change before the DELETE.
            locked = rows.filter(lock_version__in=expected).update(lock_version=models.F("lock_version"))
            if not locked and rows.exists():
                raise StaleObjectError(
                    f"{self._meta.label} pk={self.pk!r} was changed after it was loaded "
                    f"(lock_version {self.lock_version}); reload it and decide again before deleting it."
                )
            return super().delete(using=using, keep_parents=keep_parents)

    delete.alters_data = True  # type: ignore[attr-defined]

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        super().refresh_from_db(*args, **kwargs)
        if "lock_version" in self.__dict__:
            self._safeupdates_uncommitted = ()

    def field_version(self, name: str) -> int:
        """Return the version of the last write of field ``name`` as loaded on this instance."""
        return stored_version(self.field_versions, name)


_DEFERRED = object()


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
    # The client timestamp of a timestamp-mode request (update_if_newer(synced_at=...)): what it was
    # compared with, kept so that a stale one can be explained.
    synced_at = models.DateTimeField(_("synced at"), null=True, blank=True)

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
        if self.kind != RequestKind.UPDATE:
            return f"{self.kind.replace('_', ' ')} {self.key} ({self.status})"  # no version to show: its key
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
