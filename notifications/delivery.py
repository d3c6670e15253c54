"""Sending one delivery: claim it, check it is still wanted, send, log the attempt.

Accepts a delivery that is pending and due, or one whose sender died (its lease ran out).
Safe to re-run and to run twice at once: the claim is a conditional update, so only one
task sends, and a delivered one is never claimed again. The one way to send twice is a
worker dying after the endpoint got the POST and before the outcome was saved: receivers
drop the second copy by ``X-Gantry-Event-Id``.

A failure is retried with back-off (``GANTRY_NOTIFY_RETRY_BASE`` doubling, at most an hour)
until ``GANTRY_NOTIFY_MAX_ATTEMPTS``; a failing subscription is paused for the same back-off,
so that a dead endpoint costs one short attempt per back-off, not one per event. A send that
times out (the POST's deadline, or the task's soft time limit) is such a failure, logged as
an attempt like any other.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.mail import send_mail
from django.db.models import F
from django.utils import timezone

from core.roles import is_operator, is_researcher
from notifications import signing, webhook
from notifications.addresses import AddressRefused, target_of
from notifications.models import Delivery, DeliveryAttempt, Event, Subscription
from notifications.outbox import ENQUEUED_LEASE, audience
from notifications.topics import Subscriber, subscription_wants

MAX_BACKOFF_SECONDS = 3600
# A Celery task may fire a little early by the database's clock.
EARLY_TOLERANCE = timedelta(seconds=1)
# Beyond the send itself, the task's soft limit leaves this for the database work around
# it; the hard limit this much more for logging a timed-out attempt; the lease this much
# more than the hard limit.
SEND_SOFT_MARGIN_SECONDS = 20
SEND_HARD_MARGIN_SECONDS = 10
SEND_LEASE_MARGIN_SECONDS = 30
# SMTP exchanges several commands, each bounded by GANTRY_EMAIL_TIMEOUT.
EMAIL_TIMEOUTS_PER_SEND = 3


@dataclass(frozen=True)
class SendLimits:
    """The deliver task's time limits and the lease a send holds, derived from the send's
    own bounds in this one place, so that they cannot drift apart: the lease outlasts the
    hard time limit, and no second worker claims a delivery whose sender may still run."""

    soft_time_limit: int
    time_limit: int
    lease: timedelta


def send_limits() -> SendLimits:
    longest_send = max(
        float(settings.WEBHOOK_DEADLINE_SECONDS),
        float(EMAIL_TIMEOUTS_PER_SEND * settings.EMAIL_TIMEOUT),
    )
    soft = math.ceil(longest_send) + SEND_SOFT_MARGIN_SECONDS
    hard = soft + SEND_HARD_MARGIN_SECONDS
    return SendLimits(
        soft_time_limit=soft,
        time_limit=hard,
        lease=timedelta(seconds=hard + SEND_LEASE_MARGIN_SECONDS),
    )


@dataclass(frozen=True)
class SendOutcome:
    outcome: str
    # Seconds until the delivery should be tried again; None: nothing more to do now.
    retry_in: float | None = None


def backoff_seconds(failures: int) -> float:
    base = float(settings.NOTIFY_RETRY_BASE_SECONDS)
    return min(base * 2 ** max(0, failures - 1), float(MAX_BACKOFF_SECONDS))


def _still_wanted(subscription: Subscription, event: Event) -> str:
    """Why this delivery must not be sent any more ("" when it may)."""
    user = subscription.user
    if subscription.removed_at is not None:
        return "the subscription was removed"
    if not user.is_active or not is_researcher(user):
        return "its owner is inactive or has no role any more"
    subscriber = Subscriber(
        user_id=user.pk,
        is_operator=is_operator(user),
        topics=frozenset(subscription.topics or []),
        cluster_id=subscription.cluster_id,
    )
    if not subscription_wants(subscriber, audience(event)):
        return "its owner may no longer receive this event"
    return ""


def webhook_body(delivery: Delivery, *, sent_at: int) -> bytes:
    event = delivery.event
    payload = {
        "id": str(event.id),
        "kind": event.kind,
        "title": event.title,
        "occurred_at": event.occurred_at.isoformat(),
        "data": event.data,
        "delivery": delivery.pk,
        "attempt": delivery.attempts,
        "sent_at": sent_at,
    }
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def _send_webhook(delivery: Delivery) -> webhook.PostResult:
    subscription = delivery.subscription
    try:
        target = target_of(subscription.url)
        secret = signing.secret_decrypt(subscription.secret_encrypted)
    except (AddressRefused, signing.SecretUnreadable) as error:
        return webhook.PostResult(False, None, str(error)[:500], 0, "")
    sent_at = int(time.time())
    body = webhook_body(delivery, sent_at=sent_at)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Gantry-Webhook/1",
        "X-Gantry-Event": delivery.event.kind,
        "X-Gantry-Event-Id": str(delivery.event_id),
        "X-Gantry-Delivery": str(delivery.pk),
        "X-Gantry-Timestamp": str(sent_at),
        signing.SIGNATURE_HEADER: signing.signature(secret, body),
    }
    return webhook.post(
        target,
        body=body,
        headers=headers,
        timeout=float(settings.WEBHOOK_TIMEOUT_SECONDS),
        deadline=float(settings.WEBHOOK_DEADLINE_SECONDS),
    )


def _email_text(event: Event) -> str:
    lines = [event.title, ""]
    for section, values in (event.data or {}).items():
        if isinstance(values, dict):
            lines.append(f"{section}:")
            lines += [
                f"  {key}: {value}" for key, value in values.items() if value not in ("", None)
            ]
        else:
            lines.append(f"{section}: {values}")
    lines += ["", f"Event {event.id} at {event.occurred_at.isoformat()}.", "— Gantry"]
    return "\n".join(lines)


def _send_email(delivery: Delivery) -> webhook.PostResult:
    started = time.monotonic()
    address = (delivery.subscription.user.email or "").strip()
    if not address:
        return webhook.PostResult(False, None, "the owner has no email address", 0, "")
    try:
        send_mail(
            subject=f"[Gantry] {delivery.event.title}"[:200],
            message=_email_text(delivery.event),
            from_email=settings.DEFAULT_FROM_EMAIL,
            recipient_list=[address],
            fail_silently=False,
        )
    # Any mail failure (SMTP refused, timed out, ...) is a failed attempt, logged.
    except Exception as error:
        duration = int((time.monotonic() - started) * 1000)
        return webhook.PostResult(
            False, None, f"{type(error).__name__}: {error}"[:500], duration, ""
        )
    return webhook.PostResult(True, None, "", int((time.monotonic() - started) * 1000), "")


def _send(delivery: Delivery) -> webhook.PostResult:
    """Send by the subscription's channel; running out of the task's time is a failed
    attempt like any other (logged, counted, and pausing the subscription)."""
    started = time.monotonic()
    try:
        if delivery.subscription.channel == Subscription.Channel.WEBHOOK:
            return _send_webhook(delivery)
        return _send_email(delivery)
    except SoftTimeLimitExceeded:
        seconds = time.monotonic() - started
        why = (
            f"timed out after {seconds:.1f} s: the deliver task's time limit "
            f"({send_limits().soft_time_limit} s) ran out while sending"
        )
        return webhook.PostResult(False, None, why, int(seconds * 1000), "")


def _claim(delivery_id: int, now: datetime) -> bool:
    return bool(
        Delivery.objects.filter(
            pk=delivery_id, state=Delivery.State.PENDING, next_attempt_at__lte=now + EARLY_TOLERANCE
        ).update(
            state=Delivery.State.SENDING,
            lease_until=now + send_limits().lease,
            attempts=F("attempts") + 1,
        )
    )


def _postpone(delivery: Delivery, *, until: datetime, error: str = "") -> None:
    values = {
        "state": Delivery.State.PENDING,
        "next_attempt_at": until,
        "lease_until": until + ENQUEUED_LEASE,
    }
    if error:
        values["last_error"] = error[:512]
    Delivery.objects.filter(pk=delivery.pk, state=Delivery.State.SENDING).update(**values)


def delivery_send(*, delivery_id: int) -> SendOutcome:
    """Send one delivery if it is due (see the module docstring for what it accepts)."""
    now = timezone.now()
    if not _claim(delivery_id, now):
        return SendOutcome("not due, being sent, or done")
    delivery = Delivery.objects.select_related("event", "subscription", "subscription__user").get(
        pk=delivery_id
    )
    subscription = delivery.subscription
    refusal = _still_wanted(subscription, delivery.event)
    if refusal:
        Delivery.objects.filter(pk=delivery.pk).update(
            state=Delivery.State.SKIPPED, lease_until=None, last_error=refusal
        )
        return SendOutcome(f"skipped: {refusal}")
    if subscription.paused_until is not None and subscription.paused_until > now:
        # Not an attempt: the endpoint failed just now for another delivery.
        Delivery.objects.filter(pk=delivery.pk).update(attempts=F("attempts") - 1)
        _postpone(delivery, until=subscription.paused_until)
        return SendOutcome("paused", retry_in=(subscription.paused_until - now).total_seconds())
    started_at = timezone.now()
    result = _send(delivery)
    DeliveryAttempt.objects.create(
        delivery=delivery,
        number=delivery.attempts,
        started_at=started_at,
        duration_ms=result.duration_ms,
        ok=result.ok,
        status_code=result.status_code,
        error=result.error[:512],
        address=result.address[:64],
    )
    return _settle(delivery, result)


def _settle(delivery: Delivery, result: webhook.PostResult) -> SendOutcome:
    now = timezone.now()
    subscription = delivery.subscription
    if result.ok:
        Delivery.objects.filter(pk=delivery.pk, state=Delivery.State.SENDING).update(
            state=Delivery.State.DELIVERED, delivered_at=now, lease_until=None, last_error=""
        )
        Subscription.objects.filter(pk=subscription.pk).update(
            consecutive_failures=0, paused_until=None
        )
        return SendOutcome("delivered")
    failures = subscription.consecutive_failures + 1
    Subscription.objects.filter(pk=subscription.pk).update(
        consecutive_failures=F("consecutive_failures") + 1,
        paused_until=now + timedelta(seconds=backoff_seconds(failures)),
    )
    if delivery.attempts >= settings.NOTIFY_MAX_ATTEMPTS:
        Delivery.objects.filter(pk=delivery.pk, state=Delivery.State.SENDING).update(
            state=Delivery.State.FAILED, lease_until=None, last_error=result.error[:512]
        )
        return SendOutcome(f"failed for good after {delivery.attempts} attempts: {result.error}")
    delay = backoff_seconds(delivery.attempts)
    _postpone(delivery, until=now + timedelta(seconds=delay), error=result.error)
    return SendOutcome(f"attempt {delivery.attempts} failed: {result.error}", retry_in=delay)
