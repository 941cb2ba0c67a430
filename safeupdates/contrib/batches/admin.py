"""The admin of the batches of ``fan_out()``: read-only, with their progress and their failed items."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy as _

from safeupdates.admin import ReadOnlyAdmin
from safeupdates.admin.permissions import RECORDLESS_HIDDEN, may_view_recordless
from safeupdates.contrib.batches.models import Batch
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdmin):
    """Fan-out batches with their progress, and links to the items that failed; written by safeupdates only.

    The errors of the failed items and of the reduce may quote the items' values: the values of requests
    of no record, shown as the request log shows them, with ``safeupdates.view_recordless_values``
    (:func:`~safeupdates.admin.permissions.may_view_recordless`; a superuser has it). Without it they
    are hidden, and a filter on the reduce's error (a lookup the admin allows on any field) is refused.
    """

    list_display = [
        "batch_id",
        "item_func",
        "then",
        "progress_display",
        "succeeded",
        "failed_display",
        "total",
        "status",
    ]
    list_filter = ["status", "queue"]
    search_fields = ["=batch_id", "item_func", "then"]
    date_hierarchy = "created_at"
    ordering = ["-created_at", "-id"]
    readonly_fields = [
        "batch_id",
        "item_func",
        "then",
        "queue",
        "retries",
        "total",
        "succeeded",
        "failed",
        "failed_items",
        "progress_display",
        "status",
        "created_at",
        "finished_at",
        "reduced_at",
        "reduce_attempts",
        "reduce_error",
        "reduce_failed_at",
    ]
    fields = readonly_fields  # type: ignore[assignment]

    #: The fields that show errors, and what stands for them to a viewer who may not see the values.
    _WITHOUT_VALUES = {"failed_items": "failed_items_without_errors", "reduce_error": "reduce_error_hidden"}

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._for_viewer(request, super().get_fields(request, obj))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._for_viewer(request, super().get_readonly_fields(request, obj))

    def _for_viewer(self, request: HttpRequest, names: Any) -> Any:
        if may_view_recordless(request):
            return names
        return [self._WITHOUT_VALUES.get(name, name) for name in names]

    # request: Any, as Django 5.2 (optional) and 6.x (required) declare it.
    def lookup_allowed(self, lookup: str, value: str, request: Any = None) -> bool:
        if lookup.split("__", 1)[0] == "reduce_error" and (request is None or not may_view_recordless(request)):
            return False  # listing a batch or not would tell whether a guess of its error is right
        return super().lookup_allowed(lookup, value, request)

    @admin.display(description=_("progress"))
    def progress_display(self, obj: Batch) -> str:
        return format_html(
            '<progress value="{}" max="100"></progress> {}%', round(obj.progress * 100), round(obj.progress * 100)
        )

    def _items_url(self, obj: Batch) -> str:
        # The request log's admin filters by the items' keys, "<batch id>:<index>".
        query = {
            "kind__exact": RequestKind.BATCH_ITEM,
            "key__startswith": f"{obj.batch_id}:",
            "status__exact": "failed",
        }
        return f"{reverse('admin:safeupdates_processedrequest_changelist')}?{urlencode(query)}"

    @admin.display(description=_("failed"), ordering="failed")
    def failed_display(self, obj: Batch) -> str:
        if not obj.failed:
            return "0"
        return format_html('<a href="{}">{} failed</a>', self._items_url(obj), obj.failed)

    @admin.display(description=_("failed items"))
    def failed_items(self, obj: Batch) -> str:
        """Says so when items failed, with a link to each and its error."""
        return self._failed_items(obj, errors=True)

    @admin.display(description=_("failed items"))
    def failed_items_without_errors(self, obj: Batch) -> str:
        """:meth:`failed_items` for a viewer without ``safeupdates.view_recordless_values``: no errors."""
        return self._failed_items(obj, errors=False)

    @admin.display(description=_("last reduce error"))
    def reduce_error_hidden(self, obj: Batch) -> str:
        return RECORDLESS_HIDDEN if obj.reduce_error else ""

    def _failed_items(self, obj: Batch, *, errors: bool) -> str:
        if not obj.failed:
            return "none"
        items = ProcessedRequest.objects.filter(
            kind=RequestKind.BATCH_ITEM, request_id__in=obj.items.values("request_id"), status=RequestStatus.FAILED
        ).order_by("id")[:50]
        index = dict(
            obj.items.filter(request_id__in=[item.request_id for item in items]).values_list("request_id", "index")
        )
        links = format_html_join(
            mark_safe("<br>"),
            '<a href="{}">item {}</a>: {}',
            (
                (
                    reverse("admin:safeupdates_processedrequest_change", args=[item.pk]),
                    index[item.request_id],
                    item.error if errors else RECORDLESS_HIDDEN,
                )
                for item in items
            ),
        )
        head = format_html(
            '{} item{} failed (<a href="{}">all of them in the request log</a>):',
            obj.failed,
            "" if obj.failed == 1 else "s",
            self._items_url(obj),
        )
        return format_html("{}<br>{}", head, links)
