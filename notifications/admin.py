"""The delivery log in the admin: every attempt of every delivery (status code, error,
duration), the events and the subscriptions. Read-only: people manage their own
subscriptions at /account/notifications/; the signing secret is never shown."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from core.admin_helpers import admin_link
from notifications.models import Delivery, DeliveryAttempt, Event, Subscription

# secret_encrypted is left out on purpose: not even operators see the signing secret.
SUBSCRIPTION_FIELDS = (
    "user",
    "name",
    "channel",
    "url",
    "secret_prefix",
    "topics",
    "cluster",
    "created_at",
    "removed_at",
    "consecutive_failures",
    "paused_until",
)

EVENT_FIELDS = (
    "id",
    "kind",
    "title",
    "occurred_at",
    "created_at",
    "source_key",
    "cluster",
    "owner",
    "requester",
    "data",
)

DELIVERY_FIELDS = (
    "event",
    "subscription",
    "state",
    "attempts",
    "next_attempt_at",
    "lease_until",
    "delivered_at",
    "last_error",
    "created_at",
    "updated_at",
)

ATTEMPT_FIELDS = ("number", "started_at", "duration_ms", "ok", "status_code", "error", "address")


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    fields = ATTEMPT_FIELDS
    readonly_fields = ATTEMPT_FIELDS
    max_num = 0

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = ["name", "user", "channel", "url", "topic_list", "cluster", "removed_at"]
    list_filter = ["channel", "cluster"]
    search_fields = ["name", "user__username", "url"]
    list_select_related = ["user", "cluster"]
    fields = SUBSCRIPTION_FIELDS
    readonly_fields = SUBSCRIPTION_FIELDS

    @admin.display(description="topics")
    def topic_list(self, obj: Subscription) -> str:
        return ", ".join(obj.topics or [])


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["occurred_at", "kind", "title", "cluster", "id"]
    list_filter = ["kind", "cluster"]
    search_fields = ["title", "source_key", "id"]
    date_hierarchy = "occurred_at"
    list_select_related = ["cluster"]
    fields = EVENT_FIELDS
    readonly_fields = EVENT_FIELDS


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = [
        "created_at",
        "event_link",
        "subscription_link",
        "state",
        "attempts",
        "next_attempt_at",
        "delivered_at",
        "last_error",
    ]
    list_filter = ["state", "subscription__channel"]
    search_fields = ["event__title", "subscription__name", "subscription__user__username"]
    list_select_related = ["event", "subscription", "subscription__user"]
    fields = DELIVERY_FIELDS
    readonly_fields = DELIVERY_FIELDS
    inlines = [DeliveryAttemptInline]

    @admin.display(description="event", ordering="event__occurred_at")
    def event_link(self, obj: Delivery) -> str:
        return admin_link(obj.event, obj.event.title)

    @admin.display(description="subscription")
    def subscription_link(self, obj: Delivery) -> str:
        return admin_link(obj.subscription, str(obj.subscription))
