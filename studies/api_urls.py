"""API of scaling studies, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from studies import api

urlpatterns: list[URLPattern] = [
    path("studies/", api.StudyListCreateApi.as_view(), name="study-list"),
    path("studies/<int:study_id>/", api.StudyDetailApi.as_view(), name="study-detail"),
]
