"""The pages that combine apps (overview, node page, topology, recovery) and the Prometheus
exporter."""

from __future__ import annotations

from django.urls import URLPattern, path

from console import exporter, pages, recovery_page

urlpatterns: list[URLPattern] = [
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
    path("metrics", exporter.metrics_view, name="metrics"),
]
