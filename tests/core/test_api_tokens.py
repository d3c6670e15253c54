"""Personal API tokens: made and revoked at /account/tokens/, used as ``Token <secret>``;
and legacy tokens, the DRF authtoken keys converted by migration core 0004."""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import caches
from django.db import connection
from django.http import Http404
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from core.audit import AuditAction
from core.models import ApiToken, AuditEvent
from core.selectors import api_token_find_by_secret
from core.services import api_token_create, api_token_record_use, api_token_revoke
from factories import UserFactory, legacy_api_token

pytestmark = pytest.mark.django_db

PAGE = "/account/tokens/"
REVOKE = "/account/tokens/revoke/"
SECRET_RE = re.compile(r"gty_[A-Za-z0-9_-]{40,}")


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> Any:
    caches["ratelimit"].clear()
    yield
    caches["ratelimit"].clear()


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api_with(secret: str, address: str = "10.7.7.7") -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    return client


def create_on_page(client: Client, **data: Any) -> tuple[Any, str]:
    response = client.post(PAGE, {"name": "laptop", **data})
    assert response.status_code == 200
    found = SECRET_RE.findall(response.content.decode())
    assert found, "the answer to a create shows the secret"
    return response, found[0]


def assert_error_shape(body: Any) -> None:
    assert set(body) == {"message", "extra"}, body
    assert isinstance(body["message"], str) and body["message"]


def test_created_token_authenticates_the_api(researcher: Any) -> None:
    _, secret = create_on_page(signed_in(researcher), name="sweep script")

    response = api_with(secret).get("/api/v1/me/")
    assert response.status_code == 200
    assert response.json()["username"] == researcher.username
    assert response.json()["role"] == "researcher"
    token = ApiToken.objects.get()
    assert token.user == researcher
    assert token.name == "sweep script"
    assert token.prefix == secret[:8] and token.prefix.startswith("gty_")
    assert token.last_used_at is not None
    event = AuditEvent.objects.get(action=AuditAction.API_TOKEN_CREATE)
    assert event.actor == researcher and event.target_id == str(token.pk)


def test_the_secret_is_stored_nowhere(researcher: Any, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    client = signed_in(researcher)
    _, secret = create_on_page(client)
    assert api_with(secret).get("/api/v1/me/").status_code == 200

    token = ApiToken.objects.get()
    assert token.key_hash != secret
    assert token.key_hash == ApiToken.hash_secret(secret)
    assert len(token.key_hash) == 64
    # Every column of every table, sessions and the audit log included.
    secret_part = secret[len(ApiToken.SECRET_PREFIX) :]
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            # Table names come from the schema, not from input.
            cursor.execute(f'SELECT * FROM "{table}"')
            for row in cursor.fetchall():
                text = " ".join(str(value) for value in row)
                assert secret_part not in text, f"the secret is in {table}"
    assert secret_part not in caplog.text


def test_the_page_shows_the_secret_once(researcher: Any) -> None:
    client = signed_in(researcher)
    created, secret = create_on_page(client, name="notebook")
    assert created["Cache-Control"] and "no-store" in created["Cache-Control"]
    assert "shown only this once" in created.content.decode()

    listing = client.get(PAGE)
    assert listing.status_code == 200
    page = listing.content.decode()
    assert secret not in page
    assert SECRET_RE.search(page) is None
    assert "notebook" in page
    assert f"{secret[:8]}…" in page
    assert 'data-status="active"' in page


def test_revoked_token_gets_401(researcher: Any) -> None:
    client = signed_in(researcher)
    _, secret = create_on_page(client)
    token = ApiToken.objects.get()
    assert api_with(secret).get("/api/v1/me/").status_code == 200

    response = client.post(REVOKE, {"token_id": token.pk})
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    event = AuditEvent.objects.get(action=AuditAction.API_TOKEN_REVOKE)
    assert event.actor == researcher and event.target_id == str(token.pk)

    refused = api_with(secret).get("/api/v1/me/")
    assert refused.status_code == 401
    assert_error_shape(refused.json())
    assert refused.json()["message"] == "Token revoked."
    assert 'data-status="revoked"' in client.get(PAGE).content.decode()

    # A second revoke changes nothing and writes no second event.
    client.post(REVOKE, {"token_id": token.pk})
    assert AuditEvent.objects.filter(action=AuditAction.API_TOKEN_REVOKE).count() == 1


def test_expired_token_gets_401(researcher: Any) -> None:
    token, secret = api_token_create(
        user=researcher, name="short", expires_at=timezone.now() + timedelta(days=1)
    )
    assert api_with(secret).get("/api/v1/me/").status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    refused = api_with(secret).get("/api/v1/me/")
    assert refused.status_code == 401
    assert_error_shape(refused.json())
    assert refused.json()["message"] == "Token expired."
    assert 'data-status="expired"' in signed_in(researcher).get(PAGE).content.decode()


def test_unknown_token_with_the_prefix_gets_401(researcher: Any) -> None:
    api_token_create(user=researcher, name="real", expires_at=None)
    refused = api_with("gty_" + "x" * 43).get("/api/v1/me/")
    assert refused.status_code == 401
    assert_error_shape(refused.json())


def test_token_of_an_inactive_user_gets_401(researcher: Any) -> None:
    _, secret = api_token_create(user=researcher, name="laptop", expires_at=None)
    researcher.is_active = False
    researcher.save(update_fields=["is_active"])
    assert api_with(secret).get("/api/v1/me/").status_code == 401


def test_another_user_cannot_revoke_or_see_a_token(
    researcher: Any, other_researcher: Any, operator: Any
) -> None:
    token, secret = api_token_create(user=researcher, name="ritas-laptop", expires_at=None)

    for intruder in (other_researcher, operator):
        client = signed_in(intruder)
        assert client.post(REVOKE, {"token_id": token.pk}).status_code == 404
        # The same answer as for a token that does not exist.
        assert client.post(REVOKE, {"token_id": token.pk + 1000}).status_code == 404
        assert "ritas-laptop" not in client.get(PAGE).content.decode()
        with pytest.raises(Http404):
            api_token_revoke(user=intruder, token_id=token.pk)
    token.refresh_from_db()
    assert token.revoked_at is None
    assert not AuditEvent.objects.filter(action=AuditAction.API_TOKEN_REVOKE).exists()
    assert api_with(secret).get("/api/v1/me/").status_code == 200


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"name": ""}, "name", "This field is required."),
        ({"name": "   "}, "name", "This field is required."),
        ({"name": "x" * 65}, "name", "at most 64 characters"),
        ({"name": "ok", "expires_in_days": "0"}, "expires_in_days", "greater than or equal to 1"),
        ({"name": "ok", "expires_in_days": "366"}, "expires_in_days", "less than or equal to 365"),
        ({"name": "ok", "expires_in_days": "soon"}, "expires_in_days", "Enter a whole number."),
        ({"name": "ok", "expires_on": "2001-01-01"}, "expires_on", "after today"),
        ({"name": "ok", "expires_on": "31/12/2099"}, "expires_on", "Enter a valid date."),
        ({"name": "ok", "expires_on": "2999-01-01"}, "expires_on", "At most 365 days"),
        (
            {"name": "ok", "expires_in_days": "5", "expires_on": "2999-01-01"},
            "expires_on",
            "not both",
        ),
    ],
)
def test_form_errors_are_shown_on_the_page(
    researcher: Any, data: dict[str, str], field: str, message: str
) -> None:
    response = signed_in(researcher).post(PAGE, data)
    assert response.status_code == 200
    page = response.content.decode()
    block = re.search(rf'data-field="{field}">(.*?)</div>\s*</div>', page, re.S)
    assert block is not None and "field-error" in block.group(1), page
    assert message in block.group(1)
    assert not ApiToken.objects.exists()
    assert SECRET_RE.search(page) is None


def test_expiry_in_days_and_on_a_date(researcher: Any) -> None:
    client = signed_in(researcher)
    create_on_page(client, name="days", expires_in_days="30")
    day = (timezone.localdate() + timedelta(days=10)).isoformat()
    create_on_page(client, name="date", expires_on=day)
    create_on_page(client, name="forever")
    now = timezone.now()
    by_name = {token.name: token for token in ApiToken.objects.all()}
    days = by_name["days"].expires_at
    assert days is not None and abs(days - (now + timedelta(days=30))) < timedelta(minutes=1)
    dated = by_name["date"].expires_at
    assert dated is not None and timezone.localtime(dated).date().isoformat() == day
    assert by_name["forever"].expires_at is None


def test_last_used_is_written_at_most_once_a_minute(researcher: Any) -> None:
    token, secret = api_token_create(user=researcher, name="busy", expires_at=None)
    client = api_with(secret)
    assert client.get("/api/v1/me/").status_code == 200
    token.refresh_from_db()
    first = token.last_used_at
    assert first is not None

    assert client.get("/api/v1/me/").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at == first

    # A minute later the next call writes again.
    later = first + timedelta(seconds=61)
    api_token_record_use(token=token, now=later)
    token.refresh_from_db()
    assert token.last_used_at == later
    # A stale copy (another worker) does not move it back or write twice.
    stale = ApiToken.objects.get(pk=token.pk)
    stale.last_used_at = first
    api_token_record_use(token=stale, now=later + timedelta(seconds=1))
    token.refresh_from_db()
    assert token.last_used_at == later


def test_a_use_within_the_minute_costs_no_write(
    researcher: Any, django_assert_num_queries: Any
) -> None:
    token, _ = api_token_create(user=researcher, name="busy", expires_at=None)
    now = timezone.now()
    api_token_record_use(token=token, now=now)
    with django_assert_num_queries(0):
        api_token_record_use(token=token, now=now + timedelta(seconds=30))


# A DRF authtoken key: 40 hex digits, no prefix (core 0004 turned each into a legacy token).
LEGACY_KEY = "9c1d0e8f" * 5


def test_a_converted_admin_key_works_and_is_one_of_the_users_tokens(researcher: Any) -> None:
    token = legacy_api_token(user=researcher, key=LEGACY_KEY)
    response = api_with(LEGACY_KEY).get("/api/v1/me/")
    assert response.status_code == 200
    assert response.json()["username"] == researcher.username
    assert response.json()["role"] == "researcher"
    token.refresh_from_db()
    assert token.last_used_at is not None

    # Listed and revoked on the person's page like any token, its secret nowhere.
    client = signed_in(researcher)
    page = client.get(PAGE).content.decode()
    assert f"{LEGACY_KEY[:4]}…" in page and "legacy</span>" in page
    assert LEGACY_KEY[4:] not in page
    assert client.post(REVOKE, {"token_id": token.pk}).status_code == 302
    refused = api_with(LEGACY_KEY).get("/api/v1/me/")
    assert refused.status_code == 401
    assert refused.json()["message"] == "Token revoked."


def test_only_legacy_tokens_take_a_secret_without_the_prefix(researcher: Any) -> None:
    # A token made here whose hash were of a prefixless key: the flag, not the hash, is
    # what admits a secret without the prefix.
    ApiToken.objects.create(
        user=researcher, name="x", prefix="gty_abcd", key_hash=ApiToken.hash_secret(LEGACY_KEY)
    )
    assert api_with(LEGACY_KEY).get("/api/v1/me/").status_code == 401
    # And a legacy token never matches a gty_ secret.
    prefixed = ApiToken.SECRET_PREFIX + LEGACY_KEY
    legacy_api_token(user=researcher, key=prefixed)
    assert api_with(prefixed).get("/api/v1/me/").status_code == 401
    # A wrong key of the legacy shape is simply unknown.
    assert api_with("0" * 40).get("/api/v1/me/").json()["message"] == "Invalid token."


def test_a_long_secret_without_the_prefix_is_refused_without_a_lookup(
    researcher: Any, django_assert_num_queries: Any
) -> None:
    long_key = "a" * (ApiToken.LEGACY_KEY_MAX_LENGTH + 1)
    legacy_api_token(user=researcher, key=long_key)
    with django_assert_num_queries(0):
        assert api_token_find_by_secret(secret=long_key) is None
    assert api_with(long_key).get("/api/v1/me/").status_code == 401


@override_settings(TOKEN_MAX_FAILURES=3, LOGIN_FAILURE_WINDOW=60)
def test_bad_legacy_keys_are_throttled_per_address(researcher: Any) -> None:
    legacy_api_token(user=researcher, key=LEGACY_KEY)
    bad = api_with("0" * 40, address="10.6.6.6")
    assert [bad.get("/api/v1/me/").status_code for _ in range(3)] == [401, 401, 401]
    # From that address even the right key waits now; from another it works.
    assert api_with(LEGACY_KEY, address="10.6.6.6").get("/api/v1/me/").status_code == 429
    assert api_with(LEGACY_KEY, address="10.8.8.8").get("/api/v1/me/").status_code == 200


@override_settings(TOKEN_MAX_FAILURES=3, LOGIN_FAILURE_WINDOW=60)
def test_bad_personal_tokens_are_throttled_per_address(researcher: Any) -> None:
    token, secret = api_token_create(user=researcher, name="laptop", expires_at=None)
    api_token_revoke(user=researcher, token_id=token.pk)
    bad = api_with(secret, address="10.4.4.4")
    assert [bad.get("/api/v1/me/").status_code for _ in range(3)] == [401, 401, 401]
    throttled = bad.get("/api/v1/me/")
    assert throttled.status_code == 429
    assert_error_shape(throttled.json())
    # Another address with a good token is unaffected.
    _, good = api_token_create(user=researcher, name="desk", expires_at=None)
    assert api_with(good, address="10.5.5.5").get("/api/v1/me/").status_code == 200


def test_pages_need_a_role_a_login_and_csrf(outsider: Any, researcher: Any) -> None:
    assert signed_in(outsider).get(PAGE).status_code == 403
    anonymous = Client().get(PAGE)
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(researcher)
    assert strict.post(PAGE, {"name": "laptop"}).status_code == 403
    token, _ = api_token_create(user=researcher, name="laptop", expires_at=None)
    assert strict.post(REVOKE, {"token_id": token.pk}).status_code == 403
    assert ApiToken.objects.get().revoked_at is None
    assert signed_in(researcher).get(REVOKE).status_code == 405


def test_navigation_links_to_the_page(researcher: Any) -> None:
    page = signed_in(researcher).get("/jobs/").content.decode()
    assert f'href="{PAGE}"' in page


def test_operator_revokes_anyones_token_in_the_admin(operator: Any, researcher: Any) -> None:
    token, secret = api_token_create(user=researcher, name="leaked", expires_at=None)
    client = signed_in(operator)
    listing = client.get("/admin/core/apitoken/")
    assert listing.status_code == 200
    assert "leaked" in listing.content.decode()
    response = client.post(
        "/admin/core/apitoken/", {"action": "revoke", "_selected_action": [token.pk]}
    )
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    event = AuditEvent.objects.get(action=AuditAction.API_TOKEN_REVOKE)
    assert event.actor == operator
    assert api_with(secret).get("/api/v1/me/").status_code == 401


def test_a_researcher_has_no_token_admin(researcher: Any) -> None:
    other = UserFactory(username="tess-researcher", role="researchers")
    api_token_create(user=other, name="tess", expires_at=None)
    response = signed_in(researcher).get("/admin/core/apitoken/")
    assert response.status_code == 302


def test_the_api_docs_say_how_tokens_work(client: Client) -> None:
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    description = schema["info"]["description"]
    assert "/account/tokens/" in description
    assert (
        "401" in description and "Token revoked." in description and "Token expired." in description
    )
    schemes = schema["components"]["securitySchemes"]
    assert any(
        scheme.get("type") == "apiKey" and scheme.get("name") == "Authorization"
        for scheme in schemes.values()
    ), schemes
    for path in (
        "/api/v1/job-templates/",
        "/api/v1/jobs/{job_id}/hold/",
        "/api/v1/jobs/{job_id}/output/",
        "/api/v1/jobs/{job_id}/output/ranks/{rank}/",
    ):
        assert path in schema["paths"], path
