"""Pages of acceptance."""

from __future__ import annotations

from django.urls import URLPattern, path

from acceptance import views

urlpatterns: list[URLPattern] = [
    path("acceptance/", views.acceptance_list, name="acceptance-list"),
    path("acceptance/start/", views.acceptance_start_action, name="acceptance-start"),
    path("acceptance/<uuid:run_id>/", views.acceptance_detail, name="acceptance-detail"),
    path(
        "acceptance/<uuid:run_id>/cancel/",
        views.acceptance_cancel_action,
        name="acceptance-cancel",
    ),
    path(
        "acceptance/<uuid:run_id>/certificate.json",
        views.certificate_download,
        name="acceptance-certificate-download",
    ),
]
