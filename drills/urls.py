"""Pages of restore drills and the checkpoint integrity panel."""

from __future__ import annotations

from django.urls import URLPattern, path

from drills import views

urlpatterns: list[URLPattern] = [
    path("drills/", views.drill_list_page, name="drill-list"),
    path("drills/<uuid:drill_id>/", views.drill_detail_page, name="drill-detail"),
    path("drills/<uuid:drill_id>/status/", views.drill_status_partial, name="drill-status"),
    path("drills/<uuid:drill_id>/cancel/", views.drill_cancel_action, name="drill-cancel"),
    path("jobs/<uuid:job_id>/checkpoints/<int:step>/", views.checkpoint_page, name="checkpoint"),
    path(
        "checkpoints/<int:checkpoint_id>/drill/",
        views.checkpoint_drill_action,
        name="checkpoint-drill",
    ),
    path(
        "checkpoints/<int:checkpoint_id>/verify/",
        views.checkpoint_verify_action,
        name="checkpoint-verify",
    ),
    path(
        "clusters/<int:cluster_id>/drill-policy/",
        views.drill_policy_action,
        name="drill-policy",
    ),
]
