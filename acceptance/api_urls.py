"""API of acceptance, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from acceptance import api

urlpatterns: list[URLPattern] = [
    path("acceptance/runs/", api.AcceptanceRunListApi.as_view(), name="acceptance-run-list"),
    path(
        "acceptance/runs/start/", api.AcceptanceRunStartApi.as_view(), name="acceptance-run-start"
    ),
    path(
        "acceptance/runs/<uuid:run_id>/",
        api.AcceptanceRunDetailApi.as_view(),
        name="acceptance-run-detail",
    ),
    path(
        "acceptance/runs/<uuid:run_id>/cancel/",
        api.AcceptanceRunCancelApi.as_view(),
        name="acceptance-run-cancel",
    ),
    path(
        "acceptance/runs/<uuid:run_id>/certificate/",
        api.CertificateApi.as_view(),
        name="acceptance-certificate",
    ),
]
