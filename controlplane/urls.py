"""The root URLconf: the composition root. Each app owns its pages (``<app>/urls.py``) and
its API (``<app>/api_urls.py``); the pages that combine apps are in ``console.pages``.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console import exporter, pages, recovery_page
from core.ratelimit import RateLimitedLoginView

api_v1: list[URLPattern | URLResolver] = [
    path("", include("core.api_urls")),
    path("", include("nodes.api_urls")),
    path("", include("health.api_urls")),
    path("", include("studies.api_urls")),
    path("", include("jobs.api_urls")),
    path("", include("drills.api_urls")),
    path("", include("recovery.api_urls")),
    path("", include("acceptance.api_urls")),
    path("", include("notifications.api_urls")),
]

urlpatterns = [
    path("", pages.overview, name="overview"),
    path("overview/live/", pages.overview_live_partial, name="overview-live"),
    path("nodes/<int:node_id>/", pages.node_detail_page, name="node-detail"),
    path("topology/", pages.topology_page, name="topology"),
    path("recovery/", recovery_page.recovery_page, name="recovery"),
    path(
        "recovery/suspects/<int:node_id>/clear/",
        recovery_page.suspect_clear_action,
        name="suspect-clear",
    ),
    path("", include("nodes.urls")),
    path("", include("jobs.urls")),
    path("", include("drills.urls")),
    path("", include("acceptance.urls")),
    path("studies/", include("studies.urls")),
    path("account/", include("core.urls")),
    path("account/notifications/", include("notifications.urls")),
    path("accounts/login/", RateLimitedLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include((api_v1, "api"), namespace="api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("metrics", exporter.metrics_view, name="metrics"),
]

handler400 = "core.errors.handler400"
handler403 = "core.errors.handler403"
handler404 = "core.errors.handler404"
handler500 = "core.errors.handler500"
