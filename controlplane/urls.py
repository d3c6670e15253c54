from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from controlplane import views
from controlplane.api_views import AuditEventListApi, MeApi
from controlplane.ratelimit import RateLimitedLoginView
from jobs import api as job_api
from jobs import drill_api, drill_views
from jobs import views as job_views
from nodes import api as node_api
from nodes import views as node_views

api_v1: list[URLPattern | URLResolver] = [
    path("me/", MeApi.as_view(), name="me"),
    path("audit-events/", AuditEventListApi.as_view(), name="audit-event-list"),
    path("clusters/", node_api.ClusterListApi.as_view(), name="cluster-list"),
    path("clusters/register/", node_api.ClusterRegisterApi.as_view(), name="cluster-register"),
    path("clusters/<int:cluster_id>/", node_api.ClusterDetailApi.as_view(), name="cluster-detail"),
    path(
        "clusters/<int:cluster_id>/probe/", node_api.ClusterProbeApi.as_view(), name="cluster-probe"
    ),
    path("clusters/<int:cluster_id>/sync/", node_api.ClusterSyncApi.as_view(), name="cluster-sync"),
    path("nodes/", node_api.NodeListApi.as_view(), name="node-list"),
    path("nodes/<int:node_id>/", node_api.NodeDetailApi.as_view(), name="node-detail"),
    path("nodes/<int:node_id>/drain/", node_api.NodeDrainApi.as_view(), name="node-drain"),
    path("nodes/<int:node_id>/resume/", node_api.NodeResumeApi.as_view(), name="node-resume"),
    path("gpus/", node_api.GpuListApi.as_view(), name="gpu-list"),
    path("topology/", node_api.TopologyApi.as_view(), name="topology"),
    path("", include("studies.api_urls")),
    path("jobs/", job_api.JobListApi.as_view(), name="job-list"),
    path("jobs/submit/", job_api.JobSubmitApi.as_view(), name="job-submit"),
    path("jobs/preview/", job_api.JobPreviewApi.as_view(), name="job-preview"),
    path("jobs/<uuid:job_id>/", job_api.JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<uuid:job_id>/cancel/", job_api.JobCancelApi.as_view(), name="job-cancel"),
    path("jobs/<uuid:job_id>/resume/", job_api.JobResumeApi.as_view(), name="job-resume"),
    path("jobs/<uuid:job_id>/metrics/", job_api.JobMetricsApi.as_view(), name="job-metrics"),
    path(
        "jobs/<uuid:job_id>/checkpoints/",
        job_api.JobCheckpointsApi.as_view(),
        name="job-checkpoints",
    ),
    path("jobs/<uuid:job_id>/logs/", job_api.JobLogsApi.as_view(), name="job-logs"),
    path("jobs/<uuid:job_id>/events/", job_api.JobEventsApi.as_view(), name="job-events"),
    path("trainer/presets/", job_api.TrainerPresetsApi.as_view(), name="trainer-presets"),
    path(
        "checkpoints/<int:checkpoint_id>/",
        drill_api.CheckpointDetailApi.as_view(),
        name="checkpoint-detail",
    ),
    path(
        "checkpoints/<int:checkpoint_id>/verify/",
        drill_api.CheckpointVerifyApi.as_view(),
        name="checkpoint-verify",
    ),
    path(
        "checkpoints/<int:checkpoint_id>/drills/",
        drill_api.DrillStartApi.as_view(),
        name="drill-start",
    ),
    path("drills/", drill_api.DrillListApi.as_view(), name="drill-list"),
    path("drills/<uuid:drill_id>/", drill_api.DrillDetailApi.as_view(), name="drill-detail"),
    path("drills/<uuid:drill_id>/cancel/", drill_api.DrillCancelApi.as_view(), name="drill-cancel"),
    path(
        "clusters/<int:cluster_id>/drill-policy/",
        drill_api.DrillPolicyApi.as_view(),
        name="drill-policy",
    ),
]

urlpatterns = [
    path("", views.overview, name="overview"),
    path("nodes/", node_views.node_list_page, name="node-list"),
    path("nodes/<int:node_id>/", node_views.node_detail_page, name="node-detail"),
    path("nodes/<int:node_id>/drain/", node_views.node_drain_action, name="node-drain"),
    path("nodes/<int:node_id>/resume/", node_views.node_resume_action, name="node-resume"),
    path("clusters/<int:cluster_id>/sync/", node_views.cluster_sync_action, name="cluster-sync"),
    path("topology/", node_views.topology_page, name="topology"),
    path("jobs/", job_views.job_list_page, name="job-list"),
    path("jobs/new/", job_views.job_new_page, name="job-new"),
    path("jobs/<uuid:job_id>/", job_views.job_detail_page, name="job-detail"),
    path("jobs/<uuid:job_id>/status/", job_views.job_status_partial, name="job-status"),
    path("jobs/<uuid:job_id>/cancel/", job_views.job_cancel_action, name="job-cancel"),
    path(
        "jobs/<uuid:job_id>/resume/<int:checkpoint_id>/",
        job_views.job_resume_action,
        name="job-resume",
    ),
    path("drills/", drill_views.drill_list_page, name="drill-list"),
    path("drills/<uuid:drill_id>/", drill_views.drill_detail_page, name="drill-detail"),
    path("drills/<uuid:drill_id>/status/", drill_views.drill_status_partial, name="drill-status"),
    path("drills/<uuid:drill_id>/cancel/", drill_views.drill_cancel_action, name="drill-cancel"),
    path(
        "jobs/<uuid:job_id>/checkpoints/<int:step>/",
        drill_views.checkpoint_page,
        name="checkpoint",
    ),
    path(
        "checkpoints/<int:checkpoint_id>/drill/",
        drill_views.checkpoint_drill_action,
        name="checkpoint-drill",
    ),
    path(
        "checkpoints/<int:checkpoint_id>/verify/",
        drill_views.checkpoint_verify_action,
        name="checkpoint-verify",
    ),
    path(
        "clusters/<int:cluster_id>/drill-policy/",
        drill_views.drill_policy_action,
        name="drill-policy",
    ),
    path(
        "accounts/login/",
        RateLimitedLoginView.as_view(),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("studies/", include("studies.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include((api_v1, "api"), namespace="api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]

handler400 = "controlplane.errors.handler400"
handler403 = "controlplane.errors.handler403"
handler404 = "controlplane.errors.handler404"
handler500 = "controlplane.errors.handler500"
