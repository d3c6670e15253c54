"""API of scaling studies, under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
