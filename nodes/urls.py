"""Pages of the inventory (the node and topology pages are in ``console.pages``)."""

from __future__ import annotations

from django.urls import URLPattern, path

from nodes import views

urlpatterns: list[URLPattern] = [
    path("nodes/", views.node_list_page, name="node-list"),
    path("nodes/live/", views.node_list_live_partial, name="node-list-live"),
    path("nodes/<int:node_id>/drain/", views.node_drain_action, name="node-drain"),
    path("nodes/<int:node_id>/resume/", views.node_resume_action, name="node-resume"),
    path("clusters/<int:cluster_id>/sync/", views.cluster_sync_action, name="cluster-sync"),
    path("clusters/<int:cluster_id>/access/", views.cluster_access_page, name="cluster-access"),
]
