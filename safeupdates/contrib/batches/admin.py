"""The admin of the batches of ``fan_out()``: read-only, with their progress and their failed items."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy as _

from safeupdates.admin import ReadOnlyAdmin
from safeupdates.contrib.batches.models import Batch
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus

__all__ = ["BatchAdmin"]


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdmin):
    """Fan-out batches with their progress, and links to the items that failed; written by safeupdates only."""

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
        """Says so when items failed, with a link to each (and its error)."""
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
                    item.error,
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
