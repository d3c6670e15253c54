"""Celery tasks for notifications: thin, ids in, one service call each."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from controlplane.tasknames import NOTIFICATION_DELIVER, NOTIFICATIONS_COLLECT
from notifications.delivery import delivery_send, send_limits
from notifications.outbox import notifications_collect

# A retry later than this is left to the collector's sweep (it runs every few seconds):
# Redis redelivers ETA tasks that wait longer than its visibility timeout.
MAX_COUNTDOWN_SECONDS = 300
# The same limits the send lease is derived from (notifications.delivery.send_limits).
SEND_LIMITS = send_limits()


@shared_task(name=NOTIFICATIONS_COLLECT, time_limit=60, soft_time_limit=50)
def notifications_collect_task() -> str:
    """Beat: events from what happened, deliveries for them, enqueued after commit.
    Never sends anything itself."""
    result = notifications_collect()
    return f"{result.events} events, {result.deliveries} deliveries, {result.swept} swept"


@shared_task(
    bind=True,
    name=NOTIFICATION_DELIVER,
    acks_late=True,
    max_retries=None,
    time_limit=SEND_LIMITS.time_limit,
    soft_time_limit=SEND_LIMITS.soft_time_limit,
)
def notification_deliver_task(self: Any, delivery_id: int) -> str:
    """Send one delivery. Idempotent: the service claims it with a conditional update, so a
    redelivered or duplicated task sends nothing a second time. A failed attempt (a timed-out
    one too: the service catches the soft time limit) is retried with the service's back-off.
    Routed to the notifications queue (CELERY_TASK_ROUTES)."""
    sent = delivery_send(delivery_id=delivery_id)
    if sent.retry_in is not None and sent.retry_in <= MAX_COUNTDOWN_SECONDS:
        raise self.retry(countdown=max(0.0, sent.retry_in))
    return sent.outcome
