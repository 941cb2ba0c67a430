"""Model forms that refuse to save over a record changed since the form was shown.

:class:`SafeUpdateFormMixin` adds a hidden, signed *edit token* (the record's ``lock_version`` and a
digest of each field shown, never a value: :func:`safeupdates.conflicts.edit_token`) to a model form.
When the form comes back, a record that moved on is a form error that says, per field of the form
whose value changed, what is there now and which request wrote it; a token that was tampered with is
a form error too. A valid form saves through
``LockVersionMixin.save()`` at the version the form was shown with, so a write that lands between the
check and the save still raises :class:`~safeupdates.exceptions.StaleObjectError` instead of being
written over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from django import forms
from django.core.exceptions import ValidationError
from django.db import router, transaction
from django.http import HttpRequest, HttpResponse

from safeupdates.conflicts import Conflict, edit_token, find_conflict, read_edit_token, reported_fields
from safeupdates.exceptions import InvalidUpdate, StaleObjectError
from safeupdates.models import LockVersionMixin
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

    Adds the hidden field ``safeupdates_token``. ``clean()`` compares it with the row as stored now; a
    record changed since the form was shown adds a non-field error (the conflict's message) and an error
    on each changed field that the form has, sets :attr:`safeupdates_conflict`, and sends
    ``stale_save_refused`` (surface ``"form"``; a deleted record too). A missing, forged or foreign token
    is a non-field error. New objects (no primary key yet) are not checked.
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
        conflict = find_conflict(current, seen_version, {name: seen[name] for name in shown if name in seen})
        if conflict is not None:
            self.safeupdates_conflict = conflict
            marked = [change.name for change in conflict.changes if change.name in self.fields]
            for change in conflict.changes:
                if change.name in marked:
                    self.add_error(change.name, ValidationError(change.describe(), code="stale"))
            self._safeupdates_refused(seen_version)
            raise ValidationError(conflict.message(marked), code="stale")
        # save() writes only if the row still carries the version the form was shown with, whatever
        # happens between this check and the save: the database decides, not this comparison.
        instance.lock_version = seen_version
        return cleaned

    def _post_clean(self) -> None:
        super()._post_clean()  # type: ignore[misc]
        # A value no column can hold (a JSON field's NaN, say) is the field's error, not a server error.
        instance = getattr(self, "instance", None)
        if not isinstance(instance, LockVersionMixin):
            return
        names = {f.name for f in instance._meta.concrete_fields}
        for name in list(getattr(self, "cleaned_data", {})):
            if name in names:
                try:
                    check_saved(instance, (name,))
                except InvalidUpdate as exc:
                    self.add_error(name if name in self.fields else None, ValidationError(str(exc), code="invalid"))

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
