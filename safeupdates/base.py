"""The abstract mixins that make a model safe to update from queued jobs (the concrete tables of the
app are in :mod:`safeupdates.models`, which re-exports these).

``LockVersionMixin`` adds optimistic locking (``lock_version``) and the per-field versions that the
guarded write of :meth:`SafeUpdateQuerySet.update_if_newer` compares against; ``SyncedAtMixin`` the
client timestamp of timestamp mode; ``SafeUpdateModel`` both, with :class:`SafeUpdateManager`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple

from django.db import DEFAULT_DB_ALIAS, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.deletion import Collector
from django.utils.translation import gettext_lazy as _

from safeupdates.exceptions import InvalidUpdate, StaleObjectError
from safeupdates.guard import statement_cursor
from safeupdates.internals import UPDATE_RETURNS_ROWS, bound_values, from_db, update_returning
from safeupdates.managers import SafeUpdateManager
from safeupdates.meta import concrete_field, versions_model
from safeupdates.statements import (
    BASE_VERSION_KEY,
    SAVE_VERSION_CTE,
    checked_delete,
    checked_save,
    expected_versions,
    saved_versions,
    stored_version,
    versioned_insert,
)
from safeupdates.versions import next_version

__all__ = ["BASE_VERSION_KEY", "LockVersionMixin", "SafeUpdateModel", "SyncedAtMixin"]


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

    # Marks the models that hold versions, for code the mixin imports (safeupdates.meta.holds_versions).
    _safeupdates_versioned: ClassVar[bool] = True
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
        # On PostgreSQL the UPDATE or INSERT takes its version from the sequence inside the statement:
        # one round trip, as a plain save. SQLite takes it first.
        version = None if connection.vendor == "postgresql" else next_version(using)
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
        connection = connections[using or DEFAULT_DB_ALIAS]
        model = base_qs.model
        # Django 6.0+ asks for fields to return (generated fields, expressions); ours come after them.
        asked: list[Any] = list(returning[0]) if returning and returning[0] else []
        written = _without_versions(model, values)
        bound = None
        if not asked and not base_qs.query.has_filters():
            bound = bound_values(connection, written)
        if bound is not None:
            updated = self._checked_update(connection, model, pk_val, written, bound, save)
        else:
            updated = self._compiled_update(connection, base_qs.filter(pk=pk_val), written, asked, save)
        if updated is not None:
            returned: list[Any]
            *returned, self.lock_version, self.field_versions = updated
            return [tuple(returned)] if UPDATE_RETURNS_ROWS else True
        loaded = save.expected[0]
        if base_qs.filter(pk=pk_val).exists():
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
        # under force_update or update_fields), which takes its own version (_do_insert).
        return [] if UPDATE_RETURNS_ROWS else False

    def _do_insert(
        self, manager: models.Manager[Any], using: str, fields: Any, returning_fields: Any, raw: bool
    ) -> Any:
        save = self._safeupdates_save
        model: type[models.Model] = manager.model
        if save is None or save.version is not None or raw or model is not versions_model(type(self)):
            # Not from save(), a version taken already (SQLite), or the child table of multi-table
            # inheritance: Django's INSERT.
            return super()._do_insert(manager, using, fields, returning_fields, raw)  # type: ignore[misc]
        connection = connections[using]
        written = _without_versions(model, [(field, None, field.pre_save(self, True)) for field in fields])
        bound = bound_values(connection, written)
        if bound is None:
            # A value that needs the compiler (an expression, a database default): the version first.
            version = next_version(using)
            self.lock_version, self.field_versions = version, {BASE_VERSION_KEY: version}
            return super()._do_insert(manager, using, fields, returning_fields, raw)  # type: ignore[misc]
        statement = versioned_insert(
            model,
            tuple(field.column for field, _model, _value in written),
            tuple(field.column for field in returning_fields),
        )
        with statement_cursor(connection) as cursor:
            cursor.execute(statement.sql, statement.params(bound))
            *returned, version = cursor.fetchone()
        self.lock_version, self.field_versions = version, {BASE_VERSION_KEY: version}
        return [
            tuple(from_db(connection, field, value) for field, value in zip(returning_fields, returned, strict=True))
        ]

    def _checked_update(
        self,
        connection: BaseDatabaseWrapper,
        model: type[models.Model],
        pk_val: Any,
        written: list[tuple[Any, Any, Any]],
        bound: list[Any],
        save: _Save,
    ) -> tuple[int, dict[str, Any]] | None:
        """Run the save's :class:`~safeupdates.statements.CheckedSave`, built once per shape of save and
        run prepared: the new ``lock_version`` and ``field_versions``, None if no row matched.

        ``written`` are the fields ``_do_update`` received, without the versions; ``bound`` their values
        as the database takes them (:func:`~safeupdates.internals.bound_values`)."""
        statement = checked_save(
            model,
            connection.vendor,
            tuple(field.column for field, _model, _value in written),
            save.names,
        )
        pk = model._meta.pk.get_db_prep_value(pk_val, connection)  # type: ignore[union-attr]
        with statement_cursor(connection) as cursor:
            cursor.execute(statement.sql, statement.params(bound, pk, save.expected, save.version))
            row = cursor.fetchone()
        if row is None:
            return None
        if statement.returns_versions:
            return row[0], from_db(connection, _version_fields(model)[1], row[1])
        return row[0], {BASE_VERSION_KEY: row[0]}

    def _compiled_update(
        self,
        connection: BaseDatabaseWrapper,
        rows: models.QuerySet[Any],
        written: list[tuple[Any, Any, Any]],
        asked: list[Any],
        save: _Save,
    ) -> tuple[Any, ...] | None:
        """The save's UPDATE compiled by the ORM, for values that need its compiler (expressions) and
        the fields Django 6 asks back: those fields, then the new versions; None if no row matched."""
        expected = [version for version in save.expected if version is not None]
        if not expected:
            return None  # lock_version None: no row carries it
        model = rows.model
        lock_field, versions_field = _version_fields(model)
        lock_value, versions_value = saved_versions(connection, versions_field, save.names, save.version)
        values = [(lock_field, None, lock_value), (versions_field, None, versions_value), *written]
        # PostgreSQL: the statement takes its version itself (SAVE_VERSION_CTE), one round trip in all.
        with_clause = SAVE_VERSION_CTE if save.version is None else ""
        fields = [*asked, lock_field, versions_field]
        updated = update_returning(rows.filter(lock_version__in=expected), values, fields, with_clause=with_clause)
        return updated[0] if updated else None

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
        if Collector(using=using, origin=self).can_fast_delete(self):
            # Nothing cascades, no signal receivers, no parent table: Django would run one DELETE; the
            # check goes into it.
            return self._checked_delete(using, expected, rows)
        with transaction.atomic(using=using):
            # The checked UPDATE writes nothing new but locks the row, so it cannot change before the DELETE.
            locked = rows.filter(lock_version__in=expected).update(lock_version=models.F("lock_version"))
            if not locked and rows.exists():
                raise self._stale_delete()
            return super().delete(using=using, keep_parents=keep_parents)

    delete.alters_data = True  # type: ignore[attr-defined]

    def _checked_delete(
        self, using: str, expected: list[int], rows: models.QuerySet[Any]
    ) -> tuple[int, dict[str, int]]:
        """The one-statement delete of a row that nothing cascades from, as ``Collector.delete()`` does it."""
        connection = connections[using]
        model = versions_model(type(self))
        pk = model._meta.pk.get_db_prep_value(self.pk, connection)  # type: ignore[union-attr]
        params = {"pk": pk, "expected": expected_versions(connection.vendor, expected)}
        with transaction.mark_for_rollback_on_error(using), statement_cursor(connection) as cursor:
            cursor.execute(checked_delete(model, connection.vendor), params)
            count = cursor.rowcount
        if not count and rows.exists():
            raise self._stale_delete()
        setattr(self, self._meta.pk.attname, None)  # type: ignore[union-attr]
        return count, {self._meta.label: count}

    def _stale_delete(self) -> StaleObjectError:
        return StaleObjectError(
            f"{self._meta.label} pk={self.pk!r} was changed after it was loaded "
            f"(lock_version {self.lock_version}); reload it and decide again before deleting it."
        )

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        super().refresh_from_db(*args, **kwargs)
        if "lock_version" in self.__dict__:
            self._safeupdates_uncommitted = ()

    def field_version(self, name: str) -> int:
        """Return the version of the last write of field ``name`` as loaded on this instance."""
        return stored_version(self.field_versions, name)


_DEFERRED = object()


def _version_fields(model: type[models.Model]) -> tuple[models.Field[Any, Any], models.Field[Any, Any]]:
    """``lock_version`` and ``field_versions`` of ``model``, the model whose table holds them."""
    return concrete_field(model, "lock_version"), concrete_field(model, "field_versions")


def _without_versions(model: type[models.Model], values: Any) -> list[tuple[Any, Any, Any]]:
    """``values`` (``(field, model, value)`` triples, as Django's save passes them) but the versions,
    which the save's statement writes itself."""
    lock_field, versions_field = _version_fields(model)
    return [value for value in values if value[0] is not lock_field and value[0] is not versions_field]


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
