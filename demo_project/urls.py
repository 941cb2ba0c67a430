"""URLs of the demo project: the toggle page, login, the admin (with the request log's status page),
django-rq's queue statistics and safeupdates' Prometheus metrics."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("", include("demo_project.toggles.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(template_name="toggles/login.html"), name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("django-rq/", include("django_rq.urls")),
    path("metrics/", include("safeupdates.contrib.prometheus.urls")),
]
