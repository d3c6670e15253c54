"""API of the core: who you are, the audit log."""

from __future__ import annotations

from django.urls import URLPattern, path

from core.api_views import AuditEventListApi, MeApi

urlpatterns: list[URLPattern] = [
    path("me/", MeApi.as_view(), name="me"),
    path("audit-events/", AuditEventListApi.as_view(), name="audit-event-list"),
]
