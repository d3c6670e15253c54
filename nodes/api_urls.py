"""API of the inventory, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from nodes import api
from nodes.access import api as identity_api

urlpatterns: list[URLPattern] = [
    path("clusters/", api.ClusterListApi.as_view(), name="cluster-list"),
    path("clusters/register/", api.ClusterRegisterApi.as_view(), name="cluster-register"),
    path("clusters/<int:cluster_id>/", api.ClusterDetailApi.as_view(), name="cluster-detail"),
    path(
        "clusters/<int:cluster_id>/update/", api.ClusterUpdateApi.as_view(), name="cluster-update"
    ),
    path("clusters/<int:cluster_id>/probe/", api.ClusterProbeApi.as_view(), name="cluster-probe"),
    path("clusters/<int:cluster_id>/sync/", api.ClusterSyncApi.as_view(), name="cluster-sync"),
    # Per-user identities (nodes.access.api).
    path(
        "clusters/<int:cluster_id>/user-ca/",
        identity_api.ClusterUserCaApi.as_view(),
        name="cluster-user-ca",
    ),
    path(
        "clusters/<int:cluster_id>/user-ca/create/",
        identity_api.ClusterUserCaCreateApi.as_view(),
        name="cluster-user-ca-create",
    ),
    path(
        "clusters/<int:cluster_id>/user-auth/",
        identity_api.ClusterUserAuthApi.as_view(),
        name="cluster-user-auth",
    ),
    path(
        "clusters/<int:cluster_id>/identity/",
        identity_api.MyClusterIdentityApi.as_view(),
        name="cluster-my-identity",
    ),
    path(
        "clusters/<int:cluster_id>/identities/",
        identity_api.ClusterIdentityListApi.as_view(),
        name="cluster-identity-list",
    ),
    path(
        "clusters/<int:cluster_id>/identities/set/",
        identity_api.ClusterIdentitySetApi.as_view(),
        name="cluster-identity-set",
    ),
    path(
        "clusters/<int:cluster_id>/identities/<int:identity_id>/delete/",
        identity_api.ClusterIdentityDeleteApi.as_view(),
        name="cluster-identity-delete",
    ),
    path("nodes/", api.NodeListApi.as_view(), name="node-list"),
    path("nodes/<int:node_id>/", api.NodeDetailApi.as_view(), name="node-detail"),
    path("nodes/<int:node_id>/drain/", api.NodeDrainApi.as_view(), name="node-drain"),
    path("nodes/<int:node_id>/resume/", api.NodeResumeApi.as_view(), name="node-resume"),
    path("gpus/", api.GpuListApi.as_view(), name="gpu-list"),
    path("topology/", api.TopologyApi.as_view(), name="topology"),
]
