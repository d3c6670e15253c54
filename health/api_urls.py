"""API of GPU and node health, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from health import api

urlpatterns: list[URLPattern] = [
    path("nodes/<int:node_id>/health/", api.NodeHealthApi.as_view(), name="node-health"),
    path("health/capacity/", api.GpuCapacityApi.as_view(), name="gpu-capacity"),
    path(
        "clusters/<int:cluster_id>/health-source/",
        api.HealthSourceApi.as_view(),
        name="health-source",
    ),
]
