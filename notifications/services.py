"""Writes of notifications: subscribing and unsubscribing, audited.

A webhook's signing secret is made here and returned once to the caller that shows it; it
is stored encrypted (``notifications.signing``) and never put in an audit event or a log.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.audit import AuditAction, audit_event_record
from core.errors import FieldError
from core.roles import is_operator, is_researcher
from core.types import User
from nodes.models import Cluster
from notifications import signing
from notifications.addresses import AddressRefused, webhook_url_check
from notifications.models import Subscription
from notifications.selectors import subscription_get_for_user
from notifications.topics import OPERATOR_TOPICS, Topic

NAME_MAX_LENGTH = 64
URL_MAX_LENGTH = 2048
# Enough for every person; a script creating subscriptions in a loop is stopped here.
MAX_ACTIVE_PER_USER = 50


def email_enabled() -> bool:
    """Email is off where no mail server is configured (production without
    ``GANTRY_EMAIL_HOST``): a subscription by email would never arrive."""
    return settings.EMAIL_BACKEND != "django.core.mail.backends.dummy.EmailBackend"


def _check_topics(*, user: User, topics: list[str]) -> list[str]:
    if not topics:
        raise FieldError("topics", "choose at least one topic")
    unknown = sorted(set(topics) - set(Topic.values))
    if unknown:
        raise FieldError(
            "topics", f"unknown topic {unknown[0]!r}; one of {', '.join(Topic.values)}"
        )
    operator_only = sorted(set(topics) & OPERATOR_TOPICS)
    if operator_only and not is_operator(user):
        raise FieldError("topics", f"{operator_only[0]} is for operators")
    return sorted(set(topics))


def _check_channel(*, user: User, channel: str, url: str) -> str:
    if channel == Subscription.Channel.EMAIL:
        if url:
            raise FieldError("url", "only webhooks have a URL")
        if not email_enabled():
            raise FieldError(
                "channel", "email is not configured on this Gantry (GANTRY_EMAIL_HOST)"
            )
        if not (getattr(user, "email", "") or "").strip():
            raise FieldError("channel", "your account has no email address; ask an operator")
        return ""
    if channel != Subscription.Channel.WEBHOOK:
        raise FieldError("channel", "email or webhook")
    url = url.strip()
    if not url:
        raise FieldError("url", "a webhook needs a URL")
    if len(url) > URL_MAX_LENGTH:
        raise FieldError("url", f"at most {URL_MAX_LENGTH} characters")
    try:
        webhook_url_check(url)
    except AddressRefused as error:
        raise FieldError("url", str(error)) from None
    return url


def subscription_create(
    *,
    user: User,
    name: str,
    channel: str,
    topics: list[str],
    url: str = "",
    cluster: Cluster | None = None,
) -> tuple[Subscription, str | None]:
    """A new subscription of ``user``'s; for a webhook, also its signing secret, which
    exists only in the return value: show it once and drop it."""
    if not is_researcher(user):
        raise FieldError("user", "only researchers and operators receive notifications")
    name = (name or "").strip()
    if not name:
        raise FieldError("name", "a name is required, e.g. where the notifications go")
    if len(name) > NAME_MAX_LENGTH:
        raise FieldError("name", f"at most {NAME_MAX_LENGTH} characters")
    topics = _check_topics(user=user, topics=list(topics))
    url = _check_channel(user=user, channel=channel, url=url or "")
    if cluster is not None and not set(topics) & OPERATOR_TOPICS:
        raise FieldError("cluster", "a cluster narrows the operators' cluster topics only")
    secret = signing.secret_new() if channel == Subscription.Channel.WEBHOOK else None
    with transaction.atomic():
        active = Subscription.objects.filter(user_id=user.pk, removed_at__isnull=True).count()
        if active >= MAX_ACTIVE_PER_USER:
            raise FieldError("name", f"at most {MAX_ACTIVE_PER_USER} subscriptions; remove one")
        subscription = Subscription.objects.create(
            user=user,
            name=name,
            channel=channel,
            url=url,
            secret_encrypted=signing.secret_encrypt(secret) if secret else "",
            secret_prefix=secret[: signing.SHOWN_PREFIX_LENGTH] if secret else "",
            topics=topics,
            cluster=cluster,
        )
        audit_event_record(
            actor=user,
            action=AuditAction.NOTIFICATION_SUBSCRIBE,
            target=subscription,
            details={
                "name": name,
                "channel": channel,
                "url": url,
                "topics": topics,
                "cluster": cluster.name if cluster else None,
            },
        )
    return subscription, secret


def subscription_remove(*, user: User, subscription_id: Any) -> Subscription:
    """Remove one of ``user``'s own subscriptions (someone else's is not found): nothing is
    sent to it any more; it stays, with its delivery log. Removing twice changes nothing."""
    subscription = subscription_get_for_user(user=user, subscription_id=subscription_id)
    now = timezone.now()
    with transaction.atomic():
        if not Subscription.objects.filter(pk=subscription.pk, removed_at__isnull=True).update(
            removed_at=now
        ):
            subscription.refresh_from_db(fields=["removed_at"])
            return subscription
        subscription.removed_at = now
        audit_event_record(
            actor=user,
            action=AuditAction.NOTIFICATION_UNSUBSCRIBE,
            target=subscription,
            details={"name": subscription.name, "channel": subscription.channel},
        )
    return subscription
