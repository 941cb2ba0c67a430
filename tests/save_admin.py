"""An admin site of its own for ``test_save_contract``: the parent model of a multi-table pair, and a
model whose primary key is edited in its change form. A URLconf (``pytest.mark.urls``)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from safeupdates.admin import SafeUpdateModelAdmin
from tests.testapp.models import Place, Tag

site = admin.AdminSite(name="save_admin")


@admin.register(Place, site=site)
class PlaceAdmin(SafeUpdateModelAdmin):
    fields = ["name", "open"]


@admin.register(Tag, site=site)
class TagAdmin(SafeUpdateModelAdmin):
    fields = ["code", "label"]


urlpatterns = [path("admin/", site.urls)]
