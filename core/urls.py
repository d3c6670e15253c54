"""Pages of the core: signing in and out, and one's own account."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import URLPattern, path

from core import views
from core.ratelimit import RateLimitedLoginView

urlpatterns: list[URLPattern] = [
    path("account/tokens/", views.api_token_list_page, name="api-token-list"),
    path("account/tokens/revoke/", views.api_token_revoke_action, name="api-token-revoke"),
    path("accounts/login/", RateLimitedLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
]
