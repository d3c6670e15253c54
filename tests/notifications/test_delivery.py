"""Sending: a signed POST to the endpoint that passed the checks, one per (subscription,
event) whatever the retries; a dead or hostile endpoint costs little and gets nothing."""

from __future__ import annotations

import json
import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from factories import JobFactory
from jobs.models import Job, JobEvent
from notifications import signing
from notifications.delivery import backoff_seconds, delivery_send
from notifications.models import Delivery, DeliveryAttempt, Event, Subscription
from notifications.outbox import notifications_collect
from notifications.services import subscription_create
from notifications.topics import Topic
from webhook_support import Receiver, webhook_receiver

pytestmark = pytest.mark.django_db


def hook(user: Any, url: str, *topics: str) -> tuple[Subscription, str]:
    subscription, secret = subscription_create(
        user=user,
        name="hook",
        channel="webhook",
        url=url,
        topics=list(topics) or [Topic.JOB_ENDED],
    )
    assert secret is not None
    return subscription, secret


def job_ends(owner: Any) -> Job:
    job = JobFactory(owner=owner, state=Job.State.COMPLETED, ended_at=timezone.now())
    JobEvent.objects.create(job=job, kind="state", from_state="running", to_state="completed")
    return job


def make_delivery(subscription: Subscription) -> Delivery:
    notifications_collect()
    return subscription.deliveries.get()


def due(delivery: Delivery) -> None:
    """Skip the back-off wait (the test does not sleep through it)."""
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    Subscription.objects.filter(pk=delivery.subscription_id).update(paused_until=None)


def test_a_signed_post_with_the_event_id_and_a_timestamp(
    researcher: Any, receiver: Receiver
) -> None:
    notifications_collect()
    subscription, secret = hook(researcher, receiver.url)
    job = job_ends(researcher)
    delivery = make_delivery(subscription)

    assert delivery_send(delivery_id=delivery.pk).outcome == "delivered"

    [request] = receiver.wait_for(1, timeout=5)
    event = Event.objects.get()
    assert request.path == "/hook"
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["X-Gantry-Event-Id"] == str(event.id)
    assert request.headers["X-Gantry-Event"] == "job.ended"
    assert signing.signature_valid(secret, request.body, request.headers["X-Gantry-Signature"])
    assert not signing.signature_valid(
        "another secret", request.body, request.headers["X-Gantry-Signature"]
    )
    body = json.loads(request.body)
    assert body["id"] == str(event.id) and body["data"]["job"]["id"] == str(job.id)
    # The timestamp is signed too: it is in the body.
    assert str(body["sent_at"]) == request.headers["X-Gantry-Timestamp"]
    assert abs(body["sent_at"] - time.time()) < 30
    delivery.refresh_from_db()
    assert delivery.state == Delivery.State.DELIVERED and delivery.attempts == 1
    [attempt] = DeliveryAttempt.objects.filter(delivery=delivery)
    assert attempt.ok and attempt.status_code == 200 and attempt.address == "127.0.0.1"
    # A redelivered task finds it delivered: no second POST.
    assert delivery_send(delivery_id=delivery.pk).outcome.startswith("not due")
    time.sleep(0.2)
    assert len(receiver.requests) == 1


def test_a_500_is_retried_with_back_off_then_delivered_once(
    researcher: Any, loopback_allowed: Any
) -> None:
    loopback_allowed.NOTIFY_RETRY_BASE_SECONDS = 30
    with webhook_receiver(script=[500]) as receiver:
        notifications_collect()
        subscription, secret = hook(researcher, receiver.url)
        job_ends(researcher)
        delivery = make_delivery(subscription)

        failed = delivery_send(delivery_id=delivery.pk)
        assert failed.retry_in == backoff_seconds(1)
        assert "HTTP 500" in failed.outcome
        delivery.refresh_from_db()
        assert (
            delivery.state == Delivery.State.PENDING and delivery.next_attempt_at > timezone.now()
        )
        # Not due yet: a task that fires early sends nothing.
        assert delivery_send(delivery_id=delivery.pk).outcome.startswith("not due")
        due(delivery)
        assert delivery_send(delivery_id=delivery.pk).outcome == "delivered"
        requests = receiver.wait_for(2, timeout=5)
    first, second = requests
    assert first.headers["X-Gantry-Event-Id"] == second.headers["X-Gantry-Event-Id"]
    for request in requests:
        assert signing.signature_valid(secret, request.body, request.headers["X-Gantry-Signature"])
    attempts = list(DeliveryAttempt.objects.filter(delivery=delivery).order_by("number"))
    assert [(a.number, a.ok, a.status_code) for a in attempts] == [(1, False, 500), (2, True, 200)]
    assert "receiver says no" in attempts[0].error
    subscription.refresh_from_db()
    assert subscription.consecutive_failures == 0 and subscription.paused_until is None


def test_attempts_run_out(researcher: Any, loopback_allowed: Any) -> None:
    with webhook_receiver(default=503) as receiver:
        notifications_collect()
        subscription, _ = hook(researcher, receiver.url)
        job_ends(researcher)
        delivery = make_delivery(subscription)
        for _ in range(loopback_allowed.NOTIFY_MAX_ATTEMPTS):
            due(delivery)
            delivery_send(delivery_id=delivery.pk)
    delivery.refresh_from_db()
    assert delivery.state == Delivery.State.FAILED
    assert delivery.attempts == loopback_allowed.NOTIFY_MAX_ATTEMPTS
    assert "HTTP 503" in delivery.last_error
    due(delivery)
    assert delivery_send(delivery_id=delivery.pk).outcome.startswith("not due")


def test_a_paused_endpoint_is_not_tried_for_every_event(
    researcher: Any, loopback_allowed: Any, settings: Any
) -> None:
    # A pause longer than a loaded machine takes to send the next two.
    settings.NOTIFY_RETRY_BASE_SECONDS = 120
    with webhook_receiver(default=500) as receiver:
        notifications_collect()
        subscription, _ = hook(researcher, receiver.url)
        for _ in range(3):
            job_ends(researcher)
        notifications_collect()
        deliveries = list(subscription.deliveries.order_by("id"))
        assert len(deliveries) == 3
        outcomes = [delivery_send(delivery_id=delivery.pk).outcome for delivery in deliveries]
        time.sleep(0.2)
        assert len(receiver.requests) == 1
    assert outcomes[1:] == ["paused", "paused"]
    assert Delivery.objects.filter(pk__in=[d.pk for d in deliveries[1:]], attempts=0).count() == 2


def test_redirects_are_not_followed(researcher: Any, loopback_allowed: Any) -> None:
    with webhook_receiver() as target, webhook_receiver(redirect_to="") as redirector:
        redirector.redirect_to = target.url
        notifications_collect()
        subscription, _ = hook(researcher, redirector.url)
        job_ends(researcher)
        delivery = make_delivery(subscription)
        outcome = delivery_send(delivery_id=delivery.pk).outcome
        time.sleep(0.2)
        assert target.requests == []
    assert "redirects are not followed" in outcome
    assert DeliveryAttempt.objects.get(delivery=delivery).status_code == 302


def test_the_address_is_checked_again_at_send_time(
    researcher: Any, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name resolved to an allowed address when subscribing, to a
    private one now. Refused without connecting; the connection never re-resolves."""
    port = int(receiver.url.rsplit(":", 1)[1].split("/")[0])
    answers = {"hooks.example.org": "127.0.0.1"}
    real = socket.getaddrinfo

    def resolver(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in answers:
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr("notifications.addresses.socket.getaddrinfo", resolver)
    notifications_collect()
    subscription, _ = hook(researcher, f"http://hooks.example.org:{port}/hook")
    job_ends(researcher)
    delivery = make_delivery(subscription)
    answers["hooks.example.org"] = "10.0.0.5"
    outcome = delivery_send(delivery_id=delivery.pk).outcome
    assert "10.0.0.5 is a private address" in outcome
    attempt = DeliveryAttempt.objects.get(delivery=delivery)
    assert attempt.status_code is None and attempt.address == ""
    assert receiver.requests == []
    # Back to the allowed address: sent there, with the name in the Host header.
    answers["hooks.example.org"] = "127.0.0.1"
    due(delivery)
    assert delivery_send(delivery_id=delivery.pk).outcome == "delivered"
    [request] = receiver.wait_for(1, timeout=5)
    assert request.headers["Host"] == f"hooks.example.org:{port}"


def test_a_dead_endpoint_costs_at_most_the_timeout(researcher: Any, loopback_allowed: Any) -> None:
    loopback_allowed.WEBHOOK_TIMEOUT_SECONDS = 1
    with webhook_receiver(delay=5) as slow:
        notifications_collect()
        subscription, _ = hook(researcher, slow.url)
        job_ends(researcher)
        delivery = make_delivery(subscription)
        started = time.monotonic()
        outcome = delivery_send(delivery_id=delivery.pk).outcome
        took = time.monotonic() - started
    assert took < 3, took
    assert "timed out" in outcome
    # A port nobody listens on: refused at once.
    with webhook_receiver() as closed:
        url = closed.url
    notifications_collect()
    dead, _ = hook(researcher, url)
    job_ends(researcher)
    notifications_collect()
    started = time.monotonic()
    refused = delivery_send(delivery_id=dead.deliveries.get().pk).outcome
    assert time.monotonic() - started < 2
    assert "ConnectionRefusedError" in refused


def test_email_goes_to_the_owner(researcher: Any, loopback_allowed: Any) -> None:
    notifications_collect()
    subscription, secret = subscription_create(
        user=researcher, name="mail", channel="email", topics=[Topic.JOB_ENDED]
    )
    assert secret is None
    job = job_ends(researcher)
    delivery = make_delivery(subscription)
    assert delivery_send(delivery_id=delivery.pk).outcome == "delivered"
    [message] = mail.outbox
    assert message.to == [researcher.email]
    assert job.name in message.subject and str(job.id) in message.body


def test_a_removed_subscription_is_skipped_at_send_time(
    researcher: Any, receiver: Receiver
) -> None:
    notifications_collect()
    subscription, _ = hook(researcher, receiver.url)
    job_ends(researcher)
    delivery = make_delivery(subscription)
    Subscription.objects.filter(pk=subscription.pk).update(removed_at=timezone.now())
    assert delivery_send(delivery_id=delivery.pk).outcome.startswith("skipped")
    assert receiver.requests == []


def test_a_delivery_whose_sender_died_is_swept_and_sent_once(
    researcher: Any, receiver: Receiver
) -> None:
    notifications_collect()
    subscription, _ = hook(researcher, receiver.url)
    job_ends(researcher)
    delivery = make_delivery(subscription)
    # A worker claimed it and died: its lease runs out.
    Delivery.objects.filter(pk=delivery.pk).update(
        state=Delivery.State.SENDING, lease_until=timezone.now() - timedelta(seconds=1)
    )
    assert notifications_collect().swept == 1
    assert delivery_send(delivery_id=delivery.pk).outcome == "delivered"
    assert notifications_collect().swept == 0
    receiver.wait_for(1, timeout=5)
