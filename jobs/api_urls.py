"""API of jobs, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs.api import actions, job_list, jobs, templates

urlpatterns: list[URLPattern] = [
    path("jobs/", job_list.JobListApi.as_view(), name="job-list"),
    path("jobs/submit/", jobs.JobSubmitApi.as_view(), name="job-submit"),
    path("jobs/preview/", jobs.JobPreviewApi.as_view(), name="job-preview"),
    path("jobs/<uuid:job_id>/", jobs.JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<uuid:job_id>/cancel/", jobs.JobCancelApi.as_view(), name="job-cancel"),
    path("jobs/<uuid:job_id>/resume/", jobs.JobResumeApi.as_view(), name="job-resume"),
    path("jobs/<uuid:job_id>/metrics/", jobs.JobMetricsApi.as_view(), name="job-metrics"),
    path(
        "jobs/<uuid:job_id>/checkpoints/", jobs.JobCheckpointsApi.as_view(), name="job-checkpoints"
    ),
    path("jobs/<uuid:job_id>/logs/", jobs.JobLogsApi.as_view(), name="job-logs"),
    path("jobs/<uuid:job_id>/events/", jobs.JobEventsApi.as_view(), name="job-events"),
    path("jobs/<uuid:job_id>/hold/", actions.JobHoldApi.as_view(), name="job-hold"),
    path("jobs/<uuid:job_id>/release/", actions.JobReleaseApi.as_view(), name="job-release"),
    path(
        "jobs/<uuid:job_id>/run-again/",
        actions.JobRunAgainApi.as_view(),
        name="job-run-again",
    ),
    path(
        "jobs/<uuid:job_id>/save-template/",
        actions.JobSaveTemplateApi.as_view(),
        name="job-save-template",
    ),
    path("jobs/<uuid:job_id>/output/", actions.JobOutputApi.as_view(), name="job-output"),
    path(
        "jobs/<uuid:job_id>/output/ranks/",
        actions.JobRankOutputsApi.as_view(),
        name="job-rank-outputs",
    ),
    path(
        "jobs/<uuid:job_id>/output/ranks/<int:rank>/",
        actions.JobRankOutputApi.as_view(),
        name="job-rank-output",
    ),
    path("job-templates/", templates.JobTemplateListApi.as_view(), name="job-template-list"),
    path(
        "job-templates/create/",
        templates.JobTemplateCreateApi.as_view(),
        name="job-template-create",
    ),
    path(
        "job-templates/<int:template_id>/",
        templates.JobTemplateDetailApi.as_view(),
        name="job-template-detail",
    ),
    path(
        "job-templates/<int:template_id>/update/",
        templates.JobTemplateUpdateApi.as_view(),
        name="job-template-update",
    ),
    path(
        "job-templates/<int:template_id>/delete/",
        templates.JobTemplateDeleteApi.as_view(),
        name="job-template-delete",
    ),
    path(
        "job-templates/<int:template_id>/submit/",
        templates.JobTemplateSubmitApi.as_view(),
        name="job-template-submit",
    ),
    path("trainer/presets/", jobs.TrainerPresetsApi.as_view(), name="trainer-presets"),
]
