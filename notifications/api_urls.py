"""API of notifications, under /api/v1/notifications/."""

from __future__ import annotations

from django.urls import URLPattern, path

from notifications import api

urlpatterns: list[URLPattern] = [
    path(
        "notifications/subscriptions/",
        api.SubscriptionListApi.as_view(),
        name="notification-subscription-list",
    ),
    path(
        "notifications/subscriptions/create/",
        api.SubscriptionCreateApi.as_view(),
        name="notification-subscription-create",
    ),
    path(
        "notifications/subscriptions/<int:subscription_id>/",
        api.SubscriptionDetailApi.as_view(),
        name="notification-subscription-detail",
    ),
    path(
        "notifications/subscriptions/<int:subscription_id>/remove/",
        api.SubscriptionRemoveApi.as_view(),
        name="notification-subscription-remove",
    ),
    path(
        "notifications/subscriptions/<int:subscription_id>/deliveries/",
        api.SubscriptionDeliveriesApi.as_view(),
        name="notification-subscription-deliveries",
    ),
]
