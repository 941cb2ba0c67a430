"""The save path: the abstract mixins that make a model safe to update from queued jobs.

``LockVersionMixin`` adds optimistic locking (``lock_version``: a checked ``save()`` and ``delete()``) and
the per-field versions that the guarded write of :meth:`SafeUpdateQuerySet.update_if_newer` compares
against; ``SyncedAtMixin`` the client timestamp of timestamp mode. :class:`safeupdates.models.SafeUpdateModel`
is both, with :class:`~safeupdates.managers.SafeUpdateManager`; the app's concrete tables are in
:mod:`safeupdates.models`, which re-exports these.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import DEFAULT_DB_ALIAS, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.expressions import RawSQL
from django.utils.translation import gettext_lazy as _

from safeupdates.database.cursors import execute, fetch_one
from safeupdates.database.internals import (
    UPDATE_RETURNS_ROWS,
    Collector,
    bound_values,
    collect,
    delete_in_place,
    deleted_before_any_receiver,
    forget_rollback,
    from_db,
    insert_values,
    update_returning,
)
from safeupdates.database.registry import concrete_field, versions_model
from safeupdates.database.statements import (
    BASE_VERSION_KEY,
    SAVE_VERSION_CTE,
    ChildTable,
    SaveTable,
    checked_delete,
    checked_save,
    expected_versions,
    per_field_check,
    saved_versions,
    stored_version,
    versioned_insert,
)
from safeupdates.database.transactions import after_commit, in_transaction
from safeupdates.exceptions import InvalidUpdate, NeverLoadedError, StaleObjectError, UnstorableValue
from safeupdates.signals import stale_save_refused_robust
from safeupdates.versions import next_version
from safeupdates.write.validation import check_saved, short_message, shown

#: The creation counter of the mixins' fields. Django orders a model's fields by the creation of their
#: Field objects, and the mixins' were created before any model's own: without this, positional arguments
#: (``Article(None, "headline")``) would fill ``lock_version`` first, and ``values_list()`` and serializers
#: would show the versions first. Above any counter a process reaches, so that they come last.
_AFTER_OWN_FIELDS = 2**48
#: ``Model.save()``'s parameters in the order Django 5.2 still takes them by position (deprecated there,
#: removed in 6.0): ``save(False, False, None, ["name"])`` writes ``name`` only, and so must the check.
_SAVE_PARAMETERS = ("force_insert", "force_update", "using", "update_fields")


@dataclass(slots=True)
class _Save:
    """What a running ``save()`` tells ``_do_update`` and ``_do_insert``, and what they tell it back."""

    expected: tuple[int | None, ...]  # lock_versions the row may carry for the UPDATE to match, in order
    version: int | None  # the version taken before the statement (None: taken inside it, PostgreSQL)
    names: tuple[str, ...] | None  # the fields written, by name (None: every field of the row, "*")
    blind: bool  # a new instance (or a changed key) that never loaded the row its key names
    from_row: bool  # expected came from the row itself (loaded, or a loaded parent): a gone row is stale
    in_transaction: bool  # the caller's transaction was open when the save began
    connection: BaseDatabaseWrapper  # the save's database, as save() found it (this thread's)
    insert_unless_exists: bool = False  # _do_update took no UPDATE: the INSERT must not write over a row
    # The check of the versions row (its queryset and key), put off to the UPDATE of a later table:
    # update_fields names no field of the versions table.
    pending: tuple[models.QuerySet[Any], Any] | None = None
    # A save with update_fields, checked per field: the version at which the instance read each of names
    # (None: checked per row, against expected).
    seen: tuple[int | None, ...] | None = None
    written: bool = False  # the versions table was written
    committed: bool = False  # ... and committed
    refusal: BaseException | None = None  # the error the check raised (nothing written before it)

    def commit(self) -> None:
        self.committed = True


class NotedValues:
    """The values of the fields a save of ``instance`` may write, as they are now: to tell later which
    fields were set since (a ``save_model()`` or ``perform_update()`` override's)."""

    def __init__(self, instance: models.Model) -> None:
        self.values = {field.attname: _copied(field.value_from_object(instance)) for field in _editable(instance)}

    def set_since(self, instance: models.Model) -> list[str]:
        """The fields of ``instance`` whose value differs from the one noted, by name."""
        names = []
        for field in _editable(instance):
            before = self.values.get(field.attname, _DEFERRED)
            try:
                differs = bool(before != field.value_from_object(instance))
            except Exception:  # a value that cannot be compared counts as changed
                differs = True
            if differs:
                names.append(field.name)
        return names


class _Changes(NotedValues):
    """What :func:`only_changes` leaves on an instance for its next ``save()``: the fields a person
    changed, and the instance's values then."""

    def __init__(self, instance: models.Model, changed: Iterable[str]) -> None:
        super().__init__(instance)
        self.changed = {instance._meta.get_field(name).name for name in changed}

    def fields(self, instance: models.Model) -> list[str]:
        """The fields to write: those changed, and those set since."""
        return sorted(self.changed.union(self.set_since(instance)))


def _editable(instance: models.Model) -> list[models.Field[Any, Any]]:
    """The concrete fields of ``instance`` that a save may write, loaded (not deferred), but the versions."""
    deferred = instance.get_deferred_fields()
    return [
        field
        for field in instance._meta.concrete_fields
        if not field.primary_key
        and not field.generated
        and field.attname not in deferred
        and field.name not in ("lock_version", "field_versions")
    ]


def _copied(value: Any) -> Any:
    """A copy of ``value`` that a later change in place (a JSON field's dict) does not reach."""
    try:
        return copy.deepcopy(value)
    except Exception:  # an object that cannot be copied is compared as it is
        return value


def checked_per_row(instance: LockVersionMixin) -> None:
    """Check every later ``save()`` of ``instance`` per row, ``save(update_fields=...)`` too: any write of
    the row since its ``lock_version`` refuses it. For a write conditioned on an ``If-Match`` ETag, which
    names the whole row (RFC 9110): an old one is 412 whatever fields differ."""
    instance.__dict__["_safeupdates_per_row"] = True


def only_changes(instance: LockVersionMixin, changed: Iterable[str]) -> None:
    """Make the next ``save()`` of ``instance`` write only the fields ``changed`` (those a person changed,
    against what that person was shown) and the fields set on it after this call, checked per field as
    ``save(update_fields=...)`` is; nothing at all if there are none. A save that names its
    ``update_fields`` itself, or inserts, is not affected. For the surfaces: a form's, the admin's, a
    serializer's save that calls a plain ``save()``."""
    instance.__dict__["_safeupdates_changes"] = _Changes(instance, changed)


#: The range of the ``lock_version`` column (a bigint).
_BIGINT = (-(2**63), 2**63 - 1)
#: A version given as text: an integer in decimal digits, with a sign and spaces around it as ``int()`` takes.
_INTEGER_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")


class LockVersionMixin(models.Model):
    """Adds ``lock_version`` (optimistic locking) and ``field_versions`` (per-field versions).

    ``save()`` writes only if the row still carries the ``lock_version`` this instance was loaded with,
    else raises :class:`~safeupdates.exceptions.StaleObjectError` and leaves the instance as it was;
    ``save(update_fields=[...])`` only if none of those fields was written after the version at which
    the instance read it (checked per field: edits of different fields never conflict). A
    successful save takes a fresh version from :func:`safeupdates.versions.next_version`, so a direct
    edit supersedes every request allocated before it. ``lock_version`` is a change token: every write
    through safeupdates moves it. ``field_versions`` maps field names to the version of their last
    write; ``"*"`` holds the version of the last save that wrote every field of the row. A new
    instance never writes over a row it did not load
    (:class:`~safeupdates.exceptions.NeverLoadedError`). ``delete()`` is checked the same way. Each
    refusal sends :data:`~safeupdates.signals.stale_save_refused` (surface ``"save"`` or ``"delete"``).
    """

    lock_version = models.BigIntegerField(_("lock version"), default=0, editable=False)
    field_versions = models.JSONField(_("field versions"), default=dict, editable=False)
    lock_version.creation_counter, field_versions.creation_counter = _AFTER_OWN_FIELDS, _AFTER_OWN_FIELDS + 1

    # Marks the models that hold versions, for code the mixin imports (safeupdates.database.registry.holds_versions).
    _safeupdates_versioned: ClassVar[bool] = True
    # Set only while save() runs.
    _safeupdates_save: _Save | None = None
    # The versions this instance loaded or saved since its saves were last known committed: the row
    # carries one of them if the transactions of later saves rolled back. Versions are unique, so a row
    # carrying one was last written (or loaded) by this instance, and saving over it loses nothing.
    _safeupdates_uncommitted: tuple[int, ...] = ()
    # The primary key of the row this instance was loaded from or last saved to: a key changed since
    # names another row, which this instance never loaded (as Django does, its save inserts that row).
    _safeupdates_key: Any = None
    _safeupdates_has_key: bool = False
    # The fields whose value this instance read at a version older than its lock_version, with that
    # version: a save of other fields (update_fields) succeeded over another writer's change to them, so
    # their values here may be stale. Replaced, never changed in place (the class's is shared).
    _safeupdates_seen: Mapping[str, int | None] = {}

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Read as Django reads them; Django's save() gets them as given (its warning, or its TypeError).
        given = {**dict(zip(_SAVE_PARAMETERS, args, strict=False)), **kwargs} if args else kwargs
        changes: _Changes | None = self.__dict__.pop("_safeupdates_changes", None)
        if (
            changes is not None
            and given.get("update_fields") is None
            and not given.get("force_insert")
            and self.pk is not None
            and not self._key_changed()
        ):
            # A surface's save (only_changes()): the fields the person changed, and those set since.
            only = changes.fields(self)
            if not only:
                return  # nothing changed: nothing written, no conflict
            if len(args) > _SAVE_PARAMETERS.index("update_fields"):
                args = (*args[:3], only, *args[4:])
            else:
                kwargs = {**kwargs, "update_fields": only}
            given = {**given, "update_fields": only}
        using = given.get("using") or router.db_for_write(type(self), instance=self)
        deferred = self.get_deferred_fields()
        if "lock_version" in deferred:
            raise InvalidUpdate(
                f"{self._meta.label} pk={self.pk!r} was loaded without lock_version (.only()/.defer()), so "
                "its save cannot be checked; load lock_version too, e.g. .only(..., 'lock_version')."
            )
        self._check_lock_version("save")
        update_fields: Iterable[str] | None = given.get("update_fields")
        names: tuple[str, ...] | None
        if update_fields is not None:
            if not update_fields:
                return super().save(*args, **kwargs)  # Django's own contract: it saves nothing
            names = self._names_of(update_fields)
        elif deferred and not given.get("force_insert") and using == self._state.db and self.pk is not None:
            # Model.save() writes only the loaded fields of a deferred instance (keys and parent links
            # aside): only those are marked.
            names = self._names_of(
                f.attname for f in self._meta.concrete_fields if f.attname not in deferred and not f.primary_key
            )
        else:
            names = _written_by_name(type(self))
        # A value no column can hold is refused before any statement: the caller's transaction goes on.
        try:
            unsure = check_saved(self, names)
        except InvalidUpdate as exc:
            raise UnstorableValue.of(exc) from exc
        connection = connections[using]
        expected = (self.lock_version, *(v for v in self._safeupdates_uncommitted if v != self.lock_version))
        behind = self._safeupdates_seen
        older = [name for name, read in behind.items() if read is None or read < (self.lock_version or 0)]
        if older and update_fields is None and (names is None or not set(older).isdisjoint(names)):
            # A save that writes a field another writer changed after this instance read it (seen by a
            # save of other fields that merged over that write): its value here is stale.
            expected = ()
        # Loaded from its row, or refreshed from it (Django's refresh_from_db() leaves _state.adding set). A
        # copy of a loaded instance with its key cleared (Django's way to copy a row) is a new instance.
        from_row = not self._state.adding or (self._safeupdates_has_key and self.pk is not None)
        blind = False
        if from_row and self._key_changed():
            # Its key names another row, which this instance never loaded.
            blind = True
        elif not from_row:
            parent = self._loaded_parent()
            if parent is not None:
                # A multi-table child created for a parent that was loaded: the parent's row is checked.
                expected = (parent.lock_version, *parent._safeupdates_uncommitted)
                from_row = True
            else:
                # No version seen, none given (an explicit lock_version is checked as given).
                blind = not self.lock_version
        # update_fields on an instance that read the row itself (loaded or refreshed): checked per field.
        per_field = bool(names) and update_fields is not None and from_row and not blind
        per_field = per_field and (not self._state.adding or self._safeupdates_has_key)
        per_field = per_field and not self.__dict__.get("_safeupdates_per_row")
        save = _Save(
            expected=expected,
            # On PostgreSQL the UPDATE or INSERT takes its version from the sequence inside the
            # statement: one round trip, as a plain save. SQLite takes it first.
            version=None if connection.vendor == "postgresql" else next_version(using),
            names=names,
            blind=blind,
            from_row=from_row,
            in_transaction=in_transaction(connection),
            connection=connection,
            seen=tuple(behind.get(name, self.lock_version) for name in names or ()) if per_field else None,
        )
        # No savepoint: the check writes nothing when it fails, so a StaleObjectError leaves the caller's
        # transaction as it was, and an error that is not ours leaves it broken, as Django's save does.
        # A model whose versions are in a table written after another (a plain concrete parent) is
        # partly written when the check fails: its save runs in a savepoint.
        # So does a save whose input may still fail (None for a NOT NULL column, which a pre_save
        # receiver may fill in): the caller's transaction goes on if the database refuses it.
        savepoint = save.in_transaction and (unsure or _written_before_versions(type(self)))
        loaded_version, loaded_versions = self.lock_version, self.__dict__.get("field_versions", _DEFERRED)
        loaded_seen = self._safeupdates_seen
        self._safeupdates_save = save
        try:
            if savepoint:
                with transaction.atomic(using=using):
                    super().save(*args, **kwargs)
            else:
                super().save(*args, **kwargs)
        except BaseException as error:
            if save.written and not savepoint and (save.committed or save.in_transaction):
                # The row carries the new version: committed (a post_save receiver failed), or written in
                # the caller's transaction, which decides.
                self._track_commit(connection, save)
            else:
                self.lock_version, self._safeupdates_seen = loaded_version, loaded_seen
                if loaded_versions is _DEFERRED:
                    self.__dict__.pop("field_versions", None)
                else:
                    self.field_versions = loaded_versions
            if error is save.refusal and save.in_transaction and not savepoint:
                # Django's save marked the caller's transaction for rollback as the check's error went
                # through it; the check wrote nothing.
                forget_rollback(connection, error)
            if error is save.refusal and not isinstance(error, InvalidUpdate):
                stale_save_refused_robust(
                    type(self),
                    pk=self.pk,
                    version=None if isinstance(error, NeverLoadedError) else (save.expected or (loaded_version,))[0],
                    fields=names if names is not None else _fields_saved(type(self)),
                    surface="save",
                    using=using,
                )
            raise
        finally:
            self._safeupdates_save = None
        if save.written:
            self._track_commit(connection, save)

    save.alters_data = True  # type: ignore[attr-defined]

    @classmethod
    def from_db(cls, db: str | None, field_names: Any, values: Any, **kwargs: Any) -> Any:
        # **kwargs: Django 6.1 passes fetch_mode=, to a from_db() that accepts it.
        instance = super().from_db(db, field_names, values, **kwargs)
        instance._safeupdates_key, instance._safeupdates_has_key = instance.pk, True
        return instance

    def _names_of(self, update_fields: Iterable[str]) -> tuple[str, ...]:
        """The names of the fields of ``update_fields`` (names or attnames), without the versions."""
        names = set()
        for name in update_fields:
            try:
                names.add(self._meta.get_field(name).name)
            except FieldDoesNotExist:
                continue  # Django's save() refuses it with its own ValueError, before anything is written
        return tuple(sorted(names - {"lock_version", "field_versions"}))

    def _loaded_parent(self) -> Any:
        """The loaded parent instance this new multi-table child was given (``Child(parent_ptr=parent)``),
        whose row holds the versions; None if there is none."""
        concrete = self._meta.concrete_model
        assert concrete is not None
        root = versions_model(concrete)
        if root is concrete:
            return None
        link = concrete._meta.get_ancestor_link(root)
        parent = None if link is None else link.get_cached_value(self, None)
        if parent is None or parent.pk != self.pk or "lock_version" not in parent.__dict__:
            return None
        if parent._state.adding and not getattr(parent, "_safeupdates_has_key", False):
            return None  # neither loaded nor refreshed from its row
        return parent

    def _key_changed(self) -> bool:
        """Whether the primary key was changed since this instance was loaded or last saved."""
        if not self._safeupdates_has_key or self._safeupdates_key == self.pk:
            return False
        field = self._meta.pk
        assert field is not None
        try:
            return bool(field.to_python(self._safeupdates_key) != field.to_python(self.pk))
        except (ValidationError, TypeError, ValueError):
            return True

    def _track_commit(self, connection: BaseDatabaseWrapper, save: _Save) -> None:
        """Remember what the row carries if the save's transaction rolls back, until it commits.

        Django has no rollback hook: the version a rolled-back save set stays on the instance, and its
        next save would raise a false StaleObjectError. So that save also accepts the versions before.
        """
        self._safeupdates_key, self._safeupdates_has_key = self.pk, True
        if save.committed or not save.in_transaction:
            self._safeupdates_uncommitted = ()
            return
        for version in save.expected:
            if version is not None and version not in self._safeupdates_uncommitted:
                self._safeupdates_uncommitted += (version,)
        new_version = self.lock_version

        def committed() -> None:
            if self.lock_version == new_version:
                self._safeupdates_uncommitted = ()

        after_commit(committed, connection.alias)

    def _wrote(self, connection: BaseDatabaseWrapper, save: _Save, lock_version: int, versions: dict[str, Any]) -> None:
        """The save's statement wrote the versions table: take its versions, and note when it commits."""
        self._safeupdates_seen = self._seen_after(save, versions)
        self.lock_version, self.field_versions = lock_version, versions
        save.written = True
        if save.in_transaction:
            return  # the caller's transaction decides
        if connection.in_atomic_block:
            # Django's own transaction around a multi-table save in autocommit: committed with it.
            transaction.on_commit(save.commit, using=connection.alias)
        else:
            save.committed = True  # autocommit: the statement committed

    def _seen_after(self, save: _Save, versions: dict[str, Any] | None) -> Mapping[str, int | None]:
        """The fields this instance holds an older read of after a save that wrote ``names`` and left the
        row's map at ``versions``: those it did not write that another writer wrote after it read them
        (a save checked per field succeeds over such writes, and is no refresh)."""
        if save.names is None:
            return {}  # every field written
        read = self.lock_version  # the version this instance read its other fields at, before the save
        versions = versions or {}
        older = self._safeupdates_seen
        if read is not None and (versions.get(BASE_VERSION_KEY) or 0) <= read:
            # No full save since it read the row: only the fields with entries of their own, or read
            # before, can be newer than its read (the usual case: a few names, not every field).
            names: Iterable[str] = _field_set(type(self)).intersection([*versions, *older])
        else:
            names = _fields_saved(type(self))
        written = save.names
        behind = {}
        for name in names:
            if name in written:
                continue
            seen = older.get(name, read)
            if seen is None or stored_version(versions, name) > seen:
                behind[name] = seen
        return behind

    def _refuse(self, save: _Save, error: StaleObjectError) -> StaleObjectError:
        save.refusal = error
        return error

    def _bound(self, save: _Save, connection: BaseDatabaseWrapper, values: list[Any]) -> list[Any] | None:
        """:func:`~safeupdates.database.internals.bound_values`; a value its field cannot convert (a list
        for an integer) is refused as InvalidUpdate before the statement (Django raises its own error)."""
        try:
            return bound_values(connection, values)
        except _CONVERSION_ERRORS as exc:
            raise self._refused_value(save, connection, values, exc) from exc

    def _refused_value(
        self, save: _Save, connection: BaseDatabaseWrapper, values: list[Any], error: Exception
    ) -> Exception:
        """The InvalidUpdate of a value that ``get_db_prep_save()`` refused, naming its field; a refusal of
        the save (its transaction goes on) if nothing was written before it."""
        if save.written:
            return error
        if isinstance(error, InvalidUpdate):
            return UnstorableValue.of(error)
        what, name = "a value", None
        for field, _model, value in values:
            try:
                field.get_db_prep_save(value, connection=connection)
            except _CONVERSION_ERRORS:
                what, name = f"{self._meta.label}.{field.name}={shown(value)}", field.name
                break
        refusal = UnstorableValue(f"{what} cannot be written: {short_message(error)}")
        if name is not None:
            refusal.located(self._meta.label, name, what)
        save.refusal = refusal
        return refusal

    def _check_lock_version(self, action: str) -> None:
        """Refuse, before any statement, a ``lock_version`` the check cannot compare: set by hand to a bool,
        a float, text that is no integer or an integer beyond a bigint, it was a ``DataError`` (or
        ``ProgrammingError``) in the checked statement, which broke the caller's transaction. None is the
        save's own case. An integer as text (``request.POST["lock_version"]``) is the integer it spells,
        as the column's ``to_python()`` reads it."""
        value = self.lock_version
        if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
            value = int(value)
        if value is None or (
            not isinstance(value, bool) and isinstance(value, int) and _BIGINT[0] <= value <= _BIGINT[1]
        ):
            self.lock_version = value
            return
        raise InvalidUpdate(
            f"{self._meta.label} pk={self.pk!r} has lock_version={shown(value)}, which is no version: its "
            f"{action} cannot be checked. Keep the lock_version it was loaded with, or set the integer an "
            "ETag or an edit token carried."
        )

    def _never_loaded(self, pk: Any) -> NeverLoadedError:
        return NeverLoadedError(
            f"{self._meta.label} pk={pk!r} exists, and this instance never loaded it: there is no lock_version "
            "to check its save against. Load the row and change that instance, or write with update_if_newer() "
            "or with_lock()."
        )

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
        if save is None:
            # Not called from save(): fixture loading (save_base(raw=True)) is not checked.
            return super()._do_update(base_qs, using, pk_val, values, update_fields, forced_update, *returning)
        if base_qs.model is not versions_model(type(self)):
            if save.pending is None:
                # The child table of multi-table inheritance: the parent's table, saved first, was checked.
                return super()._do_update(base_qs, using, pk_val, values, update_fields, forced_update, *returning)
            return self._update_child(base_qs, using, pk_val, values, update_fields, forced_update, returning, save)
        if save.blind:
            # Nothing to check an UPDATE against: insert, never over an existing row (_do_insert). An
            # UPDATE that Django must run (force_update, update_fields) would write over one: refused.
            if forced_update and base_qs.filter(pk=pk_val).exists():
                raise self._refuse(save, self._never_loaded(pk_val))
            save.insert_unless_exists = True
            return _NOT_UPDATED
        written = _without_versions(base_qs.model, values)
        if not written and update_fields is not None and base_qs.model is not self._meta.concrete_model:
            # update_fields names no field of this table, and Django runs no UPDATE here: the check and
            # the versions ride in the UPDATE of the first later table it names (_update_child).
            save.pending = (base_qs, pk_val)
            return _UPDATED
        # Django 6.0+ asks for fields to return (generated fields, expressions); ours come after them.
        asked: list[Any] = list(returning[0]) if returning and returning[0] else []
        return self._update_versions_row(_connection(save, using), base_qs, pk_val, written, asked, save)

    def _update_versions_row(
        self,
        connection: BaseDatabaseWrapper,
        base_qs: models.QuerySet[Any],
        pk_val: Any,
        written: list[tuple[Any, Any, Any]],
        asked: list[Any],
        save: _Save,
    ) -> Any:
        """The checked UPDATE of the row that holds the versions, writing ``written`` too; what Django's
        ``_do_update`` returns."""
        model = base_qs.model
        bound = None
        if not asked and not base_qs.query.has_filters():
            bound = self._bound(save, connection, written)
        if bound is not None:
            updated = self._checked_update(connection, model, pk_val, written, bound, save)
        else:
            updated = self._compiled_update(connection, base_qs.filter(pk=pk_val), written, asked, save)
        if updated is None:
            return self._not_matched(base_qs, pk_val, save)
        returned: list[Any]
        *returned, lock_version, versions = updated
        self._wrote(connection, save, lock_version, versions)
        return [tuple(returned)] if UPDATE_RETURNS_ROWS else True

    def _update_child(
        self,
        base_qs: models.QuerySet[Any],
        using: str | None,
        pk_val: Any,
        values: Any,
        update_fields: Iterable[str] | None,
        forced_update: bool,
        returning: tuple[Any, ...],
        save: _Save,
    ) -> Any:
        """The UPDATE of a multi-table child's table in a save whose parent's check is pending: Django's
        with the check before it, or, on PostgreSQL, one statement that checks and writes both rows."""
        if not values and base_qs.model is not self._meta.concrete_model:
            # Nothing to write here either: Django runs nothing, and the check waits for a later table.
            return super()._do_update(base_qs, using, pk_val, values, update_fields, forced_update, *returning)
        assert save.pending is not None
        versions_qs, versions_pk = save.pending
        save.pending = None
        connection = _connection(save, using)
        asked = returning[0] if returning else None  # Django 6.0+: fields to return
        bound = None
        if values and connection.vendor == "postgresql" and not asked and not base_qs.query.has_filters():
            bound = self._bound(save, connection, values)
        if bound is None:
            # No values, or some that need the compiler (or SQLite): the parent's checked UPDATE first.
            self._update_versions_row(connection, versions_qs, versions_pk, [], [], save)
            return super()._do_update(base_qs, using, pk_val, values, update_fields, forced_update, *returning)
        model: type[models.Model] = versions_qs.model
        statement = checked_save(
            SaveTable.of(model, connection.vendor),
            tuple(field.column for field, _model, _value in values),
            save.names,
            ChildTable.of(base_qs.model),
            per_field=save.seen is not None,
        )
        pk = model._meta.pk.get_db_prep_value(versions_pk, connection)  # type: ignore[union-attr]
        params = statement.params(bound, pk, save.expected, save.version, save.seen or ())
        row = fetch_one(connection, statement.sql, params, prepared=True)
        if row is None:
            return self._not_matched(versions_qs, versions_pk, save)
        lock_version, versions, child_rows = row
        self._wrote(connection, save, lock_version, from_db(connection, _version_fields(model)[1], versions))
        return _UPDATED if child_rows else _NOT_UPDATED  # no child row: Django's own error follows

    def _not_matched(self, base_qs: models.QuerySet[Any], pk_val: Any, save: _Save) -> Any:
        """What a checked UPDATE that matched no row means: raise StaleObjectError if the row moved on or
        was deleted since it was loaded; Django's "not updated" for a new instance (then it inserts)."""
        stored = base_qs.filter(pk=pk_val).values_list("field_versions", flat=True).first()
        if stored is not None or base_qs.filter(pk=pk_val).exists():
            if save.seen is not None and save.names is not None:
                moved = [
                    name
                    for name, seen in zip(save.names, save.seen, strict=True)
                    if seen is None or stored_version(stored, name) > seen
                ]
                what = f"was changed after this instance read {', '.join(moved) or 'the fields it saves'}"
            else:
                version = save.expected[0] if save.expected else self.lock_version
                what = f"was changed after it was loaded (lock_version {version})"
            raise self._refuse(
                save,
                StaleObjectError(
                    f"{self._meta.label} pk={pk_val!r} {what}; reload it with refresh_from_db() and apply your "
                    "change again."
                ),
            )
        if save.from_row:
            # Loaded from the row, which someone deleted since: an INSERT would undo their delete.
            raise self._refuse(
                save,
                StaleObjectError(
                    f"{self._meta.label} pk={pk_val!r} was deleted after it was loaded; save(force_insert=True) "
                    "creates it again, if that is what you mean."
                ),
            )
        # A new instance with a lock_version of its own and no row: Django's INSERT (_do_insert).
        return _NOT_UPDATED

    def _do_insert(
        self, manager: models.Manager[Any], using: str, fields: Any, returning_fields: Any, raw: bool
    ) -> Any:
        save = self._safeupdates_save
        model: type[models.Model] = manager.model
        if save is None or raw or model is not versions_model(type(self)):
            # Not from save(), or the child table of multi-table inheritance: Django's INSERT.
            return super()._do_insert(manager, using, fields, returning_fields, raw)  # type: ignore[misc]
        connection = connections[using]
        pk = getattr(self, model._meta.pk.attname)  # type: ignore[union-attr]
        inserted = _without_versions(model, [(field, None, field.pre_save(self, True)) for field in fields])
        try:
            values = insert_values(connection, inserted)
        except _CONVERSION_ERRORS as exc:
            raise self._refused_value(save, connection, inserted, exc) from exc
        if values is None:
            # A value that needs the compiler (an expression): the version first, then Django's INSERT.
            if save.insert_unless_exists and manager.using(using).filter(pk=pk).exists():
                raise self._refuse(save, self._never_loaded(pk))
            version = next_version(using) if save.version is None else save.version
            self.lock_version, self.field_versions = version, {BASE_VERSION_KEY: version}
            result = super()._do_insert(manager, using, fields, returning_fields, raw)  # type: ignore[misc]
            self._wrote(connection, save, version, {BASE_VERSION_KEY: version})
            return result
        written, bound = values
        statement = versioned_insert(
            SaveTable.of(model, connection.vendor),
            tuple(field.column for field, _model, _value in written),
            tuple(field.column for field in returning_fields),
            unless_exists=save.insert_unless_exists,
        )
        row = fetch_one(connection, statement.sql, statement.params(bound, save.version), prepared=True)
        if row is None:  # the key is taken: ON CONFLICT DO NOTHING inserted nothing
            raise self._refuse(save, self._never_loaded(pk))
        *returned, version = row
        self._wrote(connection, save, version, {BASE_VERSION_KEY: version})
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
        """Run the save's :class:`~safeupdates.database.statements.CheckedSave`, built once per shape of save and
        run prepared: the new ``lock_version`` and ``field_versions``, None if no row matched.

        ``written`` are the fields ``_do_update`` received, without the versions; ``bound`` their values
        as the database takes them (:func:`~safeupdates.database.internals.bound_values`)."""
        statement = checked_save(
            SaveTable.of(model, connection.vendor),
            tuple(field.column for field, _model, _value in written),
            save.names,
            per_field=save.seen is not None,
        )
        pk = model._meta.pk.get_db_prep_value(pk_val, connection)  # type: ignore[union-attr]
        params = statement.params(bound, pk, save.expected, save.version, save.seen or ())
        row = fetch_one(connection, statement.sql, params, prepared=True)
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
        model: type[models.Model] = rows.model
        lock_field, versions_field = _version_fields(model)
        if save.seen is not None:
            assert save.names is not None
            column = connection.ops.quote_name(str(versions_field.column))
            check = per_field_check(connection.vendor, column, save.names, positional=True)
            rows = rows.filter(RawSQL(check, list(save.seen), output_field=models.BooleanField()))
        expected = [version for version in save.expected if version is not None]
        if not expected:
            return None  # lock_version None: no row carries it
        if save.seen is not None:
            # A version the row carried, or one this instance wrote before a rollback (CheckedSave).
            rows = rows.filter(models.Q(lock_version__gte=expected[0]) | models.Q(lock_version__in=expected))
        else:
            rows = rows.filter(lock_version__in=expected)
        lock_value, versions_value = saved_versions(connection, versions_field, save.names, save.version)
        values = [(lock_field, None, lock_value), (versions_field, None, versions_value), *written]
        # PostgreSQL: the statement takes its version itself (SAVE_VERSION_CTE), one round trip in all.
        with_clause = SAVE_VERSION_CTE if save.version is None else ""
        fields = [*asked, lock_field, versions_field]
        updated = update_returning(rows, values, fields, with_clause=with_clause)
        return updated[0] if updated else None

    def delete(self, using: str | None = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        """Delete the row if it still carries this instance's ``lock_version``, else raise
        :class:`~safeupdates.exceptions.StaleObjectError` and delete nothing.

        The check rides in the DELETE of the row where it can: a row that nothing cascades from, and,
        outside a transaction, a row whose cascades no signal receiver watches. Otherwise a checked
        UPDATE locks the row first, so that no receiver runs for a delete that is refused.
        """
        if self.pk is None:
            return super().delete(using=using, keep_parents=keep_parents)  # Django's own error
        if "lock_version" in self.get_deferred_fields():
            raise InvalidUpdate(
                f"{self._meta.label} pk={self.pk!r} was loaded without lock_version (.only()/.defer()), so "
                "its delete cannot be checked; load lock_version too, e.g. .only(..., 'lock_version')."
            )
        self._check_lock_version("delete")
        using = using or router.db_for_write(type(self), instance=self)
        connection = connections[using]
        expected = [v for v in (self.lock_version, *self._safeupdates_uncommitted) if v is not None]
        collector = collect(self, using, keep_parents)
        if collector is None:
            # Nothing cascades, no signal receivers, no parent table: Django would run one DELETE.
            return self._checked_delete(connection, expected)
        if not in_transaction(connection):
            key = deleted_before_any_receiver(collector, versions_model(type(self)))
            if key is not None:
                return self._delete_checked_in_place(connection, collector, key, self.pk, expected)
        return self._delete_locked_first(connection, collector, expected)

    delete.alters_data = True  # type: ignore[attr-defined]

    def _run_checked_delete(self, connection: BaseDatabaseWrapper, pk: Any, expected: list[int]) -> int:
        """The checked DELETE of row ``pk`` (:func:`~safeupdates.database.statements.checked_delete`): the number
        of rows deleted, 0 or 1."""
        table = SaveTable.of(type(self), connection.vendor)
        prepared = versions_model(type(self))._meta.pk.get_db_prep_value(pk, connection)  # type: ignore[union-attr]
        params = {"pk": prepared, "expected": expected_versions(connection.vendor, expected)}
        with transaction.mark_for_rollback_on_error(connection.alias):
            return execute(connection, checked_delete(table), params, prepared=True)

    def _checked_delete(self, connection: BaseDatabaseWrapper, expected: list[int]) -> tuple[int, dict[str, int]]:
        """The one-statement delete of a row that nothing cascades from, as ``Collector.delete()`` does it."""
        count = self._run_checked_delete(connection, self.pk, expected)
        if not count and self._row_exists(connection, self.pk):
            raise self._refused_delete(connection, self.pk)
        setattr(self, self._meta.pk.attname, None)  # type: ignore[union-attr]
        return count, {self._meta.label: count}

    def _delete_checked_in_place(
        self,
        connection: BaseDatabaseWrapper,
        collector: Collector,
        key: type[models.Model],
        pk: Any,
        expected: list[int],
    ) -> tuple[int, dict[str, int]]:
        """Delete as ``Collector.delete()`` does, the row itself by the checked DELETE, where Django
        deletes it (:func:`~safeupdates.database.internals.delete_in_place`).

        The check rides in the statement Django runs anyway. A stale row raises inside the transaction
        that holds the collector's deletes (the outermost: this runs in autocommit), which rolls back
        what was deleted before it; no receiver has run by then (else :meth:`_delete_locked_first`).
        """
        refusal: StaleObjectError | None = None

        def delete_row() -> int:
            nonlocal refusal
            deleted = self._run_checked_delete(connection, pk, expected)
            if not deleted and self._row_exists(connection, pk):
                refusal = self._stale_delete(pk)
                raise refusal
            return deleted

        try:
            return delete_in_place(connection, collector, key, pk, delete_row)
        except StaleObjectError as error:
            if error is refusal:  # signalled once out of the transaction it rolled back
                self._signal_refused_delete(connection, pk)
            raise

    def _delete_locked_first(
        self, connection: BaseDatabaseWrapper, collector: Collector, expected: list[int]
    ) -> tuple[int, dict[str, int]]:
        """A checked UPDATE that writes nothing new but locks the row, then ``Collector.delete()``: the
        row cannot change before its DELETE, and a refused delete runs no receiver and writes nothing."""
        rows = versions_model(type(self))._base_manager.using(connection.alias).filter(pk=self.pk)
        with transaction.atomic(using=connection.alias, savepoint=False):
            locked = rows.filter(lock_version__in=expected).update(lock_version=models.F("lock_version"))
            if locked or not rows.exists():
                return collector.delete()
        raise self._refused_delete(connection, self.pk)

    def _row_exists(self, connection: BaseDatabaseWrapper, pk: Any) -> bool:
        return bool(versions_model(type(self))._base_manager.using(connection.alias).filter(pk=pk).exists())

    def _refused_delete(self, connection: BaseDatabaseWrapper, pk: Any) -> StaleObjectError:
        """The StaleObjectError of a refused delete, signalled (``stale_save_refused``)."""
        self._signal_refused_delete(connection, pk)
        return self._stale_delete(pk)

    def _signal_refused_delete(self, connection: BaseDatabaseWrapper, pk: Any) -> None:
        stale_save_refused_robust(
            type(self), pk=pk, version=self.lock_version, fields=(), surface="delete", using=connection.alias
        )

    def _stale_delete(self, pk: Any) -> StaleObjectError:
        return StaleObjectError(
            f"{self._meta.label} pk={pk!r} was changed after it was loaded "
            f"(lock_version {self.lock_version}); reload it and decide again before deleting it."
        )

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        fields: Any = kwargs["fields"] if "fields" in kwargs else args[1] if len(args) > 1 else None
        # Some fields reloaded, lock_version not: the row's lock_version comes along in the same query,
        # as the version at which those fields are read now (the instance keeps its own).
        along = bool(fields) and "lock_version" not in fields and "lock_version" in self.__dict__
        read = self.lock_version
        if along:
            with_version = [*fields, "lock_version"]
            if "fields" in kwargs:
                kwargs["fields"] = with_version
            else:
                args = (args[0], with_version, *args[2:])
        super().refresh_from_db(*args, **kwargs)
        if "lock_version" in self.__dict__ and (fields is None or "lock_version" in fields):
            # Its lock_version reloaded from the row of its key: that is the row it saw.
            self._safeupdates_uncommitted = ()
            self._safeupdates_key, self._safeupdates_has_key = self.pk, True
        if fields is None:
            self._safeupdates_seen = {}
        elif along:
            now, self.lock_version = self.lock_version, read
            refreshed = {self._meta.get_field(name).name for name in fields}
            self._safeupdates_seen = {**self._safeupdates_seen, **dict.fromkeys(refreshed, now)}
        elif self._safeupdates_seen:
            refreshed = {self._meta.get_field(name).name for name in fields}
            self._safeupdates_seen = {k: v for k, v in self._safeupdates_seen.items() if k not in refreshed}

    def field_version(self, name: str) -> int:
        """Return the version of the last write of field ``name`` as loaded on this instance."""
        return stored_version(self.field_versions, name)


_DEFERRED = object()
#: What a field's get_db_prep_save() raises for a value it cannot convert (Django's own messages).
_CONVERSION_ERRORS = (TypeError, ValueError, ValidationError, ArithmeticError)
#: What Django's ``_do_update`` returns for a row updated (nothing asked back) or not matched: on 6.0+
#: the rows (immutable here, as they are shared), on 5.2 a bool.
_UPDATED: Any = ((),) if UPDATE_RETURNS_ROWS else True
_NOT_UPDATED: Any = () if UPDATE_RETURNS_ROWS else False


def _connection(save: _Save, using: str | None) -> BaseDatabaseWrapper:
    """The connection of database ``using`` (Django's ``_do_update`` is given it): the save's own, unless
    Django's save chose another database than save() did (a router that answers differently)."""
    alias = using or DEFAULT_DB_ALIAS
    return save.connection if save.connection.alias == alias else connections[alias]


@functools.cache
def _version_fields(model: type[models.Model]) -> tuple[models.Field[Any, Any], models.Field[Any, Any]]:
    """``lock_version`` and ``field_versions`` of ``model``, the model whose table holds them."""
    return concrete_field(model, "lock_version"), concrete_field(model, "field_versions")


def _without_versions(model: type[models.Model], values: Any) -> list[tuple[Any, Any, Any]]:
    """``values`` (``(field, model, value)`` triples, as Django's save passes them) but the versions,
    which the save's statement writes itself."""
    lock_field, versions_field = _version_fields(model)
    return [value for value in values if value[0] is not lock_field and value[0] is not versions_field]


@functools.cache
def _field_set(model: type[models.Model]) -> frozenset[str]:
    """:func:`_fields_saved`, as a set."""
    return frozenset(_fields_saved(model))


@functools.cache
def _fields_saved(model: type[models.Model]) -> tuple[str, ...]:
    """The fields a full save of ``model`` writes, by name, the versions aside."""
    return tuple(
        sorted(
            field.name
            for field in model._meta.concrete_fields
            if not field.primary_key and not field.generated and field.name not in ("lock_version", "field_versions")
        )
    )


def _written_by_name(model: type[models.Model]) -> tuple[str, ...] | None:
    """The fields a full save of ``model`` writes, by name, if its row's versions map holds others too;
    None if it holds no others (the save writes ``"*"``).

    The map is in the row of the table that holds the versions, and it holds the fields of every
    multi-table descendant stored under that row: a full save of a parent, or of one of two sibling
    children, does not write them.
    """
    concrete = model._meta.concrete_model
    assert concrete is not None
    lineage = {concrete, *concrete._meta.get_parent_list()}
    root = versions_model(model)
    seen, pending = {root}, [root]
    while pending:
        parent = pending.pop()
        for relation in parent._meta.related_objects:
            child: Any = relation.related_model
            if not relation.parent_link or relation.model is not parent or child in seen:
                continue
            seen.add(child)
            if child not in lineage and any(
                not getattr(field.remote_field, "parent_link", False)
                for field in child._meta.local_concrete_fields  # type: ignore[union-attr]
            ):
                return _fields_saved(model)
            pending.append(child)
    return None


def _written_before_versions(model: type[models.Model]) -> bool:
    """Whether a save of ``model`` writes another table before the one that holds its versions.

    Django saves the parents first, the first parent's first; the versions table comes first unless
    ``LockVersionMixin`` sits on a child of a plain concrete model.
    """
    first = model._meta.concrete_model
    assert first is not None
    while first._meta.parents:
        first = next(iter(first._meta.parents))
    return first is not versions_model(model)


class SyncedAtMixin(models.Model):
    """Adds ``last_synced_at``: the newest client timestamp applied in timestamp mode."""

    last_synced_at = models.DateTimeField(_("last synced at"), null=True, blank=True, editable=False)
    last_synced_at.creation_counter = _AFTER_OWN_FIELDS + 2

    class Meta:
        abstract = True
