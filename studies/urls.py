"""Pages of scaling studies."""

from __future__ import annotations

from django.urls import URLPattern, path

from studies import views

urlpatterns: list[URLPattern] = [
    path("", views.study_list_page, name="study-list"),
    path("new/", views.study_new_page, name="study-new"),
    path("<int:study_id>/", views.study_detail_page, name="study-detail"),
    path("<int:study_id>/status/", views.study_status_partial, name="study-status"),
    path("<int:study_id>/export.csv", views.study_export_csv, name="study-export-csv"),
]
