"""Pages of one's own account: notifications (under /account/notifications/)."""

from __future__ import annotations

from django.urls import URLPattern, path

from notifications import views

urlpatterns: list[URLPattern] = [
    path("", views.subscription_list_page, name="notification-subscription-list"),
    path("remove/", views.subscription_remove_action, name="notification-subscription-remove"),
]
