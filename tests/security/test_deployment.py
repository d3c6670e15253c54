"""Deployment hardening: login throttling, CSRF on every form, TLS cookies and HSTS.

``manage.py check --deploy`` with production settings is tested in
tests/controlplane/test_startup.py; here the headers and cookies it promises are checked
on real responses with ``GANTRY_TLS=true`` settings.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import reverse

REPO = Path(__file__).resolve().parents[2]


def _login(client: Client, username: str, password: str, address: str = "10.0.0.1") -> Any:
    return client.post(
        "/accounts/login/",
        {"username": username, "password": password},
        REMOTE_ADDR=address,
    )


@override_settings(LOGIN_MAX_FAILURES=3, LOGIN_FAILURE_WINDOW=60)
def test_login_is_rate_limited_per_user_name(researcher: Any, security_figures: Any) -> None:
    client = Client()
    for _ in range(3):
        assert _login(client, researcher.username, "wrong").status_code == 200
    # Even the right password is refused while the user name is locked: an attacker who
    # guesses it on the fourth try learns nothing.
    locked = _login(client, researcher.username, "correct-horse-battery", address="10.0.0.2")
    assert locked.status_code == 429
    assert "Too many failed log-in attempts" in locked.content.decode()
    assert locked.headers["Retry-After"] == "60"
    assert "_auth_user_id" not in client.session
    security_figures.add("deploy.checks")


@override_settings(LOGIN_MAX_FAILURES=3, LOGIN_FAILURE_WINDOW=60)
def test_login_is_rate_limited_per_address(
    researcher: Any, other_researcher: Any, security_figures: Any
) -> None:
    client = Client()
    for name in ("a", "b", "c"):
        _login(client, name, "wrong", address="10.9.9.9")
    assert _login(client, other_researcher.username, "x", address="10.9.9.9").status_code == 429
    # Another address and user are unaffected, and a good login resets the user's count.
    ok = _login(client, researcher.username, "correct-horse-battery", address="10.1.1.1")
    assert ok.status_code == 302
    security_figures.add("deploy.checks")


@override_settings(TOKEN_MAX_FAILURES=3, LOGIN_FAILURE_WINDOW=60)
def test_bad_tokens_are_throttled(
    researcher: Any, persona_tokens: Any, security_figures: Any
) -> None:
    client = Client(HTTP_AUTHORIZATION="Token " + "f" * 40, REMOTE_ADDR="10.2.2.2")
    assert [client.get("/api/v1/me/").status_code for _ in range(3)] == [401, 401, 401]
    throttled = client.get("/api/v1/me/")
    assert throttled.status_code == 429
    assert set(throttled.json()) == {"message", "extra"}
    good = Client(
        HTTP_AUTHORIZATION=f"Token {persona_tokens['researcher']}", REMOTE_ADDR="10.3.3.3"
    )
    assert good.get("/api/v1/me/").status_code == 200
    security_figures.add("deploy.checks")


# ---------------------------------------------------------------- CSRF

POST_TARGETS = [
    ("login", {}, {"username": "x", "password": "y"}),
    ("logout", {}, {}),
    ("job-new", {}, {"name": "x"}),
    ("node-drain", {"node_id": "node"}, {"reason": "x"}),
    ("node-resume", {"node_id": "node"}, {}),
    ("cluster-sync", {"cluster_id": "cluster"}, {}),
    ("job-cancel", {"job_id": "job"}, {}),
    ("job-resume", {"job_id": "job", "checkpoint_id": "checkpoint"}, {}),
    ("drill-cancel", {"drill_id": "drill"}, {}),
    ("checkpoint-drill", {"checkpoint_id": "checkpoint"}, {}),
    ("checkpoint-verify", {"checkpoint_id": "checkpoint"}, {}),
    ("drill-policy", {"cluster_id": "cluster"}, {}),
]


def test_every_form_target_refuses_a_post_without_the_token(
    world: dict[str, Any], operator: Any, security_figures: Any
) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    for name, kwargs, data in POST_TARGETS:
        values = {key: world[source].pk for key, source in kwargs.items()}
        response = client.post(reverse(name, kwargs=values or None), data)
        assert response.status_code == 403, (name, response.status_code)
        security_figures.add("csrf.forms")
        security_figures.add("deploy.checks")
    # Admin forms too.
    response = client.post(f"/admin/nodes/cluster/{world['cluster'].pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
    security_figures.add("csrf.forms")


def test_every_post_form_in_the_templates_has_the_token(security_figures: Any) -> None:
    templates = Path(REPO / "templates")
    missing = []
    for path in templates.rglob("*.html"):
        text = path.read_text()
        lowered = text.lower()
        forms = lowered.count('method="post"')
        if forms and lowered.count("{% csrf_token %}") < forms:
            missing.append(str(path.relative_to(REPO)))
        security_figures.add("deploy.checks")
    assert not missing, f"POST forms without {{% csrf_token %}}: {missing}"


def test_session_authenticated_api_post_needs_csrf(
    world: dict[str, Any], researcher: Any, security_figures: Any
) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(researcher)
    response = client.post("/api/v1/jobs/preview/", data="{}", content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["message"]
    assert set(response.json()) == {"message", "extra"}
    security_figures.add("csrf.forms")
    security_figures.add("deploy.checks")


# ---------------------------------------------------------------- TLS


@override_settings(
    SECURE_SSL_REDIRECT=True,
    SECURE_HSTS_SECONDS=31536000,
    SECURE_HSTS_INCLUDE_SUBDOMAINS=True,
    SESSION_COOKIE_SECURE=True,
    CSRF_COOKIE_SECURE=True,
)
def test_tls_headers_and_secure_cookies(researcher: Any, security_figures: Any) -> None:
    client = Client()
    plain = client.get("/accounts/login/")
    assert plain.status_code == 301
    assert plain.headers["Location"].startswith("https://")
    page = client.get("/accounts/login/", secure=True)
    assert page.status_code == 200
    assert page.headers["Strict-Transport-Security"].startswith("max-age=31536000")
    assert "includeSubDomains" in page.headers["Strict-Transport-Security"]
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.cookies["csrftoken"]["secure"]
    logged_in = client.post(
        "/accounts/login/",
        {"username": researcher.username, "password": "correct-horse-battery"},
        secure=True,
    )
    assert logged_in.status_code == 302
    session = logged_in.cookies["sessionid"]
    assert session["secure"] and session["httponly"]
    security_figures.add("deploy.checks", 8)


def test_production_settings_turn_tls_on(tmp_path: Path, security_figures: Any) -> None:
    """The real settings module with DEBUG off and GANTRY_TLS=true (a subprocess: settings
    are read once per process)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DEBUG": "false",
        "GANTRY_TLS": "true",
        "SECRET_KEY": "x" * 60,
        "ALLOWED_HOSTS": "gantry.example.org",
        "GANTRY_DATA_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
    }
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, "
        "s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, s.SESSION_COOKIE_HTTPONLY, "
        "s.CACHES['ratelimit']['BACKEND'].rsplit('.', 1)[-1])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "True",
        "True",
        "True",
        "31536000",
        "True",
        "True",
        "RedisCache",
    ]
    security_figures.add("deploy.checks")


@pytest.mark.parametrize("path", ["/api/v1/me/", "/"])
def test_outsider_is_told_why(path: str, outsider: Any) -> None:
    client = Client()
    client.force_login(outsider)
    response = client.get(path)
    assert response.status_code in {200, 403}
    if path == "/":
        assert response.status_code == 403
        assert "researcher or operator role" in response.content.decode()
