"""API of checkpoints' drills and drill policies, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from drills import api

urlpatterns: list[URLPattern] = [
    path(
        "checkpoints/<int:checkpoint_id>/",
        api.CheckpointDetailApi.as_view(),
        name="checkpoint-detail",
    ),
    path(
        "checkpoints/<int:checkpoint_id>/verify/",
        api.CheckpointVerifyApi.as_view(),
        name="checkpoint-verify",
    ),
    path(
        "checkpoints/<int:checkpoint_id>/drills/", api.DrillStartApi.as_view(), name="drill-start"
    ),
    path("drills/", api.DrillListApi.as_view(), name="drill-list"),
    path("drills/<uuid:drill_id>/", api.DrillDetailApi.as_view(), name="drill-detail"),
    path("drills/<uuid:drill_id>/cancel/", api.DrillCancelApi.as_view(), name="drill-cancel"),
    path(
        "clusters/<int:cluster_id>/drill-policy/",
        api.DrillPolicyApi.as_view(),
        name="drill-policy",
    ),
    path(
        "clusters/<int:cluster_id>/drill-budget/",
        api.DrillBudgetApi.as_view(),
        name="drill-budget",
    ),
]
