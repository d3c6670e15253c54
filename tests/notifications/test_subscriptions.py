"""Subscribing through the API and the page: checked input refused with the field named,
the webhook secret shown once, audited, one's own only."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from core.audit import AuditAction
from core.models import AuditEvent
from factories import ClusterFactory
from notifications import signing
from notifications.models import Subscription

pytestmark = pytest.mark.django_db

CREATE = "/api/v1/notifications/subscriptions/create/"


def create(api: Any, **body: Any) -> Any:
    payload = {"name": "hook", "channel": "webhook", "topics": ["job.ended"], **body}
    return api.post(CREATE, payload, format="json")


def test_a_webhook_subscription_shows_its_secret_once(
    researcher_api: Any, researcher: Any, receiver: Any
) -> None:
    response = create(researcher_api, url=receiver.url, topics=["job.ended", "drill.finished"])
    assert response.status_code == 201, response.json()
    assert response["Cache-Control"] == "no-store"
    body = response.json()
    secret = body["secret"]
    assert secret.startswith(signing.SECRET_PREFIX) and len(secret) > 40
    assert body["secret_prefix"] == secret[: signing.SHOWN_PREFIX_LENGTH]
    assert body["topics"] == ["drill.finished", "job.ended"]
    subscription = Subscription.objects.get(pk=body["id"])
    # Stored so it can sign, but not in clear.
    assert secret not in subscription.secret_encrypted
    assert signing.secret_decrypt(subscription.secret_encrypted) == secret
    # Never again: not in the list, the detail or the audit event.
    listed = researcher_api.get("/api/v1/notifications/subscriptions/").content.decode()
    detail = researcher_api.get(f"/api/v1/notifications/subscriptions/{subscription.pk}/")
    assert secret not in listed and secret not in detail.content.decode()
    assert "secret" not in detail.json()
    event = AuditEvent.objects.get(action=AuditAction.NOTIFICATION_SUBSCRIBE)
    assert event.actor == researcher
    assert event.target_id == str(subscription.pk)
    assert event.details["url"] == receiver.url
    assert secret not in str(event.details)


@pytest.mark.parametrize(
    ("body", "field", "why"),
    [
        ({"url": "http://127.0.0.1:9/hook"}, "url", "loopback"),
        ({"url": "http://169.254.169.254/latest/meta-data/"}, "url", "link-local"),
        ({"url": "http://10.0.0.8/"}, "url", "private"),
        ({"url": "http://[::ffff:192.168.0.1]/"}, "url", "private"),
        ({"url": "ftp://93.184.215.14/"}, "url", "only http"),
        ({"url": ""}, "url", "needs a URL"),
        ({"topics": []}, "topics", ""),
        ({"topics": ["node.down"]}, "topics", "for operators"),
        ({"topics": ["no.such"]}, "topics", ""),
        ({"name": "  "}, "name", ""),
        ({"channel": "pigeon"}, "channel", ""),
    ],
)
def test_refused_with_the_field_named(
    researcher_api: Any, settings: Any, body: dict[str, Any], field: str, why: str
) -> None:
    settings.WEBHOOK_ALLOW = []
    payload = {"url": "https://93.184.215.14/hook", **body}
    response = create(researcher_api, **payload)
    assert response.status_code == 400, response.json()
    answer = response.json()
    assert set(answer) == {"message", "extra"}
    assert field in answer["extra"]["fields"], answer
    assert why in " ".join(answer["extra"]["fields"][field])
    assert not Subscription.objects.exists()
    assert not AuditEvent.objects.filter(action=AuditAction.NOTIFICATION_SUBSCRIBE).exists()


def test_email_goes_to_the_account_address(researcher_api: Any, loopback_allowed: Any) -> None:
    response = create(researcher_api, channel="email", url="")
    assert response.status_code == 201, response.json()
    assert response.json()["secret"] is None


def test_email_refused_where_no_mail_server_is_configured(
    researcher_api: Any, settings: Any
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.dummy.EmailBackend"
    response = create(researcher_api, channel="email", url="")
    assert response.status_code == 400
    assert "GANTRY_EMAIL_HOST" in response.json()["extra"]["fields"]["channel"][0]


def test_operators_subscribe_to_cluster_topics_of_one_cluster(
    operator_api: Any, receiver: Any
) -> None:
    cluster = ClusterFactory(name="alpha")
    response = create(
        operator_api,
        url=receiver.url,
        topics=["node.down", "node.drained", "drill.failed", "proven_age.breach"],
        cluster=cluster.pk,
    )
    assert response.status_code == 201, response.json()
    assert response.json()["cluster"] == "alpha"
    missing = create(operator_api, url=receiver.url, topics=["node.down"], cluster=999999)
    assert missing.status_code == 400
    assert "cluster" in missing.json()["extra"]["fields"]


def test_outsiders_and_anonymous_callers_cannot_subscribe(
    outsider_api: Any, anonymous_api: Any, receiver: Any
) -> None:
    assert create(outsider_api, url=receiver.url).status_code == 403
    assert create(anonymous_api, url=receiver.url).status_code == 401


def test_removing_is_audited_once_and_only_for_the_owner(
    researcher_api: Any, other_researcher: Any, receiver: Any
) -> None:
    subscription_id = create(researcher_api, url=receiver.url).json()["id"]
    other = Client()
    other.force_login(other_researcher)
    remove = f"/api/v1/notifications/subscriptions/{subscription_id}/remove/"
    assert other.post(remove).status_code == 404
    assert other.get(f"/api/v1/notifications/subscriptions/{subscription_id}/").status_code == 404
    first = researcher_api.post(remove)
    assert first.status_code == 200 and first.json()["active"] is False
    assert researcher_api.post(remove).status_code == 200
    assert (
        AuditEvent.objects.filter(
            action=AuditAction.NOTIFICATION_UNSUBSCRIBE, target_id=str(subscription_id)
        ).count()
        == 1
    )
    assert Subscription.objects.get(pk=subscription_id).removed_at is not None


def test_the_page_creates_shows_the_secret_once_and_removes(researcher: Any, receiver: Any) -> None:
    page = Client()
    page.force_login(researcher)
    assert page.get("/account/notifications/").status_code == 200
    response = page.post(
        "/account/notifications/",
        {"name": "lab hook", "channel": "webhook", "url": receiver.url, "topics": ["job.ended"]},
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0")
    subscription = Subscription.objects.get(name="lab hook")
    secret = signing.secret_decrypt(subscription.secret_encrypted)
    assert f'value="{secret}"' in html
    # The operator topics are not offered to a researcher.
    assert 'value="node.down"' not in html
    again = page.get("/account/notifications/").content.decode()
    assert secret not in again and subscription.secret_prefix in again
    refused = page.post(
        "/account/notifications/",
        {"name": "bad", "channel": "webhook", "url": "http://10.1.1.1/", "topics": ["job.ended"]},
    ).content.decode()
    assert 'data-field="url"' in refused and "private address" in refused
    page.post("/account/notifications/remove/", {"subscription_id": subscription.pk})
    subscription.refresh_from_db()
    assert subscription.removed_at is not None
