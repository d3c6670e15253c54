"""A hostile endpoint that answers one byte every half second, forever: each read succeeds
well inside the per-read timeout, so only the POST's deadline ends it. The send returns by
the deadline, the attempt is logged as timed out, repeated time-outs pause the subscription
and use up the attempts; the task's soft time limit counts as a failed attempt too; and the
send lease outlasts the task's hard time limit, so no second worker sends the same delivery.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import FrameType
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.utils import timezone

from factories import JobFactory
from jobs.models import Job, JobEvent
from notifications import delivery as delivery_module
from notifications.addresses import target_of
from notifications.delivery import SendLimits, delivery_send, send_limits
from notifications.models import Delivery, DeliveryAttempt, Subscription
from notifications.outbox import notifications_collect
from notifications.services import subscription_create
from notifications.tasks import notification_deliver_task
from notifications.topics import Topic
from notifications.webhook import post
from webhook_support import dripping_endpoint

pytestmark = pytest.mark.django_db

# Per read or write: longer than the drip's half second, so it never fires by itself.
OPERATION_TIMEOUT = 2
DEADLINE = 3
# Scheduling, the database writes around the send, a loaded test machine.
SLACK = 1.5


@pytest.fixture
def deadline(loopback_allowed: Any) -> Any:
    loopback_allowed.WEBHOOK_TIMEOUT_SECONDS = OPERATION_TIMEOUT
    loopback_allowed.WEBHOOK_DEADLINE_SECONDS = DEADLINE
    return loopback_allowed


def hook_for(user: Any, url: str) -> Subscription:
    notifications_collect()
    subscription, _ = subscription_create(
        user=user, name="drip", channel="webhook", url=url, topics=[Topic.JOB_ENDED]
    )
    return subscription


def job_ends(owner: Any) -> None:
    job = JobFactory(owner=owner, state=Job.State.COMPLETED, ended_at=timezone.now())
    JobEvent.objects.create(job=job, kind="state", from_state="running", to_state="completed")


def due(delivery: Delivery) -> None:
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    Subscription.objects.filter(pk=delivery.subscription_id).update(paused_until=None)


@pytest.mark.parametrize("mode", ["headers", "body", "tls"])
def test_a_dripping_endpoint_is_cut_off_at_the_deadline(
    researcher: Any, deadline: Any, mode: str
) -> None:
    """Headers that never end, an error body that never ends, a TLS handshake that never
    completes: each send returns by the deadline, and the endpoint sees Gantry hang up."""
    with dripping_endpoint(mode) as endpoint:
        subscription = hook_for(researcher, endpoint.url)
        job_ends(researcher)
        notifications_collect()
        delivery = subscription.deliveries.get()
        started = time.monotonic()
        outcome = delivery_send(delivery_id=delivery.pk).outcome
        took = time.monotonic() - started
        [held] = endpoint.wait_closed(1, timeout=DEADLINE + 5)
    assert took < DEADLINE + SLACK, took
    if mode == "tls":
        # The handshake, in C, gets one per-operation timeout as a whole.
        assert took >= OPERATION_TIMEOUT - 0.2, took
    else:
        # No read ever timed out by itself: the deadline ended it.
        assert took >= DEADLINE - 0.2, took
    # The endpoint notices the hang-up at its next byte (one interval later at most).
    assert held < DEADLINE + SLACK + endpoint.interval, held
    [attempt] = DeliveryAttempt.objects.filter(delivery=delivery)
    assert not attempt.ok and attempt.number == 1
    assert attempt.duration_ms < (DEADLINE + SLACK) * 1000
    if mode == "body":
        # The status came in time: it is the failure; the body's preview is what arrived.
        assert attempt.status_code == 500 and "HTTP 500: slowa" in attempt.error
    else:
        assert attempt.status_code is None
        assert "timed out" in outcome
        assert f"{DEADLINE} s for the whole POST" in attempt.error
    delivery.refresh_from_db()
    assert delivery.state == Delivery.State.PENDING and delivery.attempts == 1


def test_the_post_alone_keeps_its_deadline(loopback_allowed: Any) -> None:
    """webhook.post without the delivery around it: the deadline is its own, per call."""
    with dripping_endpoint("headers", interval=0.2) as endpoint:
        started = time.monotonic()
        result = post(target_of(endpoint.url), body=b"{}", headers={}, timeout=5, deadline=1)
        took = time.monotonic() - started
    assert 0.8 <= took < 1 + SLACK, took
    assert not result.ok and result.address == "127.0.0.1"
    assert result.error.startswith("timed out waiting for the answer after 1.")


def test_repeated_time_outs_pause_the_subscription_and_use_up_the_attempts(
    researcher: Any, deadline: Any
) -> None:
    deadline.WEBHOOK_DEADLINE_SECONDS = 1
    deadline.WEBHOOK_TIMEOUT_SECONDS = 1
    deadline.NOTIFY_RETRY_BASE_SECONDS = 30
    with dripping_endpoint("headers", interval=0.3) as endpoint:
        subscription = hook_for(researcher, endpoint.url)
        job_ends(researcher)
        job_ends(researcher)
        notifications_collect()
        first, second = subscription.deliveries.order_by("id")

        assert "timed out" in delivery_send(delivery_id=first.pk).outcome
        subscription.refresh_from_db()
        assert subscription.consecutive_failures == 1
        assert subscription.paused_until is not None and subscription.paused_until > timezone.now()
        # The other event's delivery waits out the pause without connecting.
        assert delivery_send(delivery_id=second.pk).outcome == "paused"
        assert endpoint.connections == 1

        for _ in range(deadline.NOTIFY_MAX_ATTEMPTS - 1):
            due(first)
            delivery_send(delivery_id=first.pk)
        assert endpoint.connections == deadline.NOTIFY_MAX_ATTEMPTS
    first.refresh_from_db()
    assert first.state == Delivery.State.FAILED
    assert first.attempts == deadline.NOTIFY_MAX_ATTEMPTS
    assert first.last_error.startswith("timed out")
    errors = list(
        DeliveryAttempt.objects.filter(delivery=first).order_by("number").values_list("error")
    )
    assert len(errors) == deadline.NOTIFY_MAX_ATTEMPTS
    assert all(error.startswith("timed out") for (error,) in errors)
    subscription.refresh_from_db()
    assert subscription.consecutive_failures == deadline.NOTIFY_MAX_ATTEMPTS
    due(first)
    assert delivery_send(delivery_id=first.pk).outcome.startswith("not due")


@pytest.fixture
def soft_time_limit_in_one_second() -> Iterator[Callable[[], None]]:
    """Celery's prefork pool raises SoftTimeLimitExceeded from a signal handler, wherever
    the task is; the same here, with SIGALRM, a second after the test arms it (as the task
    starts: what the test does before it, on a busy machine, takes no part of the second)."""

    def raise_soft_limit(signum: int, frame: FrameType | None) -> None:
        raise SoftTimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, raise_soft_limit)
    # pytest-timeout may hold the one real-time timer: it gets back what is left of it.
    started = time.monotonic()
    previous_delay, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    if previous_delay:
        # Until armed, pytest-timeout's own timer runs on.
        signal.setitimer(signal.ITIMER_REAL, previous_delay)

    def arm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 1.0)

    try:
        yield arm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if previous_delay:
            left = previous_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))


def test_the_soft_time_limit_is_a_failed_attempt(
    researcher: Any, deadline: Any, soft_time_limit_in_one_second: Callable[[], None]
) -> None:
    deadline.WEBHOOK_DEADLINE_SECONDS = 30
    with dripping_endpoint("headers", interval=0.2) as endpoint:
        subscription = hook_for(researcher, endpoint.url)
        job_ends(researcher)
        notifications_collect()
        delivery = subscription.deliveries.get()
        started = time.monotonic()
        soft_time_limit_in_one_second()
        sent = delivery_send(delivery_id=delivery.pk)
        took = time.monotonic() - started
    assert took < 1 + SLACK, took
    assert "time limit" in sent.outcome and sent.retry_in is not None
    [attempt] = DeliveryAttempt.objects.filter(delivery=delivery)
    assert not attempt.ok and "the deliver task's time limit" in attempt.error
    delivery.refresh_from_db()
    assert delivery.state == Delivery.State.PENDING and delivery.attempts == 1
    assert "time limit" in delivery.last_error
    subscription.refresh_from_db()
    assert subscription.consecutive_failures == 1 and subscription.paused_until is not None


def test_the_send_lease_outlasts_the_tasks_hard_time_limit(
    researcher: Any, deadline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = send_limits()
    task = notification_deliver_task
    # The task runs under the limits the lease is derived from.
    assert (task.soft_time_limit, task.time_limit) == (limits.soft_time_limit, limits.time_limit)
    assert limits.soft_time_limit > settings.WEBHOOK_DEADLINE_SECONDS
    assert limits.soft_time_limit > 3 * settings.EMAIL_TIMEOUT
    assert task.time_limit > task.soft_time_limit
    assert limits.lease.total_seconds() > task.time_limit
    # The broker redelivers an unacknowledged task only after the task could have ended.
    assert settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] > task.time_limit

    # The lease a real claim takes, seen from inside the send.
    leases: list[timedelta] = []

    def send(delivery: Delivery) -> Any:
        claimed = Delivery.objects.get(pk=delivery.pk)
        assert claimed.state == Delivery.State.SENDING and claimed.lease_until is not None
        leases.append(claimed.lease_until - timezone.now())
        return delivery_module.webhook.PostResult(True, 200, "", 1, "127.0.0.1")

    monkeypatch.setattr(delivery_module, "_send_webhook", send)
    subscription = hook_for(researcher, "http://127.0.0.1:9/hook")
    job_ends(researcher)
    notifications_collect()
    assert delivery_send(delivery_id=subscription.deliveries.get().pk).outcome == "delivered"
    [lease] = leases
    assert lease.total_seconds() > task.time_limit


@pytest.mark.parametrize(("webhook_deadline", "email_timeout"), [(1, 1), (120, 1), (5, 120)])
def test_the_limits_follow_the_longest_send(
    settings: Any, webhook_deadline: int, email_timeout: int
) -> None:
    settings.WEBHOOK_DEADLINE_SECONDS = webhook_deadline
    settings.EMAIL_TIMEOUT = email_timeout
    limits = send_limits()
    assert isinstance(limits, SendLimits)
    assert limits.soft_time_limit > max(webhook_deadline, 3 * email_timeout)
    assert limits.soft_time_limit < limits.time_limit < limits.lease.total_seconds()


def test_a_sender_killed_on_the_last_attempt_fails_the_delivery(
    researcher: Any, deadline: Any
) -> None:
    """Past the hard time limit the worker process is killed: nothing is logged, and the
    lease runs out. The sweep sends it again only while attempts are left."""
    subscription = hook_for(researcher, "http://127.0.0.1:9/hook")
    job_ends(researcher)
    job_ends(researcher)
    notifications_collect()
    last, earlier = subscription.deliveries.order_by("id")
    expired = timezone.now() - timedelta(seconds=1)
    Delivery.objects.filter(pk=last.pk).update(
        state=Delivery.State.SENDING, attempts=deadline.NOTIFY_MAX_ATTEMPTS, lease_until=expired
    )
    Delivery.objects.filter(pk=earlier.pk).update(
        state=Delivery.State.SENDING, attempts=1, lease_until=expired
    )
    assert notifications_collect().swept == 1
    last.refresh_from_db()
    earlier.refresh_from_db()
    assert last.state == Delivery.State.FAILED and "attempts exhausted" in last.last_error
    assert earlier.state == Delivery.State.PENDING
