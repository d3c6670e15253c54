"""API of the inventory, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from nodes import api

urlpatterns: list[URLPattern] = [
    path("clusters/", api.ClusterListApi.as_view(), name="cluster-list"),
    path("clusters/register/", api.ClusterRegisterApi.as_view(), name="cluster-register"),
    path("clusters/<int:cluster_id>/", api.ClusterDetailApi.as_view(), name="cluster-detail"),
    path("clusters/<int:cluster_id>/probe/", api.ClusterProbeApi.as_view(), name="cluster-probe"),
    path("clusters/<int:cluster_id>/sync/", api.ClusterSyncApi.as_view(), name="cluster-sync"),
    path("nodes/", api.NodeListApi.as_view(), name="node-list"),
    path("nodes/<int:node_id>/", api.NodeDetailApi.as_view(), name="node-detail"),
    path("nodes/<int:node_id>/drain/", api.NodeDrainApi.as_view(), name="node-drain"),
    path("nodes/<int:node_id>/resume/", api.NodeResumeApi.as_view(), name="node-resume"),
    path("gpus/", api.GpuListApi.as_view(), name="gpu-list"),
    path("topology/", api.TopologyApi.as_view(), name="topology"),
]
