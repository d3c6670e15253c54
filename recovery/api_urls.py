"""API of recovery, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from recovery import api

urlpatterns: list[URLPattern] = [
    path("incidents/", api.IncidentListApi.as_view(), name="incident-list"),
    path(
        "clusters/<int:cluster_id>/recovery-policy/",
        api.RecoveryPolicyApi.as_view(),
        name="recovery-policy",
    ),
    path("suspect-nodes/", api.SuspectNodesApi.as_view(), name="suspect-node-list"),
    path(
        "nodes/<int:node_id>/suspicions/clear/",
        api.SuspectNodeClearApi.as_view(),
        name="suspect-node-clear",
    ),
]
