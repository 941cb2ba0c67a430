"""Read-only admin of the request log."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.contenttypes.models import ContentType
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from safeupdates.models import Batch, ProcessedRequest


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Shown and searchable, never added, changed or deleted by hand: safeupdates writes these rows."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ProcessedRequest)
class ProcessedRequestAdmin(ReadOnlyAdmin):
    """The request log is written by safeupdates only: it can be inspected, filtered and searched."""

    list_display = ["request_id", "kind", "target_link", "version", "status", "attempts", "created_at", "processed_at"]
    list_filter = ["status", "kind", "content_type", "queue"]
    search_fields = ["=request_id", "=object_id", "=key"]
    date_hierarchy = "created_at"
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
        "changes",
        "status",
        "error",
        "attempts",
        "queue",
        "created_at",
        "processed_at",
    ]
    fields = readonly_fields  # type: ignore[assignment]

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


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdmin):
    """Fan-out batches with their progress; written by safeupdates only."""

    list_display = ["batch_id", "item_func", "then", "progress_display", "succeeded", "failed", "total", "status"]
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
