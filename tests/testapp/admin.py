from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from safeupdates.admin import SafeUpdateModelAdmin
from tests.testapp.models import Chapter, Document, Memo, Profile

#: Django 6.1+: the action is offered on the change form too.
EVERYWHERE: dict[str, Any] = (
    {"location": [admin.ActionLocation.CHANGE_LIST, admin.ActionLocation.CHANGE_FORM]}
    if hasattr(admin, "ActionLocation")
    else {}
)


@admin.register(Profile)
class ProfileAdmin(SafeUpdateModelAdmin):
    list_display = ["name", "active", "newsletter", "score"]
    list_editable = ["active", "score"]
    fields = ["name", "active", "newsletter", "score", "note"]
    actions = ["add_a_point"]

    @admin.action(description="Add a point", **EVERYWHERE)
    def add_a_point(self, request: HttpRequest, queryset: Any) -> None:
        for profile in queryset:
            profile.score += 1
            profile.save()


class ChapterInline(admin.TabularInline):  # type: ignore[type-arg]
    """A plain inline: SafeUpdateModelAdmin checks its rows (Chapter has a lock_version) by itself."""

    model = Chapter
    extra = 0


@admin.register(Document)
class DocumentAdmin(SafeUpdateModelAdmin):
    fields = ["title", "body"]
    inlines = [ChapterInline]


@admin.register(Memo)
class MemoAdmin(SafeUpdateModelAdmin):
    """The admin of a model whose default manager hides the archived rows: its list shows them all."""

    fields = ["text", "pinned", "archived"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return self.model._base_manager.all()
