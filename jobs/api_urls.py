"""API of jobs, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs import api, api_job_actions, api_templates, list_api

urlpatterns: list[URLPattern] = [
    path("jobs/", list_api.JobListApi.as_view(), name="job-list"),
    path("jobs/submit/", api.JobSubmitApi.as_view(), name="job-submit"),
    path("jobs/preview/", api.JobPreviewApi.as_view(), name="job-preview"),
    path("jobs/<uuid:job_id>/", api.JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<uuid:job_id>/cancel/", api.JobCancelApi.as_view(), name="job-cancel"),
    path("jobs/<uuid:job_id>/resume/", api.JobResumeApi.as_view(), name="job-resume"),
    path("jobs/<uuid:job_id>/metrics/", api.JobMetricsApi.as_view(), name="job-metrics"),
    path(
        "jobs/<uuid:job_id>/checkpoints/", api.JobCheckpointsApi.as_view(), name="job-checkpoints"
    ),
    path("jobs/<uuid:job_id>/logs/", api.JobLogsApi.as_view(), name="job-logs"),
    path("jobs/<uuid:job_id>/events/", api.JobEventsApi.as_view(), name="job-events"),
    path("jobs/<uuid:job_id>/hold/", api_job_actions.JobHoldApi.as_view(), name="job-hold"),
    path(
        "jobs/<uuid:job_id>/release/", api_job_actions.JobReleaseApi.as_view(), name="job-release"
    ),
    path(
        "jobs/<uuid:job_id>/run-again/",
        api_job_actions.JobRunAgainApi.as_view(),
        name="job-run-again",
    ),
    path(
        "jobs/<uuid:job_id>/save-template/",
        api_job_actions.JobSaveTemplateApi.as_view(),
        name="job-save-template",
    ),
    path("jobs/<uuid:job_id>/output/", api_job_actions.JobOutputApi.as_view(), name="job-output"),
    path(
        "jobs/<uuid:job_id>/output/ranks/",
        api_job_actions.JobRankOutputsApi.as_view(),
        name="job-rank-outputs",
    ),
    path(
        "jobs/<uuid:job_id>/output/ranks/<int:rank>/",
        api_job_actions.JobRankOutputApi.as_view(),
        name="job-rank-output",
    ),
    path("job-templates/", api_templates.JobTemplateListApi.as_view(), name="job-template-list"),
    path(
        "job-templates/create/",
        api_templates.JobTemplateCreateApi.as_view(),
        name="job-template-create",
    ),
    path(
        "job-templates/<int:template_id>/",
        api_templates.JobTemplateDetailApi.as_view(),
        name="job-template-detail",
    ),
    path(
        "job-templates/<int:template_id>/update/",
        api_templates.JobTemplateUpdateApi.as_view(),
        name="job-template-update",
    ),
    path(
        "job-templates/<int:template_id>/delete/",
        api_templates.JobTemplateDeleteApi.as_view(),
        name="job-template-delete",
    ),
    path(
        "job-templates/<int:template_id>/submit/",
        api_templates.JobTemplateSubmitApi.as_view(),
        name="job-template-submit",
    ),
    path("trainer/presets/", api.TrainerPresetsApi.as_view(), name="trainer-presets"),
]
