"""Conflict-safe admin for ``LockVersionMixin`` models: the mixin users put on their model admins.

:class:`SafeUpdateAdminMixin` (ready made: :class:`SafeUpdateModelAdmin`) carries a signed edit token
(:func:`safeupdates.conflicts.edit_token`) through every way the admin writes a record: the change form
and its inlines, ``list_editable`` rows, actions (the built-in ``delete_selected`` too) and the delete
view. The change form, its inline rows and ``list_editable`` rows write only the fields the person
changed (against what that person was shown): edits of different fields both land, and an edit of a
field written since it was shown is refused with a page that says, for those fields only, what the
person saw, what is there now, and which request wrote it when; it is never written over. Actions and
deletes, which may write (or remove) any field, are refused if the record moved on at all.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import connections, models, router, transaction
from django.forms.formsets import BaseFormSet
from django.http import HttpRequest, HttpResponse
from django.template.loader import select_template
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from safeupdates.conflicts import Conflict, edit_token, find_conflict, read_edit_token, reported_fields
from safeupdates.exceptions import InvalidUpdate, StaleObjectError
from safeupdates.forms import TOKEN_FIELD, SafeUpdateFormMixin
from safeupdates.models import LockVersionMixin, ProcessedRequest
from safeupdates.refusals import ToldRefusal, told_refusal
from safeupdates.signals import refusals_on, stale_save_refused_robust

if TYPE_CHECKING:
    _ModelAdminBase = admin.ModelAdmin[Any]
    _InlineBase = admin.options.InlineModelAdmin[Any, Any]
else:
    _ModelAdminBase = _InlineBase = object

_Form = TypeVar("_Form", bound=forms.BaseForm)

#: POST key of the changelist's signed row tokens, checked by every action.
ROWS_FIELD = "_safeupdates_rows"
#: POST key that an intermediate page of an action sets when the person chose "Select all N": the
#: selected rows not on the page were never shown, so they carry no token and are acted on as selected.
ACROSS_FIELD = "_safeupdates_across"

#: Django 6.1+: where an admin action is offered, the change list or (new) the change form.
_LOCATIONS: Any = getattr(admin, "ActionLocation", None)
_CHANGE_LIST: Any = None if _LOCATIONS is None else _LOCATIONS.CHANGE_LIST
#: What the delete page says of a refusal that it may not tell (a value a receiver of the delete wrote).
_NOT_DELETED = "a write of its deletion was refused (the server's log says why); nothing was deleted."
#: What a page is told of a value its save set that it may not tell (the value of a field it does not show).
_NOT_SAVED = "A value set while saving could not be stored (the server's log says which); nothing was saved."
#: The same, of an action.
_NOT_DONE = "A value the action set could not be stored (the server's log says which)."
# A save that raises StaleObjectError is shown again; this bounds how often a row may move meanwhile.
_ATTEMPTS = 3


def request_log_url(obj: models.Model) -> str | None:
    """The request log admin, filtered to ``obj``'s requests (its timeline); None without that admin."""
    content_type = ContentType.objects.db_manager(obj._state.db).get_for_model(obj)
    try:
        url = reverse("admin:safeupdates_processedrequest_changelist")
    except NoReverseMatch:
        return None
    return f"{url}?{urlencode({'content_type__id__exact': content_type.pk, 'object_id': obj.pk})}"


def _request_url(request_id: Any) -> str | None:
    pk = ProcessedRequest.objects.filter(request_id=request_id).values_list("pk", flat=True).first()
    if pk is None:
        return None
    try:
        return reverse("admin:safeupdates_processedrequest_change", args=[pk])
    except NoReverseMatch:
        return None


def _conflict_context(conflict: Conflict, obj: models.Model | None = None) -> dict[str, Any]:
    """What the conflict template shows of one conflict."""
    return {
        "conflict": conflict,
        "message": conflict.message(),
        "requests_url": request_log_url(obj) if obj is not None else None,
        "changes": [
            {
                "change": change,
                "request_url": _request_url(change.request_id) if change.request_id else None,
            }
            for change in conflict.changes
        ],
    }


def _only(seen: dict[str, str], shown: Sequence[str]) -> dict[str, str]:
    """The digests of a token for the fields a page shows: a conflict tells nothing of the others."""
    return {name: seen[name] for name in shown if name in seen}


def _with_token(form: type[_Form], *, check_unchanged: bool) -> type[_Form]:
    """``form`` with :class:`SafeUpdateFormMixin` mixed in (``form`` itself if it has it already)."""
    if issubclass(form, SafeUpdateFormMixin) and form.safeupdates_check_unchanged == check_unchanged:
        return form
    bases = (form,) if issubclass(form, SafeUpdateFormMixin) else (SafeUpdateFormMixin, form)
    return cast("type[_Form]", type(form.__name__, bases, {"safeupdates_check_unchanged": check_unchanged}))


def _with_token_field(fieldsets: Any) -> list[Any]:
    """``fieldsets`` with the (hidden) token field in the last one, so that the form renders it."""
    result: list[Any] = [(name, dict(options)) for name, options in fieldsets]
    if result and TOKEN_FIELD not in flatten_fieldsets(result):
        options = result[-1][1]
        options["fields"] = [*options.get("fields", ()), TOKEN_FIELD]
    return result


def _selected_across(request: HttpRequest) -> bool:
    """True if the person chose "Select all N" (on the list, or on an intermediate page that passed it on)."""
    return request.POST.get("select_across") == "1" or request.POST.get(ACROSS_FIELD) == "1"


class _RefusedSave(forms.BaseForm):
    """A form of the admin shown again after its save refused a value (``InvalidUpdate``, raised by a
    ``save_model()`` or ``save_related()`` that set it): the refusal, as the page may tell it, is its
    error. ``safeupdates_refused``: ``{pk: ToldRefusal}``, the key None for the change form's record."""

    safeupdates_refused: dict[Any, ToldRefusal] | None = None

    def clean(self) -> Any:
        cleaned = super().clean()
        refused = self.safeupdates_refused or {}
        pk = getattr(getattr(self, "instance", None), "pk", None)
        told = refused.get(None if None in refused else pk)
        if told is not None:
            self.add_error(
                told.field if told.field in self.fields else None, ValidationError(told.detail, code="invalid")
            )
        return cleaned


def _refused_form(form: type[_Form], refused: dict[Any, ToldRefusal] | None) -> type[_Form]:
    """``form`` that shows ``refused`` as its error (itself if nothing was refused)."""
    if not refused:
        return form
    return cast("type[_Form]", type(form.__name__, (_RefusedSave, form), {"safeupdates_refused": refused}))


def _refused_on(request: HttpRequest) -> dict[Any, ToldRefusal] | None:
    return getattr(request, "_safeupdates_refused", None)


def _shown_again(
    request: HttpRequest,
    view: Callable[[], HttpResponse],
    told: Callable[[InvalidUpdate], dict[Any, ToldRefusal] | None],
) -> HttpResponse:
    """Run ``view``, a page that saves, and run it again when a save was refused; its transaction rolled
    back. A ``StaleObjectError`` (a record moved after the form's check, and save() refused to write
    over it): shown again, the form's check sees why (the same refusal: signalled once). An
    ``InvalidUpdate`` (a value save_model() or save_related() set that no column can hold, refused
    before any statement): shown again with what ``told`` makes of it, the errors by form (None, or a
    second refusal: raised)."""
    with refusals_on("admin"):
        for attempt in range(_ATTEMPTS):
            try:
                return view()
            except StaleObjectError:
                if attempt == _ATTEMPTS - 1:
                    raise
            except InvalidUpdate as exc:
                refused = None if _refused_on(request) is not None else told(exc)
                if refused is None:
                    raise
                request._safeupdates_refused = refused  # type: ignore[attr-defined]
    raise AssertionError("unreachable")


class _CheckedFormSet(BaseFormSet):  # type: ignore[type-arg]
    """Refuses the deletion of an inline object that moved on (a formset ignores deleted forms' errors)."""

    def clean(self) -> None:
        super().clean()
        for form in getattr(self, "deleted_forms", []):
            conflict = getattr(form, "safeupdates_conflict", None)
            if conflict is not None:
                raise forms.ValidationError(conflict.message(), code="stale")
            if form.errors.get(NON_FIELD_ERRORS):
                raise forms.ValidationError(form.errors[NON_FIELD_ERRORS])


class SafeUpdateInlineMixin(_InlineBase):
    """An inline of a ``LockVersionMixin`` model whose rows carry their own edit tokens.

    :class:`SafeUpdateAdminMixin` applies it to its inlines of such models by itself.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._safeupdates_setup()

    def _safeupdates_setup(self) -> None:
        self.form = _with_token(self.form, check_unchanged=False)
        if not issubclass(self.formset, _CheckedFormSet):
            self.formset = type(self.formset.__name__, (_CheckedFormSet, self.formset), {})

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return _with_token_field(super().get_fieldsets(request, obj))


class SafeUpdateStackedInline(SafeUpdateInlineMixin, admin.StackedInline):  # type: ignore[type-arg]
    """A stacked inline of a ``LockVersionMixin`` model, with conflict checks."""


class SafeUpdateTabularInline(SafeUpdateInlineMixin, admin.TabularInline):  # type: ignore[type-arg]
    """A tabular inline of a ``LockVersionMixin`` model, with conflict checks."""


@functools.cache
def _safe_inline_class(cls: type[Any]) -> type[Any]:
    return type(cls.__name__, (SafeUpdateInlineMixin, cls), {})


class SafeUpdateAdminMixin(_ModelAdminBase):
    """Mix into a ``ModelAdmin`` of a ``LockVersionMixin`` model, before ``admin.ModelAdmin``.

    The change form, its inlines, ``list_editable`` rows, actions and the delete view carry signed edit
    tokens. A save of the change form, an inline row or a ``list_editable`` row writes only the fields
    the person changed (:class:`~safeupdates.forms.SafeUpdateFormMixin`), and is refused only if one of
    them was written since the page was shown, with a conflict that lists those fields (the value seen,
    the value now, the request that wrote it and when); nothing is written then. An action or a delete
    is refused if the record moved on at all (it may write or remove any field), listing the fields
    shown whose value differs. The decision is the database's: saves are checked per field at the
    version the record was read at and deletes at the version that was shown, so a write that lands
    after the check still raises ``StaleObjectError``, and is shown the same way. Actions run in a
    transaction that locks the selected rows and checks them first. Set ``safeupdates_unchecked = True``
    on an action that must run without the check.
    """

    change_form_template = "safeupdates/admin/change_form.html"
    change_list_template = "safeupdates/admin/change_list.html"
    delete_confirmation_template = "safeupdates/admin/delete_confirmation.html"
    delete_selected_confirmation_template = "safeupdates/admin/delete_selected_confirmation.html"
    conflict_template = "safeupdates/admin/conflict.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The admin builds its forms from self.form with the fields of the fieldsets, which name the
        # token: the form must declare it.
        self.form = _with_token(self.form, check_unchanged=True)

    # -- the change form ------------------------------------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return _with_token_field(super().get_fieldsets(request, obj))

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        # The page shows its read-only fields too: the token records them, so a change to one is told.
        shown = reported_fields(self.model, self.get_readonly_fields(request, obj))
        checked = type(
            form.__name__, (form,), {"safeupdates_fields": [*getattr(form, "safeupdates_fields", ()), *shown]}
        )
        return _refused_form(checked, _refused_on(request))

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        inlines = super().get_inline_instances(request, obj)
        for inline in inlines:
            if issubclass(inline.model, LockVersionMixin) and not isinstance(inline, SafeUpdateInlineMixin):
                # Inline objects with a lock_version are checked too, without the user re-declaring them.
                inline.__class__ = _safe_inline_class(type(inline))
                cast("SafeUpdateInlineMixin", inline)._safeupdates_setup()
        return inlines

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        def told(exc: InvalidUpdate) -> dict[Any, ToldRefusal]:
            obj = self._saving(request)
            shown = self._shown_on_form(request, obj if object_id is not None else None)
            return {None: told_refusal(exc, self.model, shown, surface="admin", instance=obj, generic=_NOT_SAVED)}

        view = functools.partial(super().changeform_view, request, object_id, form_url, extra_context)
        return _shown_again(request, view, told)

    def save_form(self, request: HttpRequest, form: Any, change: bool) -> Any:
        obj = super().save_form(request, form, change)
        # The record being saved: a refusal of a value save_model() sets in it is told on its form.
        request._safeupdates_saving = obj  # type: ignore[attr-defined]
        return obj

    def _saving(self, request: HttpRequest) -> Any:
        """The record whose save was refused, as save_model() left it (None if save_form() was not
        reached: a save_form() override that does not call this one)."""
        return getattr(request, "_safeupdates_saving", None)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        conflicts = []
        adminform = context.get("adminform")
        if adminform is not None and getattr(adminform.form, "safeupdates_conflict", None):
            conflicts.append(_conflict_context(adminform.form.safeupdates_conflict, obj))
        for inline in context.get("inline_admin_formsets", []):
            for form in inline.formset.forms:
                if getattr(form, "safeupdates_conflict", None):
                    conflicts.append(_conflict_context(form.safeupdates_conflict))
        context.update(
            safeupdates_parent=self._parent_template(request, "change_form.html"),
            safeupdates_conflicts=conflicts,
            safeupdates_requests_url=request_log_url(obj) if obj is not None and obj.pk is not None else None,
            safeupdates_reload_url=request.path,
        )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _parent_template(self, request: HttpRequest, name: str) -> Any:
        """The template the admin would use without this mixin (per-model overrides included)."""
        opts = self.opts
        return select_template(
            [f"admin/{opts.app_label}/{opts.model_name}/{name}", f"admin/{opts.app_label}/{name}", f"admin/{name}"]
        )

    @admin.display(description=_("requests"))
    def requests_link(self, obj: Any) -> str:
        """A link to the record's request timeline: the request log filtered to it."""
        url = request_log_url(obj) if obj is not None and obj.pk is not None else None
        if url is None:
            return "-"
        content_type = ContentType.objects.get_for_model(obj)
        count = ProcessedRequest.objects.filter(content_type=content_type, object_id=str(obj.pk)).count()
        return format_html('<a href="{}">{} request{}</a>', url, count, "" if count == 1 else "s")

    # -- the changelist: list_editable rows and actions --------------------------------------------------

    def _shown_in_list(self, request: HttpRequest) -> list[str]:
        return reported_fields(self.model, [*self.get_list_display(request), *self.list_editable])

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        base = kwargs.pop("form", forms.ModelForm)
        attrs = {"safeupdates_check_unchanged": False, "safeupdates_fields": self._shown_in_list(request)}
        kwargs["form"] = _refused_form(type(base.__name__, (SafeUpdateFormMixin, base), attrs), _refused_on(request))
        return super().get_changelist_form(request, **kwargs)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        def told(exc: InvalidUpdate) -> dict[Any, ToldRefusal] | None:
            # A list_editable row's refusal is told on its row (no row was saved).
            obj = self._saving(request)
            if obj is None:
                return None
            shown = self._shown_in_list(request)
            return {obj.pk: told_refusal(exc, self.model, shown, surface="admin", instance=obj, generic=_NOT_SAVED)}

        response = _shown_again(request, functools.partial(super().changelist_view, request, extra_context), told)
        if isinstance(response, TemplateResponse) and response.context_data and "cl" in response.context_data:
            cl = response.context_data["cl"]
            shown = self._shown_in_list(request)
            rows = {str(obj.pk): edit_token(obj, shown) for obj in cl.result_list}
            conflicts = [
                _conflict_context(form.safeupdates_conflict, form.instance)
                for form in (cl.formset.forms if cl.formset else [])
                if getattr(form, "safeupdates_conflict", None)
            ]
            response.context_data.update(
                safeupdates_parent=self._parent_template(request, "change_list.html"),
                safeupdates_rows=json.dumps(rows),
                safeupdates_conflicts=conflicts,
            )
        return response

    def get_actions(self, request: HttpRequest, action_location: Any = _CHANGE_LIST) -> dict[str, Any]:
        # Django 6.1 offers actions on the change form too (action_location) and gives Action objects;
        # 5.2 and 6.0 give (func, name, description) tuples.
        if action_location is _CHANGE_LIST:
            actions: dict[str, Any] = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)  # type: ignore[call-arg]
        on_form = _LOCATIONS is not None and action_location == _LOCATIONS.CHANGE_FORM
        checked: dict[str, Any] = {}
        for name, action in actions.items():
            func = action[0] if isinstance(action, tuple) else action.func
            if not getattr(func, "safeupdates_unchecked", False):
                func = self._checked(func, on_form=on_form)
            checked[name] = (func, *action[1:]) if isinstance(action, tuple) else dataclasses.replace(action, func=func)
        return checked

    def _checked(self, func: Callable[..., Any], *, on_form: bool = False) -> Callable[..., Any]:
        """``func`` run in a transaction that locks the selected rows and refuses those that moved on.

        ``on_form``: an action of the change form (Django 6.1), checked with the form's own token."""

        @functools.wraps(func)
        def checked(modeladmin: Any, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
            using = router.db_for_write(self.model)
            try:
                with transaction.atomic(using=using):
                    rows = self.model._base_manager.using(using).filter(pk__in=queryset.values("pk"))
                    if connections[using].features.has_select_for_update:
                        rows = rows.select_for_update()
                    problems = self._row_conflicts(request, list(rows), on_form=on_form)
                    if problems:
                        return self._refuse(request, problems, back=request.get_full_path())
                    response = func(modeladmin, request, queryset)
            except InvalidUpdate as exc:
                # The action set a value no column can hold: refused before any statement, and the
                # transaction rolled back (nothing the action did is kept). Told as the page may see it.
                shown = self._shown_on_form(request, queryset.first()) if on_form else self._shown_in_list(request)
                told = told_refusal(exc, self.model, shown, surface="admin", generic=_NOT_DONE)
                self.message_user(request, f"The action changed nothing: {told.detail}", messages.ERROR)
                return None
            if isinstance(response, TemplateResponse) and response.context_data is not None:
                # An intermediate page (delete_selected's confirmation) passes the tokens on, and says
                # whether "Select all" chose the rows that were not on the page.
                response.context_data[ROWS_FIELD.lstrip("_")] = request.POST.get(ROWS_FIELD, "")
                response.context_data[ACROSS_FIELD.lstrip("_")] = _selected_across(request)
            return response

        return checked

    def _row_conflicts(
        self, request: HttpRequest, rows: Sequence[Any], *, on_form: bool = False
    ) -> list[dict[str, Any]]:
        tokens: Any
        if on_form:
            # The change form carries its record's token; Django posts its one object as the selection.
            tokens = {str(obj.pk): request.POST.get(TOKEN_FIELD) or "" for obj in rows}
        else:
            try:
                tokens = json.loads(request.POST.get(ROWS_FIELD) or "null")
            except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
                tokens = None
        if not isinstance(tokens, dict):
            return [
                {
                    "error": "The selected rows cannot be checked against later changes: the page did not carry "
                    "their versions (an intermediate page of an action must pass on the "
                    f"{ROWS_FIELD} field). Reload the list and try again.",
                    "malformed": True,
                }
            ]
        select_across = _selected_across(request)
        problems: list[dict[str, Any]] = []
        listed = None if on_form else self._shown_in_list(request)
        for obj in rows:
            token = tokens.get(str(obj.pk))
            if token is None and str(obj.pk) in tokens:
                problems.append({"error": f"{obj}: the page carried no version for it.", "malformed": True})
                continue
            if token is None:
                if not select_across:  # only rows on the page were seen; all others were selected unseen
                    problems.append({"error": f"{obj} was not on the page you acted on. Reload the list."})
                continue
            try:
                seen_version, seen = read_edit_token(token, obj)
            except InvalidUpdate as exc:
                problems.append({"error": f"{obj}: {exc}", "malformed": True})  # the token's: it quotes no value
                continue
            # Only what the page shows (a valid token of a page that shows more must not tell more).
            shown = self._shown_on_form(request, obj) if listed is None else listed
            # Row-level, not per field (issue 53 is about edits): what an action writes is not known
            # before it runs, and it may write any field (a full save() of each row, as most do).
            conflict = find_conflict(obj, seen_version, _only(seen, shown))
            if conflict is not None:
                problems.append(_conflict_context(conflict, obj))
                # Refused before the action runs: what the action would write is not known.
                stale_save_refused_robust(
                    type(obj), pk=obj.pk, version=seen_version, fields=(), surface="admin", using=obj._state.db
                )
        return problems

    def _refuse(self, request: HttpRequest, problems: list[dict[str, Any]], *, back: str) -> TemplateResponse:
        """The conflict page: what changed, nothing written. 409 for a record that moved on; 400 when
        every problem is input that was never a valid version token (malformed or forged)."""
        opts = self.opts
        context = {
            **self.admin_site.each_context(request),
            "opts": opts,
            "title": _("Not saved: changed by someone else"),
            "problems": problems,
            "back_url": back,
            "changelist_url": reverse(
                f"admin:{opts.app_label}_{opts.model_name}_changelist", current_app=self.admin_site.name
            ),
        }
        malformed = all(problem.get("malformed") for problem in problems)
        return TemplateResponse(request, self.conflict_template, context, status=400 if malformed else 409)

    # -- the delete view ------------------------------------------------------------------------------

    def render_delete_form(self, request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
        obj = context.get("object")
        if isinstance(obj, LockVersionMixin):
            context["safeupdates_token"] = edit_token(obj, self._seen_by(request, obj))
        return super().render_delete_form(request, context)

    def _seen_by(self, request: HttpRequest, obj: Any) -> list[str]:
        """The fields this person can see of the record (on its change page); none for someone who may
        delete it but not view it: a conflict then names no field."""
        if not self.has_view_or_change_permission(request, obj):
            return []
        return self._shown_on_form(request, obj)

    def _shown_on_form(self, request: HttpRequest, obj: Any) -> list[str]:
        """The fields the record's change page shows (its fieldsets, read-only fields included)."""
        return reported_fields(self.model, flatten_fieldsets(self.get_fieldsets(request, obj)))

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        if isinstance(obj, LockVersionMixin):
            # delete() then deletes only if the row still carries the version the page was shown with.
            obj.lock_version, _seen = read_edit_token(request.POST.get(TOKEN_FIELD) or "", obj)
        super().delete_model(request, obj)

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> HttpResponse:
        try:
            with refusals_on("admin"):  # delete() signals its refusal
                return super().delete_view(request, object_id, extra_context)
        except (StaleObjectError, InvalidUpdate) as exc:
            # The transaction of the delete view rolled back: nothing was deleted (nor logged).
            back = request.path
            obj = self.model._base_manager.filter(pk=unquote(object_id)).first()
            if obj is None:
                raise
            problem: dict[str, Any] = {"error": f"{obj}: {exc}", "malformed": isinstance(exc, InvalidUpdate)}
            if isinstance(exc, InvalidUpdate):
                # The token's error, or a write of the delete (a receiver's) that refused a value: told
                # as the person may see it, the whole message logged.
                names = self._seen_by(request, obj)
                told = told_refusal(exc, self.model, names, surface="admin", generic=_NOT_DELETED)
                problem["error"] = f"{obj}: {told.detail}"
            try:
                seen_version, seen = read_edit_token(request.POST.get(TOKEN_FIELD) or "", obj)
            except InvalidUpdate:
                conflict = None
            else:
                conflict = find_conflict(obj, seen_version, _only(seen, self._seen_by(request, obj)))
            if conflict is not None:
                problem = _conflict_context(conflict, obj)
            return self._refuse(request, [problem], back=back)


class SafeUpdateModelAdmin(SafeUpdateAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """A ``ModelAdmin`` with :class:`SafeUpdateAdminMixin`, and ``lock_version`` shown read-only."""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        return fields if "lock_version" in fields else [*fields, "lock_version"]


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Shown and searchable, never added, changed or deleted by hand: safeupdates writes these rows."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
