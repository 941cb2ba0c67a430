"""The request log admin's read-only status page: the summary of ``manage.py safeupdates_status``."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.apps import apps
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from safeupdates import status
from safeupdates.admin.permissions import MODEL_GONE_HIDDEN, RECORDLESS_HIDDEN, may_view, may_view_recordless


class StatusPageMixin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Adds ``status/`` to the request log's admin (anyone who may view the log may view it), and a
    link to it above the list."""

    change_list_template = "safeupdates/admin/processedrequest_change_list.html"

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.model._meta.app_label}_{self.model._meta.model_name}_status"
        return [path("status/", self.admin_site.admin_view(self.status_view), name=name), *super().get_urls()]

    def status_view(self, request: HttpRequest) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        snapshot = status.collect()
        snapshot.failed_requests = [self._as_viewer_may_see(request, entry) for entry in snapshot.failed_requests]
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": "Safe updates: status",
            "opts": self.model._meta,
            "status": snapshot,
            "problems": snapshot.problems(),
            "warnings": snapshot.warnings(),
        }
        return TemplateResponse(request, "safeupdates/admin/status.html", context)

    def _as_viewer_may_see(self, request: HttpRequest, entry: status.FailedRequest) -> status.FailedRequest:
        """A failed request's error quotes its values where the database refused them: shown only to a
        viewer who may view its model (see :func:`safeupdates.admin.permissions.may_view`), and for a
        request of no record (a task, a batch item) to one who may see such values
        (:func:`~safeupdates.admin.permissions.may_view_recordless`)."""
        if entry.model == "-":
            if may_view_recordless(request):
                return entry
            return dataclasses.replace(entry, error=RECORDLESS_HIDDEN)
        try:
            model = apps.get_model(entry.model)
        except (LookupError, ValueError):  # a model that is gone: no one may view it (as in the list)
            return dataclasses.replace(entry, error=MODEL_GONE_HIDDEN)
        if may_view(request, model, self.admin_site):
            return entry
        return dataclasses.replace(entry, error=f"hidden: you may not view {model._meta.label_lower}")
