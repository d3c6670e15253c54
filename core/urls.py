"""Pages of one's own account."""

from __future__ import annotations

from django.urls import URLPattern, path

from core import views

urlpatterns: list[URLPattern] = [
    path("tokens/", views.api_token_list_page, name="api-token-list"),
    path("tokens/revoke/", views.api_token_revoke_action, name="api-token-revoke"),
]
