"""URLs of the toggle page, under the ``toggles`` namespace."""

from __future__ import annotations

from django.urls import path

from demo_project.toggles import views

app_name = "toggles"

urlpatterns = [
    path("", views.home, name="home"),
    path("profiles/<int:pk>/", views.profile_page, name="profile"),
    path("profiles/<int:pk>/toggle/", views.toggle, name="toggle"),
    path("profiles/<int:pk>/state/", views.state, name="state"),
]
