"""Reads of notifications: a person's own subscriptions and their delivery log."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404

from core.types import User
from notifications.models import Delivery, Subscription


def subscription_list_for_user(*, user: User) -> QuerySet[Subscription]:
    """A person's own subscriptions, newest first, removed ones included. Nobody lists
    anyone else's here, operators included (they have the admin)."""
    if not getattr(user, "is_authenticated", False):
        return Subscription.objects.none()
    return Subscription.objects.filter(user_id=user.pk).select_related("cluster")


def subscription_get_for_user(*, user: User, subscription_id: Any) -> Subscription:
    """The one access check for a subscription: Http404 both for a missing one and for
    someone else's."""
    try:
        return subscription_list_for_user(user=user).get(pk=int(subscription_id))
    except (Subscription.DoesNotExist, ValueError, TypeError):
        raise Http404("No such subscription.") from None


def delivery_list_for_user(*, user: User) -> QuerySet[Delivery]:
    """Deliveries to a person's own subscriptions, newest first."""
    return (
        Delivery.objects.filter(subscription__in=subscription_list_for_user(user=user))
        .select_related("event", "subscription")
        .order_by("-created_at", "-id")
    )
