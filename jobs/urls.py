"""Pages of jobs."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs import views, views_actions, views_compose, views_templates

urlpatterns: list[URLPattern] = [
    path("jobs/", views.job_list_page, name="job-list"),
    path("jobs/new/", views_compose.job_new_page, name="job-new"),
    path("jobs/new/check/", views_compose.job_compose_check, name="job-compose-check"),
    path("jobs/templates/", views_templates.job_template_list_page, name="job-template-list"),
    path(
        "jobs/templates/<int:template_id>/submit/",
        views_templates.job_template_submit_action,
        name="job-template-submit",
    ),
    path(
        "jobs/templates/<int:template_id>/share/",
        views_templates.job_template_share_action,
        name="job-template-share",
    ),
    path(
        "jobs/templates/<int:template_id>/delete/",
        views_templates.job_template_delete_action,
        name="job-template-delete",
    ),
    path("jobs/<uuid:job_id>/", views.job_detail_page, name="job-detail"),
    path("jobs/<uuid:job_id>/status/", views.job_status_partial, name="job-status"),
    path("jobs/<uuid:job_id>/cancel/", views.job_cancel_action, name="job-cancel"),
    path("jobs/<uuid:job_id>/hold/", views_actions.job_hold_action, name="job-hold"),
    path("jobs/<uuid:job_id>/release/", views_actions.job_release_action, name="job-release"),
    path("jobs/<uuid:job_id>/output/", views_actions.job_output_download, name="job-output"),
    path(
        "jobs/<uuid:job_id>/output/rank/<int:rank>/",
        views_actions.job_output_download,
        name="job-rank-output",
    ),
    path(
        "jobs/<uuid:job_id>/save-template/",
        views_templates.job_save_template_action,
        name="job-save-template",
    ),
    path(
        "jobs/<uuid:job_id>/resume/<int:checkpoint_id>/",
        views.job_resume_action,
        name="job-resume",
    ),
]
