from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from core.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(
    page: Any, live_server: Any, username: str, password: str = "correct-horse-battery"
) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_selector("nav.mainnav")


def api_me(live_server: Any, secret: str) -> tuple[int, dict[str, Any]]:
    """GET /api/v1/me/ with the token only: no browser cookies, no session."""
    request = urllib.request.Request(
        f"{live_server.url}/api/v1/me/", headers={"Authorization": f"Token {secret}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_create_use_and_revoke_a_token(
    page: Any, live_server: Any, researcher: Any, artifacts: Path
) -> None:
    log_in(page, live_server, researcher.username)
    page.click(".userbox >> text=API tokens")
    page.wait_for_url("**/account/tokens/")
    assert page.locator("h1").inner_text() == "API tokens"

    # A missing name is refused on the page, next to the field.
    page.click("#create-token")
    assert page.locator("[data-field=name] .field-error").is_visible()

    page.fill("#id_name", "browser laptop")
    page.fill("#id_expires_in_days", "30")
    page.click("#create-token")
    secret = page.locator("#token-secret").input_value()
    assert secret.startswith("gty_")
    assert "shown only this once" in page.locator("#token-created").inner_text()
    row = page.locator("#token-table tr[data-status=active]")
    assert row.count() == 1 and "browser laptop" in row.inner_text()
    page.screenshot(path=str(artifacts / "api-tokens-created.png"), full_page=True)

    status, body = api_me(live_server, secret)
    assert status == 200 and body["username"] == researcher.username

    # Reloading the list (a GET) does not show the secret again.
    page.goto(f"{live_server.url}/account/tokens/")
    assert page.locator("#token-secret").count() == 0
    assert secret not in page.content()
    assert "ago" in page.locator("#token-table tr[data-status=active]").inner_text()

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#token-table button.revoke")
    page.wait_for_selector("#token-table tr[data-status=revoked]")
    assert "is revoked" in page.locator(".messages").inner_text()
    page.screenshot(path=str(artifacts / "api-tokens-revoked.png"), full_page=True)

    status, body = api_me(live_server, secret)
    assert status == 401
    assert body == {"message": "Token revoked.", "extra": {}}
    assert ApiToken.objects.get().revoked_at is not None
