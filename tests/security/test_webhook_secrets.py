"""Webhook signing secrets: shown once, in the answer that creates the subscription, then
never again: not in a page, the admin, the API, the audit log, the logs, or any text
column of the database in clear (it is stored encrypted, since Gantry must sign with it)."""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Any

from django.apps import apps
from django.db import models
from django.test import Client
from django.utils import timezone

from factories import JobFactory
from jobs.models import Job, JobEvent
from notifications.delivery import delivery_send
from notifications.models import Delivery, Subscription
from notifications.outbox import notifications_collect
from webhook_support import webhook_receiver


def test_the_signing_secret_is_shown_once_and_nowhere_else(
    operator: Any, researcher: Any, settings: Any, caplog: Any, security_figures: Any
) -> None:
    settings.WEBHOOK_ALLOW = [ipaddress.ip_network("127.0.0.1/32")]
    settings.NOTIFY_RETRY_BASE_SECONDS = 1
    caplog.set_level(logging.DEBUG)
    pages = Client()
    pages.force_login(researcher)
    admin = Client()
    admin.force_login(operator)
    with webhook_receiver(script=[500]) as receiver:
        notifications_collect()
        created = pages.post(
            "/account/notifications/",
            {
                "name": "leak check",
                "channel": "webhook",
                "url": receiver.url,
                "topics": ["job.ended"],
            },
        )
        subscription = Subscription.objects.get(name="leak check")
        api = Client()
        api.force_login(researcher)
        api_created = api.post(
            "/api/v1/notifications/subscriptions/create/",
            data=json.dumps(
                {
                    "name": "leak api",
                    "channel": "webhook",
                    "url": receiver.url,
                    "topics": ["job.ended"],
                }
            ),
            content_type="application/json",
        )
        secrets = [
            created.content.decode()
            .split('id="webhook-secret" class="secret" value="')[1]
            .split('"')[0],
            api_created.json()["secret"],
        ]
        # Positive control: each answer that created one shows its secret.
        assert all(secret.startswith("gwhsec_") for secret in secrets)
        job = JobFactory(owner=researcher, state=Job.State.COMPLETED, ended_at=timezone.now())
        JobEvent.objects.create(job=job, kind="state", from_state="running", to_state="completed")
        notifications_collect()
        for delivery in Delivery.objects.all():
            delivery_send(delivery_id=delivery.pk)  # the first answer is a 500: logged
            Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
            Subscription.objects.update(paused_until=None)
            delivery_send(delivery_id=delivery.pk)
        receiver.wait_for(3, timeout=5)

    delivery = Delivery.objects.filter(subscription=subscription).first()
    assert delivery is not None
    seen: list[tuple[str, str]] = []
    for url in (
        "/account/notifications/",
        "/admin/notifications/subscription/",
        f"/admin/notifications/subscription/{subscription.pk}/change/",
        "/admin/notifications/delivery/",
        f"/admin/notifications/delivery/{delivery.pk}/change/",
        "/admin/notifications/event/",
    ):
        client = pages if url.startswith("/account/") else admin
        response = client.get(url)
        assert response.status_code == 200, url
        seen.append((url, response.content.decode()))
    for url in (
        "/api/v1/notifications/subscriptions/",
        f"/api/v1/notifications/subscriptions/{subscription.pk}/",
        f"/api/v1/notifications/subscriptions/{subscription.pk}/deliveries/",
    ):
        response = api.get(url)
        assert response.status_code == 200, url
        seen.append((url, response.content.decode()))
    operator_api = Client()
    operator_api.force_login(operator)
    seen.append(("audit log", operator_api.get("/api/v1/audit-events/").content.decode()))
    seen.append(("logs", caplog.text))
    for model in apps.get_models():
        text_fields = [
            field.name
            for field in model._meta.get_fields()
            if isinstance(field, models.CharField | models.TextField | models.JSONField)
        ]
        if text_fields:
            for row in model.objects.values_list(*text_fields):
                seen.append((f"db {model._meta.label}", json.dumps(row, default=str)))
    leaks = [where for where, text in seen for secret in secrets if secret in text]
    security_figures.add("webhook_secrets.places_scanned", len(seen))
    security_figures.add("webhook_secrets.leaks", len(leaks))
    assert not leaks, f"webhook secret in: {leaks}"
