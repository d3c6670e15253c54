"""Notifications: subscriptions, the events Gantry tells people about, and every delivery.

An outbox: a periodic task (``notifications.services.notifications_collect``) reads what
happened from the tables that already record it (job and node events, drill verdicts, the
work-at-risk breaches) after a stored cursor and writes one ``Event`` per happening; the
apps that write those tables know nothing of notifications. Each event makes at most one
``Delivery`` per subscription (a unique constraint), sent by a Celery task and logged per
attempt (``DeliveryAttempt``).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from nodes.models import Cluster
from notifications.topics import EventKind


class Subscription(models.Model):
    """A person's wish to hear about some topics, by email or by a signed webhook."""

    class Channel(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="notification_subscriptions",
    )
    name = models.CharField(max_length=64)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    # Webhooks only. Checked when saved and again, after DNS resolution, at every send.
    url = models.URLField("webhook URL", max_length=2048, blank=True)
    # The webhook's signing secret, encrypted with a key derived from SECRET_KEY
    # (``notifications.signing``): it must be readable to sign, and it is shown only once,
    # when the subscription is created. Never in a page, a log or an API answer after that.
    secret_encrypted = models.TextField(blank=True)
    # The first characters of the secret, so a person can tell which one a receiver holds.
    secret_prefix = models.CharField(max_length=16, blank=True)
    topics = models.JSONField(default=list, help_text="notifications.topics.Topic values")
    # Operators' cluster topics for one cluster only; empty: every cluster.
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Removed by its owner: kept, with its delivery log, but never sent to again.
    removed_at = models.DateTimeField(null=True, blank=True)
    # A failing endpoint is paused, so that many events do not all wait on it.
    consecutive_failures = models.PositiveIntegerField(default=0)
    paused_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["removed_at"], name="subscription_removed")]

    def __str__(self) -> str:
        return f"{self.name} ({self.channel})"

    @property
    def is_active(self) -> bool:
        return self.removed_at is None


class Event(models.Model):
    """One happening worth telling: its id is what receivers deduplicate on."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    # Where it came from (``jobevent:…``, ``drill:…``, ``nodeevent:…``, ``breach:…``): the
    # collector reads a window that overlaps the last one, and this keeps each happening one.
    source_key = models.CharField(max_length=128, unique=True)
    occurred_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The job's owner, and who started the drill: who the user topics go to.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requester = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    title = models.CharField(max_length=255)
    data = models.JSONField(default=dict)

    class Meta:
        ordering = ["-occurred_at", "-created_at"]
        indexes = [models.Index(fields=["kind", "-occurred_at"], name="event_kind_occurred")]

    def __str__(self) -> str:
        return f"{self.kind}: {self.title}"


class Delivery(models.Model):
    """One event to one subscription: made once (unique), sent until it succeeds or the
    attempts run out. A delivered one is never sent again."""

    class State(models.TextChoices):
        PENDING = "pending", "pending (waiting for its next attempt)"
        SENDING = "sending"
        DELIVERED = "delivered"
        FAILED = "failed", "failed (attempts exhausted)"
        SKIPPED = "skipped", "skipped (subscription removed or no longer allowed)"

    subscription = models.ForeignKey(
        Subscription, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    # While a task sends it, no other may; a task that died leaves it claimable after this.
    lease_until = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=512, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["subscription", "event"], name="delivery_one_per_subscription_event"
            )
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="delivery_due")]

    def __str__(self) -> str:
        return f"{self.event} → {self.subscription} ({self.state})"


class DeliveryAttempt(models.Model):
    """One try to send a delivery: what the endpoint answered, or why it could not."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField(default=0)
    ok = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=512, blank=True)
    # The address the webhook was sent to, after the checks (empty for email).
    address = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["delivery", "number"]

    def __str__(self) -> str:
        outcome = "ok" if self.ok else (self.error or f"HTTP {self.status_code}")
        return f"attempt {self.number}: {outcome}"


class Cursor(models.Model):
    """How far the collector has read the event tables (it re-reads an overlap): the time
    of its last run and the newest ids of the job and node event tables then."""

    name = models.CharField(max_length=32, unique=True)
    position = models.DateTimeField()
    job_event_id = models.BigIntegerField(default=0)
    node_event_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} at {self.position:%Y-%m-%d %H:%M:%S}"
