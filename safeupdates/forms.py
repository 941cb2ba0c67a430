"""Model forms that refuse to save over a record changed since the form was shown.

:class:`SafeUpdateFormMixin` adds a hidden, signed *edit token* (the record's ``lock_version`` and a
digest of each field shown, never a value: :func:`safeupdates.conflicts.edit_token`) to a model form.
When the form comes back, only what the person changed counts, against what that person was shown
(the token's digests, not the row as it is now): a field they changed that someone else wrote since
the form was shown is a form error that says what is there now and which request wrote it; edits of
other fields are no conflict (issue 53). A token that was tampered with is a form error too. A valid
form's save writes only the fields the person changed (:func:`safeupdates.models.only_changes`), each
checked per field in ``LockVersionMixin.save()``, so a write of one of them that lands between the
check and the save still raises :class:`~safeupdates.exceptions.StaleObjectError` instead of being
written over; a form that changed nothing writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from django import forms
from django.core.exceptions import ValidationError
from django.db import router, transaction
from django.http import HttpRequest, HttpResponse

from safeupdates.conflicts import (
    Conflict,
    changed_from_seen,
    edit_token,
    find_conflict,
    find_field_conflict,
    read_edit_token,
    reported_fields,
)
from safeupdates.exceptions import InvalidUpdate, StaleObjectError
from safeupdates.models import LockVersionMixin, only_changes
from safeupdates.refusals import told_refusal
from safeupdates.signals import refusals_on, stale_save_refused_robust
from safeupdates.write.validation import check_saved

__all__ = ["TOKEN_FIELD", "SafeUpdateFormMixin", "SafeUpdateModelForm", "SafeUpdateViewMixin", "shown_fields"]

#: Name of the hidden token field (also the POST key the admin reads).
TOKEN_FIELD = "safeupdates_token"

#: The model fields among some names that a person can see change: :func:`safeupdates.conflicts.reported_fields`.
shown_fields = reported_fields


class _TokenField(forms.CharField):
    """The edit token: never counts as a change (a formset saves only the forms that changed)."""

    widget = forms.HiddenInput

    def has_changed(self, initial: Any, data: Any) -> bool:
        return False


class SafeUpdateFormMixin(forms.Form):
    """Mix into a ``ModelForm`` of a ``LockVersionMixin`` model, before ``ModelForm``.

    Adds the hidden field ``safeupdates_token``. Once the posted values are set on the instance
    (``_post_clean()``), the fields the person changed (against the token's digests) are compared with
    the row as stored now: one of them written since the form was shown adds an error on it and a
    non-field error (the conflict's message), sets :attr:`safeupdates_conflict` (naming only those
    fields), and sends ``stale_save_refused`` (surface ``"form"``; a deleted record too). Else the
    instance keeps the values it was loaded with in the fields the person did not change, and its next
    plain ``save()`` writes only the fields they changed (and any set on it after the check), checked per
    field; ``changed_data`` names those fields. A formset's deletion, or a changed primary key, is checked
    against the whole row. A missing, forged or foreign token is a non-field error. New objects (no
    primary key yet) are not checked.
    """

    safeupdates_token = _TokenField(required=False)

    #: Extra field names recorded as seen in the token, besides the form's own (a changelist row shows
    #: more columns than it edits).
    safeupdates_fields: ClassVar[Sequence[str]] = ()
    #: Check forms that did not change too. A change form saves whatever was posted, so it must be
    #: checked; a formset saves only the forms that changed, so there an unchanged form that moved on
    #: loses nothing and is not refused.
    safeupdates_check_unchanged: ClassVar[bool] = True

    #: The conflict found by ``clean()``, if any.
    safeupdates_conflict: Conflict | None = None

    instance: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound and self._safeupdates_checked():
            self.initial[TOKEN_FIELD] = edit_token(self.instance, self.safeupdates_shown_fields())

    def safeupdates_shown_fields(self) -> list[str]:
        """The model fields whose values the token records as seen."""
        return shown_fields(type(self.instance), [*self.fields, *self.safeupdates_fields])

    def _safeupdates_checked(self) -> bool:
        instance = getattr(self, "instance", None)
        if not isinstance(instance, LockVersionMixin) or instance.pk is None:
            return False
        # Loaded from its row, or given it by refresh_from_db() (which leaves _state.adding set), and not
        # since moved to another key (a copy saved as a new row): what save() checks.
        return (not instance._state.adding or instance._safeupdates_has_key) and not instance._key_changed()

    def full_clean(self) -> None:
        self._safeupdates_pending: tuple[LockVersionMixin, int, dict[str, str]] | None = None
        self._safeupdates_changed: list[str] | None = None
        super().full_clean()

    @property  # type: ignore[override]
    def changed_data(self) -> list[str]:
        """The form's fields the person changed. Once the form is checked, against what that person was
        shown (the token's digests), not against the row as it is now: a field someone else changed
        since, and this person did not, is no change of theirs (the admin logs, and a formset saves, only
        what changed). Before, and for a field the token cannot record (a many-to-many field, a field
        of the form's own), as Django says."""
        django: list[str] = super().changed_data
        changed = getattr(self, "_safeupdates_changed", None)
        if changed is None:
            return django
        recorded = set(shown_fields(type(self.instance), self.fields))
        return [name for name in self.fields if name in changed or (name not in recorded and name in django)]

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if not self._safeupdates_checked():
            return cleaned
        if not self.safeupdates_check_unchanged and not self.has_changed():
            return cleaned
        instance = self.instance
        model = type(instance)
        try:
            current = model._base_manager.db_manager(instance._state.db).get(pk=instance.pk)
        except model.DoesNotExist:
            try:
                version: int | None = read_edit_token(cleaned.get(TOKEN_FIELD) or "", instance)[0]
            except InvalidUpdate:
                version = None
            self._safeupdates_refused(version)
            raise ValidationError(
                f"This {model._meta.verbose_name} was deleted after you opened it.", code="deleted"
            ) from None
        try:
            seen_version, seen = read_edit_token(cleaned.get(TOKEN_FIELD) or "", current)
        except InvalidUpdate as exc:
            raise ValidationError(
                f"This form cannot be checked against later changes: {exc}", code="invalid_token"
            ) from None
        # Only what this form shows: a token made by a surface that shows more (a signed, valid one)
        # must not tell the values of its other fields now.
        shown = self.safeupdates_shown_fields()
        # Checked once the posted values are set on the instance (_post_clean): what the person changed.
        self._safeupdates_pending = (current, seen_version, {name: seen[name] for name in shown if name in seen})
        return cleaned

    def _post_clean(self) -> None:
        instance = getattr(self, "instance", None)
        # The instance as loaded, before the posted values are set on it: the fields the person did not
        # change keep the values it was loaded with, not the (maybe older) ones the page showed.
        loaded = dict(instance.__dict__) if isinstance(instance, LockVersionMixin) else {}
        super()._post_clean()  # type: ignore[misc]
        # A value no column can hold (a JSON field's NaN, say) is the field's error, not a server error.
        if not isinstance(instance, LockVersionMixin):
            return
        names = {f.name for f in instance._meta.concrete_fields}
        for name in list(getattr(self, "cleaned_data", {})):
            if name in names:
                try:
                    check_saved(instance, (name,))
                except InvalidUpdate as exc:
                    self.add_error(name if name in self.fields else None, ValidationError(str(exc), code="invalid"))
        pending = getattr(self, "_safeupdates_pending", None)  # set by clean() for a record to check
        if pending is not None:
            self._safeupdates_check(instance, loaded, *pending)

    def _safeupdates_check(
        self,
        instance: LockVersionMixin,
        loaded: dict[str, Any],
        current: LockVersionMixin,
        seen_version: int,
        seen: dict[str, str],
    ) -> None:
        """Refuse the edit if a field the person changed (against what that person was shown) was
        written since it was shown; else make the save write only those fields (issue 53)."""
        names = shown_fields(type(instance), self.fields)
        changed = changed_from_seen(instance, seen, names)
        deleting = bool(getattr(self, "cleaned_data", {}).get("DELETE"))
        # A key changed on the form saves a copy under the new key (as Django's admin does), whole.
        whole = deleting or instance._key_changed()
        if whole:
            # A formset's deletion removes every field: refused if the row moved on at all.
            conflict = find_conflict(current, seen_version, seen)
        else:
            conflict = find_field_conflict(current, seen_version, seen, changed)
        if conflict is not None:
            self.safeupdates_conflict = conflict
            marked = [change.name for change in conflict.changes if change.name in self.fields]
            for change in conflict.changes:
                if change.name in marked:
                    self.add_error(change.name, ValidationError(change.describe(), code="stale"))
            self._safeupdates_refused(seen_version)
            self.add_error(None, ValidationError(conflict.message(marked), code="stale"))
            return
        if whole:
            instance.lock_version = seen_version  # delete() checks the row at the version shown
            return
        self._safeupdates_changed = changed
        attnames = {field.name: field.attname for field in instance._meta.concrete_fields}
        for name in names:
            attname = attnames[name]
            if name not in changed and attname in loaded:
                setattr(instance, attname, loaded[attname])  # not the person's change: as loaded
        loaded_version = loaded.get("lock_version")
        if not isinstance(loaded_version, int) or loaded_version < seen_version:
            instance.lock_version = seen_version  # an instance older than the page: saved as the page
        # The save writes only the fields the person changed, and those set on the instance after this
        # (a save_model() override's), each checked at the version the instance read it: the database
        # decides, so a write that lands between this check and the save still raises StaleObjectError.
        only_changes(instance, changed)

    def _safeupdates_refused(self, version: int | None) -> None:
        """Signal the refusal of this form's write (``stale_save_refused``), decided before any save."""
        instance = self.instance
        stale_save_refused_robust(
            type(instance),
            pk=instance.pk,
            version=version,
            fields=shown_fields(type(instance), self.fields),
            surface="form",
            using=instance._state.db or router.db_for_write(type(instance), instance=instance),
        )


class SafeUpdateModelForm(SafeUpdateFormMixin, forms.ModelForm):  # type: ignore[type-arg]
    """A ``ModelForm`` with :class:`SafeUpdateFormMixin`: subclass it with a ``Meta`` as usual."""


class SafeUpdateViewMixin:
    """Mix into an ``UpdateView`` (before it) whose form has :class:`SafeUpdateFormMixin`.

    A record that moves on after the form's check and before its save makes ``save()`` raise
    ``StaleObjectError``; this shows the form again with the conflict instead of a server error. Either
    way one ``stale_save_refused`` is sent, surface ``"form"``.
    """

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with refusals_on("form"):
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc,no-any-return]

    def form_valid(self, form: Any) -> HttpResponse:
        using = router.db_for_write(type(form.instance), instance=form.instance)
        try:
            with transaction.atomic(using=using):
                return super().form_valid(form)  # type: ignore[misc,no-any-return]
        except InvalidUpdate as exc:  # a value no column can hold, refused before any statement
            # The view may have set it in a field the form does not show: told only for the form's fields.
            model = type(form.instance)
            told = told_refusal(exc, model, list(form.fields), surface="form", instance=form.instance)
            form.add_error(told.field, ValidationError(told.detail, code="invalid"))
            return self.form_invalid(form)  # type: ignore[attr-defined,no-any-return]
        except StaleObjectError:
            form.full_clean()  # checked again: the conflict is the write that just landed
            if not form.errors:
                form.add_error(
                    None, ValidationError("This record changed while it was saved; save again.", code="stale")
                )
            return self.form_invalid(form)  # type: ignore[attr-defined,no-any-return]
