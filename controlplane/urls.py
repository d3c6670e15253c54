"""The root URLconf: each app's pages (``<app>/urls.py``) and API (``<app>/api_urls.py``),
included by name, so configuration imports no app (the pages that combine apps are the
console's, ``console/urls.py``)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

API_APPS = (
    "core",
    "nodes",
    "health",
    "studies",
    "jobs",
    "drills",
    "recovery",
    "acceptance",
    "notifications",
)
PAGE_APPS = ("console", "core", "nodes", "jobs", "drills", "acceptance")

api_v1: list[URLPattern | URLResolver] = [path("", include(f"{app}.api_urls")) for app in API_APPS]

urlpatterns: list[URLPattern | URLResolver] = [
    *(path("", include(f"{app}.urls")) for app in PAGE_APPS),
    path("studies/", include("studies.urls")),
    path("account/notifications/", include("notifications.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include((api_v1, "api"), namespace="api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]

handler400 = "core.errors.handler400"
handler403 = "core.errors.handler403"
handler404 = "core.errors.handler404"
handler500 = "core.errors.handler500"
