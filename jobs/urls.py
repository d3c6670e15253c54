"""Pages of jobs."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs.views import actions, compose, pages, templates

urlpatterns: list[URLPattern] = [
    path("jobs/", pages.job_list_page, name="job-list"),
    path("jobs/new/", compose.job_new_page, name="job-new"),
    path("jobs/new/check/", compose.job_compose_check, name="job-compose-check"),
    path("jobs/templates/", templates.job_template_list_page, name="job-template-list"),
    path(
        "jobs/templates/<int:template_id>/submit/",
        templates.job_template_submit_action,
        name="job-template-submit",
    ),
    path(
        "jobs/templates/<int:template_id>/share/",
        templates.job_template_share_action,
        name="job-template-share",
    ),
    path(
        "jobs/templates/<int:template_id>/delete/",
        templates.job_template_delete_action,
        name="job-template-delete",
    ),
    path("jobs/<uuid:job_id>/", pages.job_detail_page, name="job-detail"),
    path("jobs/<uuid:job_id>/status/", pages.job_status_partial, name="job-status"),
    path("jobs/<uuid:job_id>/cancel/", pages.job_cancel_action, name="job-cancel"),
    path("jobs/<uuid:job_id>/hold/", actions.job_hold_action, name="job-hold"),
    path("jobs/<uuid:job_id>/release/", actions.job_release_action, name="job-release"),
    path("jobs/<uuid:job_id>/output/", actions.job_output_download, name="job-output"),
    path(
        "jobs/<uuid:job_id>/output/rank/<int:rank>/",
        actions.job_output_download,
        name="job-rank-output",
    ),
    path(
        "jobs/<uuid:job_id>/save-template/",
        templates.job_save_template_action,
        name="job-save-template",
    ),
    path(
        "jobs/<uuid:job_id>/resume/<int:checkpoint_id>/",
        pages.job_resume_action,
        name="job-resume",
    ),
]
