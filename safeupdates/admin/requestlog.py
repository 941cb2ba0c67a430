"""The read-only admin of the request log (:class:`ProcessedRequestAdmin`), and its changelist on a log
of millions of rows: counts and filters that never read every row.

Each request shows what it wanted and why it ended as it did. The changelist scales:

Django's changelist counts its rows with ``COUNT(*)`` (twice, with ``show_full_result_count``), lists a
field filter's choices with a ``DISTINCT`` over the column, and draws the date hierarchy from the dates
of every row. At 1M requests that made the first page take 600 ms and a search 2 s. Here:

- :class:`RequestLogPaginator`: the unfiltered list of a large log is counted from PostgreSQL's
  statistics ("about 1,000,000"), a filtered one up to :attr:`~RequestLogPaginator.count_up_to` rows
  ("more than 10,000").
- :class:`QueueFilter`: the queues of ``RQ_QUEUES``, not the log's distinct values.
- The "created" filter (Django's ``DateFieldListFilter``: today, past 7 days, this month ...) in place of
  the date hierarchy: its choices cost no query.
"""

from __future__ import annotations

import json
import re
import uuid
from functools import cached_property
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.views.main import IGNORED_PARAMS, SEARCH_VAR, ChangeList
from django.contrib.contenttypes.models import ContentType
from django.core.paginator import Paginator
from django.db import connections, models
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from safeupdates.admin.mixins import ReadOnlyAdmin
from safeupdates.admin.permissions import VALUE_FIELDS, hidden_values, shown_rows, values_shown
from safeupdates.admin.status import StatusPageMixin
from safeupdates.database.cursors import fetch_one
from safeupdates.database.statements import ESTIMATED_ROWS, stored_version
from safeupdates.models import LockVersionMixin, ProcessedRequest, RequestKind, RequestStatus


class RequestLogPaginator(Paginator):  # type: ignore[type-arg]
    """Counts the request log without reading every row of it.

    ``estimated``: the list is the whole log; on PostgreSQL a log of more than :attr:`estimate_above`
    rows (by its statistics) is counted by them, and :attr:`approximate` is set. Otherwise at most
    :attr:`count_up_to` + 1 rows are counted (``COUNT(*)`` of a ``LIMIT``), and :attr:`capped` is set
    when there are more: the pages then end there, and a filter narrows the list.
    """

    #: Rows of the whole log above which its count is PostgreSQL's estimate.
    estimate_above = 100_000
    #: Rows a filtered list is counted up to.
    count_up_to = 10_000

    def __init__(
        self, object_list: models.QuerySet[Any], per_page: int, *args: Any, estimated: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(object_list, per_page, *args, **kwargs)
        self.queryset = object_list
        self.estimated = estimated
        self.approximate = False
        self.capped = False

    @cached_property
    def count(self) -> int:
        if self.estimated:
            estimate = estimated_rows(self.queryset.db)
            if estimate is not None and estimate > self.estimate_above:
                self.approximate = True
                return estimate
        counted = self.queryset[: self.count_up_to + 1].count()
        if counted > self.count_up_to:
            self.capped = True
            return self.count_up_to
        return counted


def estimated_rows(using: str) -> int | None:
    """PostgreSQL's estimate of the request log's rows; None on another database or before statistics."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    row = fetch_one(connection, ESTIMATED_ROWS, [connection.ops.quote_name(ProcessedRequest._meta.db_table)])
    return int(row[0]) if row is not None and row[0] >= 0 else None


def unfiltered(request: HttpRequest) -> bool:
    """Whether the changelist shows the whole log: no filter, no search (ordering and the page aside)."""
    return not request.GET.get(SEARCH_VAR) and all(key in IGNORED_PARAMS for key in request.GET)


class QueueFilter(admin.SimpleListFilter):
    """ "By queue": the queues of ``RQ_QUEUES`` (a request names the queue its job was sent to)."""

    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(getattr(settings, "RQ_QUEUES", {}))]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> models.QuerySet[Any]:
        value = self.value()
        return queryset.filter(queue=value) if value else queryset


class SafeUpdateModelsFilter(admin.RelatedFieldListFilter):
    """The "By model" filter of the request log: only the models that use safeupdates, and the requests
    of no record (tasks, batch items) under a name of their own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.empty_value_display = conditional_escape(_("No record (tasks, batch items)"))

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        models_ = [m for m in apps.get_models() if issubclass(m, LockVersionMixin) and not m._meta.proxy]
        types = ContentType.objects.get_for_models(*models_).values() if models_ else []
        return sorted(((str(ct.pk), str(ct)) for ct in types), key=lambda choice: choice[1])


#: A request id, or the start of one: 8 to 32 hex digits, with or without the hyphens of a UUID.
_REQUEST_ID_PREFIX = re.compile(r"[0-9a-f]{8}(?:-?[0-9a-f]){0,24}", re.IGNORECASE)


def _request_id_range(term: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The request ids that start with ``term`` (from ``...000`` to ``...fff``), if it is the start of one."""
    term = term.strip()
    if not _REQUEST_ID_PREFIX.fullmatch(term):
        return None
    digits = term.replace("-", "").lower()
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def _of_values(lookup: str) -> bool:
    """Whether a lookup (``changes__name``, a search field's ``^error``) reads a request's values."""
    return lookup.lstrip("^=@-").split(LOOKUP_SEP, 1)[0] in VALUE_FIELDS


class RequestLogChangeList(ChangeList):
    """A filter on a request's values (``?changes__name=...``, a lookup the admin allows on any field of
    the model) looks only at the rows whose values the viewer may see: over the others, whether a row is
    listed would tell whether a guess of its values is right."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> models.QuerySet[Any]:
        if any(_of_values(key) for key in self.params) and not getattr(self, "_safeupdates_narrowed", False):
            self.root_queryset = self.root_queryset.filter(safeupdates_shown=True)
            self._safeupdates_narrowed = True
        return super().get_queryset(request, exclude_parameters)


def _short(changes: Any, limit: int = 60) -> str:
    text = ", ".join(f"{name}={value!r}" for name, value in changes.items()) if isinstance(changes, dict) else ""
    return Truncator(text).chars(limit)


@admin.register(ProcessedRequest)
class ProcessedRequestAdmin(StatusPageMixin, ReadOnlyAdmin):
    """The request log is written by safeupdates only: it can be inspected, filtered and searched.

    Each request shows what it wanted (``changes``) and why it ended as it did: for a stale request,
    which newer write holds each of its fields now (from the record's ``field_versions`` and the log).
    """

    list_display = [
        "request_id",
        "kind",
        "target_link",
        "wanted",
        "version",
        "status",
        "outcome",
        "attempts",
        "created_at",
        "processed_at",
    ]
    # Filters whose choices cost no query on a large log (safeupdates.admin.requestlog).
    list_filter = [
        "status",
        "kind",
        ("content_type", SafeUpdateModelsFilter),
        QueueFilter,
        ("created_at", admin.DateFieldListFilter),
    ]
    # A request id is searched for by get_search_results(), as a range on its unique index.
    search_fields = ["object_id__exact", "key__exact"]
    search_help_text = _("A request id (or a prefix of 8 or more hex digits of one), an object id, or a task's key.")
    show_full_result_count = False  # a second count, of the whole log
    ordering = ["-created_at", "-id"]
    list_select_related = ["content_type"]
    readonly_fields = [
        "request_id",
        "kind",
        "content_type",
        "object_id",
        "key",
        "target_link",
        "version",
        "synced_at",
        "wanted_in_full",
        "status",
        "outcome",
        "error_shown",
        "attempts",
        "queue",
        "created_at",
        "processed_at",
    ]
    fields = readonly_fields  # type: ignore[assignment]

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[Any]:
        """The log, each row marked with whether its values may be shown to this viewer
        (:func:`values_shown`): its record's model is one the viewer may view, or it has no record and
        the viewer has ``safeupdates.view_recordless_values``."""
        shown = shown_rows(request, self.admin_site)
        log: models.QuerySet[Any] = super().get_queryset(request)
        marked: models.QuerySet[Any] = log.annotate(
            safeupdates_shown=models.Case(
                models.When(shown, then=models.Value(True)),
                default=models.Value(False),
                output_field=models.BooleanField(),
            )
        )
        return marked

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RequestLogChangeList

    def get_search_fields(self, request: HttpRequest) -> Any:
        without = getattr(request, "_safeupdates_search_without_values", False)
        fields = super().get_search_fields(request)
        return [field for field in fields if not _of_values(field)] if without else fields

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: models.QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> RequestLogPaginator:
        return RequestLogPaginator(queryset, per_page, orphans, allow_empty_first_page, estimated=unfiltered(request))

    def get_search_results(
        self, request: HttpRequest, queryset: models.QuerySet[Any], search_term: str
    ) -> tuple[models.QuerySet[Any], bool]:
        """A request id, or its first 8 or more hex digits, finds those requests through the unique
        index on ``request_id`` (a range, never a text match over every row); a term that matches no
        request id is looked for as an object id or a task's key.

        A search field of a request's values (``changes``, ``error``: a subclass's) matches only the rows
        whose values the viewer may see; the others are found by the other fields alone."""
        bounds = _request_id_range(search_term)
        if bounds is not None:
            by_id = queryset.filter(request_id__range=bounds)
            if by_id.exists():
                return by_id, False
        if not search_term or not any(_of_values(field) for field in self.get_search_fields(request)):
            return super().get_search_results(request, queryset, search_term)
        shown, shown_duplicates = super().get_search_results(
            request, queryset.filter(safeupdates_shown=True), search_term
        )
        if all(_of_values(field) for field in self.get_search_fields(request)):
            return shown, shown_duplicates
        request._safeupdates_search_without_values = True  # type: ignore[attr-defined]
        try:
            others, others_duplicates = super().get_search_results(request, queryset, search_term)
        finally:
            del request._safeupdates_search_without_values  # type: ignore[attr-defined]
        return shown | others, shown_duplicates or others_duplicates

    @admin.display(description=_("target"))
    def target_link(self, obj: ProcessedRequest) -> str:
        if obj.content_type_id is None:
            return obj.key  # a keyed task: no row
        try:
            content_type = obj.content_type
        except ContentType.DoesNotExist:
            content_type = None
        if content_type is None:  # the log has no foreign key: its content type was deleted
            return f"content type {obj.content_type_id} (deleted) {obj.object_id}"
        label = f"{content_type.app_label}.{content_type.model} {obj.object_id}"
        try:
            url = reverse(f"admin:{content_type.app_label}_{content_type.model}_change", args=[obj.object_id])
        except NoReverseMatch:
            return label
        return format_html('<a href="{}">{}</a>', url, label)

    @admin.display(description=_("wanted"))
    def wanted(self, obj: ProcessedRequest) -> str:
        """What the request asked for, short (the change page shows all of it)."""
        if obj.kind == RequestKind.BATCH_ITEM or obj.kind == RequestKind.TASK:
            return obj.key
        if not values_shown(obj):
            return hidden_values(obj)
        return _short(obj.changes)

    @admin.display(description=_("changes"))
    def wanted_in_full(self, obj: ProcessedRequest) -> str:
        """What the request asked for, all of it."""
        if not values_shown(obj):
            return hidden_values(obj)
        return json.dumps(obj.changes, ensure_ascii=False, sort_keys=True, default=str)

    @admin.display(description=_("error"))
    def error_shown(self, obj: ProcessedRequest) -> str:
        """Why it was rejected or failed: a database's refusal may quote the values."""
        if obj.error and not values_shown(obj):
            return hidden_values(obj)
        return obj.error

    @admin.display(description=_("why"))
    def outcome(self, obj: ProcessedRequest) -> str:
        """Why the request ended as it did: for a stale one, the newer write that holds each field."""
        if obj.status == RequestStatus.PENDING:
            return "waiting for a worker"
        if obj.status in (RequestStatus.REJECTED, RequestStatus.FAILED):
            return self.error_shown(obj) or "-"
        if obj.status != RequestStatus.STALE or obj.kind != RequestKind.UPDATE:
            return "-"
        current = self._target(obj)
        if current is None:
            return "the record no longer exists"
        if obj.synced_at is not None:
            if not values_shown(obj):  # the record's time is a value of the record
                return f"the record was synced no earlier than this request's {obj.synced_at:%Y-%m-%d %H:%M:%S}"
            synced = getattr(current, "last_synced_at", None)
            return (
                f"the record was synced at {synced:%Y-%m-%d %H:%M:%S}, "
                f"not older than this request's {obj.synced_at:%Y-%m-%d %H:%M:%S}"
            )
        parts = [self._holder(obj, current, name) for name in obj.changes]
        return format_html_join(mark_safe("<br>"), "{}", ((part,) for part in parts))

    def _target(self, obj: ProcessedRequest) -> Any:
        try:
            content_type = obj.content_type if obj.content_type_id else None
            model = content_type.model_class() if content_type is not None else None
        except ContentType.DoesNotExist:
            model = None
        if model is None or not issubclass(model, LockVersionMixin):
            return None
        return model._base_manager.filter(pk=obj.object_id).first()

    def _holder(self, obj: ProcessedRequest, current: Any, name: str) -> str:
        """``name: held by v<version> (request <link> | a direct save)``."""
        version = stored_version(current.field_versions, name)
        if obj.version is not None and version <= obj.version:
            return f"{name}: no newer write holds it now"
        holder = (
            ProcessedRequest.objects.filter(
                content_type_id=obj.content_type_id, object_id=obj.object_id, version=version, changes__has_key=name
            )
            .exclude(pk=obj.pk)
            .first()
        )
        if holder is None:
            return f"{name}: held by v{version} (a direct save)"
        try:
            url = reverse("admin:safeupdates_processedrequest_change", args=[holder.pk])
        except NoReverseMatch:
            return f"{name}: held by v{version} (request {holder.request_id})"
        return format_html('{}: held by v{} (request <a href="{}">{}</a>)', name, version, url, holder.request_id)
