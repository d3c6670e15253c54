from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from core.audit import audit_event_record
from core.models import AuditEvent
from core.services import api_token_create

pytestmark = pytest.mark.django_db


def assert_error_shape(body: Any) -> None:
    assert set(body) == {"message", "extra"}, body
    assert isinstance(body["message"], str) and body["message"]
    assert isinstance(body["extra"], dict)


def test_me_reports_the_role(operator_api: APIClient, researcher_api: APIClient) -> None:
    assert operator_api.get("/api/v1/me/").json()["role"] == "operator"
    assert researcher_api.get("/api/v1/me/").json() == {
        "username": "rita-researcher",
        "role": "researcher",
        "is_staff": False,
    }


def test_anonymous_gets_401_or_403_in_the_error_shape(anonymous_api: APIClient) -> None:
    response = anonymous_api.get("/api/v1/me/")
    assert response.status_code in (401, 403)
    assert_error_shape(response.json())


def test_unknown_api_path_is_a_json_404(client: Client) -> None:
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert_error_shape(response.json())


def test_token_authentication(researcher: Any) -> None:
    _, secret = api_token_create(user=researcher, name="script", expires_at=None)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert client.get("/api/v1/me/").json()["username"] == researcher.username
    client.credentials(HTTP_AUTHORIZATION="Token wrong")
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    assert_error_shape(response.json())


def test_a_token_brings_its_users_roles_in_the_same_query(
    researcher: Any, operator: Any, outsider: Any
) -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def client_with(user: Any) -> APIClient:
        _, secret = api_token_create(user=user, name="script", expires_at=None)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
        return client

    researcher_client = client_with(researcher)
    # The first call also notes the token's last use (a write); the second is a plain read.
    assert researcher_client.get("/api/v1/jobs/").status_code == 200
    with CaptureQueriesContext(connection) as captured:
        assert researcher_client.get("/api/v1/jobs/").status_code == 200
    sql = [query["sql"] for query in captured.captured_queries]
    # One query for the token, its user and both roles; no role check of its own.
    assert len([q for q in sql if "core_apitoken" in q]) == 1
    assert not [q for q in sql if "auth_group" in q and "core_apitoken" not in q], sql
    # The roles it brought are the user's own: no role, no jobs; an operator sees the audit log.
    assert client_with(outsider).get("/api/v1/jobs/").status_code == 403
    assert client_with(operator).get("/api/v1/audit-events/").status_code == 200
    assert researcher_client.get("/api/v1/audit-events/").status_code == 403
    User.objects.filter(pk=researcher.pk).update(is_active=False)
    assert researcher_client.get("/api/v1/jobs/").status_code == 401


def test_audit_log_is_operator_only_and_cursor_paginated(
    operator: Any, operator_api: APIClient, researcher_api: APIClient
) -> None:
    for number in range(7):
        audit_event_record(actor=operator, action="test.event", details={"n": number})

    denied = researcher_api.get("/api/v1/audit-events/")
    assert denied.status_code == 403
    assert_error_shape(denied.json())
    assert denied.json()["message"] == "Only operators may do this."

    first = operator_api.get("/api/v1/audit-events/?page_size=5").json()
    assert [row["details"]["n"] for row in first["results"]] == [6, 5, 4, 3, 2]
    assert first["next"] and "cursor=" in first["next"]
    second = operator_api.get(first["next"]).json()
    assert [row["details"]["n"] for row in second["results"]] == [1, 0]
    assert second["next"] is None
    assert AuditEvent.objects.count() == 7


def test_validation_errors_name_the_field(operator_api: APIClient) -> None:
    response = operator_api.get("/api/v1/audit-events/?page_size=5&cursor=garbage")
    assert response.status_code == 404
    assert_error_shape(response.json())


def test_openapi_schema_and_docs(researcher: Any, client: Client) -> None:
    client.force_login(researcher)
    schema = client.get("/api/schema/?format=json")
    assert schema.status_code == 200
    document = schema.json()
    assert document["info"]["title"] == "Gantry API"
    assert "/api/v1/me/" in document["paths"]
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    # Served from our own static files: no CDN on a closed network.
    assert "swagger-ui" in docs.content.decode()
    assert "cdn." not in docs.content.decode()
