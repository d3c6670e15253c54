"""Pages of jobs."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs import views

urlpatterns: list[URLPattern] = [
    path("jobs/", views.job_list_page, name="job-list"),
    path("jobs/new/", views.job_new_page, name="job-new"),
    path("jobs/<uuid:job_id>/", views.job_detail_page, name="job-detail"),
    path("jobs/<uuid:job_id>/status/", views.job_status_partial, name="job-status"),
    path("jobs/<uuid:job_id>/cancel/", views.job_cancel_action, name="job-cancel"),
    path(
        "jobs/<uuid:job_id>/resume/<int:checkpoint_id>/",
        views.job_resume_action,
        name="job-resume",
    ),
]
