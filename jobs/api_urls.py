"""API of jobs, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs import api

urlpatterns: list[URLPattern] = [
    path("jobs/", api.JobListApi.as_view(), name="job-list"),
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
    path("trainer/presets/", api.TrainerPresetsApi.as_view(), name="trainer-presets"),
]
