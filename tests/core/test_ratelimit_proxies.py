"""Throttling behind the TLS proxy: every request arrives from the proxy's address, so the
client is read from X-Forwarded-For, but only when the proxy is a trusted one. One client's
bad passwords or tokens then throttle that client (and the account it attacks), not
everyone; and a client that forges the header cannot dodge its own throttle.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, RequestFactory

from controlplane.env import envproxies
from core.ratelimit import client_address
from core.services import api_token_create

pytestmark = pytest.mark.django_db

PROXY = "10.0.0.1"
CLIENT_A = "203.0.113.5"
CLIENT_B = "198.51.100.7"
PASSWORD = "correct-horse-battery"
LOGIN_LIMIT = 5
TOKEN_LIMIT = 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> Iterator[None]:
    caches["ratelimit"].clear()
    yield
    caches["ratelimit"].clear()


@pytest.fixture
def behind_proxy(settings: Any) -> Any:
    """The documented deployment: the proxy (and a second hop) in GANTRY_TRUSTED_PROXIES,
    the limits at their defaults."""
    settings.TRUSTED_PROXIES = [ipaddress.ip_network("10.0.0.0/24")]
    settings.LOGIN_MAX_FAILURES = LOGIN_LIMIT
    settings.TOKEN_MAX_FAILURES = TOKEN_LIMIT
    settings.LOGIN_FAILURE_WINDOW = 300
    return settings


def login(username: str, password: str, *, peer: str = PROXY, forwarded: str | None = None) -> int:
    extra = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    response = Client().post(
        "/accounts/login/", {"username": username, "password": password}, **extra
    )
    return int(response.status_code)


def api_me(token: str, *, peer: str = PROXY, forwarded: str | None = None) -> int:
    extra = {"REMOTE_ADDR": peer, "HTTP_AUTHORIZATION": f"Token {token}"}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return int(Client(**extra).get("/api/v1/me/").status_code)


# ---------------------------------------------------------------- the client address


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        # Not from a trusted proxy: the header is the sender's own claim.
        ("192.0.2.9", CLIENT_A, "192.0.2.9"),
        (PROXY, None, PROXY),
        (PROXY, "", PROXY),
        (PROXY, CLIENT_A, CLIENT_A),
        # Left of what the proxy appended is what the client wrote: ignored.
        (PROXY, f"1.2.3.4, {CLIENT_A}", CLIENT_A),
        # Two trusted hops: the right-most address that is not a proxy.
        (PROXY, f"1.2.3.4, {CLIENT_A}, 10.0.0.2", CLIENT_A),
        (PROXY, "10.0.0.3, 10.0.0.2", "10.0.0.3"),
        # Not an address where the proxy writes one: the proxy's own stands in.
        (PROXY, f"{CLIENT_A}, not-an-address", PROXY),
        (PROXY, f"{CLIENT_A}, ", PROXY),
        # Forms proxies write.
        (PROXY, f"{CLIENT_A}:50123", CLIENT_A),
        (PROXY, "[2001:db8::7]:443", "2001:db8::7"),
        (PROXY, f"::ffff:{CLIENT_A}", CLIENT_A),
        (f"::ffff:{PROXY}", CLIENT_B, CLIENT_B),
        ("", CLIENT_A, "unknown"),
    ],
)
def test_the_client_address(behind_proxy: Any, peer: str, forwarded: str, expected: str) -> None:
    extra = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    assert client_address(RequestFactory().get("/", **extra)) == expected


def test_without_trusted_proxies_the_header_is_ignored(settings: Any) -> None:
    settings.TRUSTED_PROXIES = []
    request = RequestFactory().get("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=CLIENT_A)
    assert client_address(request) == PROXY


# ---------------------------------------------------------------- logins


def test_five_bad_passwords_from_one_client_lock_neither_another_client_nor_account(
    behind_proxy: Any, researcher: Any, other_researcher: Any, operator: Any
) -> None:
    for _ in range(LOGIN_LIMIT):
        assert login(researcher.username, "wrong", forwarded=CLIENT_A) == 200
    # The attacked account is locked for everyone, and the attacker's address for every
    # account (even with the right password)...
    assert login(researcher.username, PASSWORD, forwarded=CLIENT_A) == 429
    assert login(researcher.username, PASSWORD, forwarded=CLIENT_B) == 429
    assert login(other_researcher.username, PASSWORD, forwarded=CLIENT_A) == 429
    # ...but another client, through the same proxy, signs in to another account.
    assert login(other_researcher.username, PASSWORD, forwarded=CLIENT_B) == 302
    assert login(operator.username, PASSWORD, forwarded=f"{CLIENT_B}, 10.0.0.2") == 302


def test_a_forged_forwarded_for_does_not_dodge_the_throttle(
    behind_proxy: Any, other_researcher: Any
) -> None:
    attacker = "192.0.2.66"
    # Straight to Gantry, not through the proxy: a fresh X-Forwarded-For per attempt, and
    # a fresh user name (so only the address can stop it).
    for attempt in range(LOGIN_LIMIT):
        assert login(f"guess{attempt}", "x", peer=attacker, forwarded=f"10.0.0.{attempt}") == 200
    assert login(other_researcher.username, PASSWORD, peer=attacker, forwarded=CLIENT_B) == 429
    # Another attacker, through the proxy, with forged entries in front of the address the
    # proxy appends.
    attacker = "192.0.2.67"
    for attempt in range(LOGIN_LIMIT):
        assert login(f"again{attempt}", "x", forwarded=f"198.18.0.{attempt}, {attacker}") == 200
    assert login(other_researcher.username, PASSWORD, forwarded=f"{CLIENT_B}, {attacker}") == 429
    # The client it pretended to be is untouched.
    assert login(other_researcher.username, PASSWORD, forwarded=CLIENT_B) == 302


def test_an_ipv6_client_is_counted_per_64(settings: Any, other_researcher: Any) -> None:
    settings.LOGIN_MAX_FAILURES = LOGIN_LIMIT
    for host in range(1, LOGIN_LIMIT + 1):
        assert login(f"guess{host}", "x", peer=f"2001:db8:1:2::{host:x}") == 200
    assert login(other_researcher.username, PASSWORD, peer="2001:db8:1:2:ffff::1") == 429
    assert login(other_researcher.username, PASSWORD, peer="2001:db8:1:3::1") == 302


# ---------------------------------------------------------------- API tokens


def test_bad_tokens_from_one_client_do_not_throttle_another(
    behind_proxy: Any, researcher: Any
) -> None:
    _, secret = api_token_create(user=researcher, name="laptop", expires_at=None)
    bad = "gty_" + "x" * 43
    codes = [api_me(bad, forwarded=CLIENT_A) for _ in range(TOKEN_LIMIT)]
    assert codes == [401] * TOKEN_LIMIT
    assert api_me(secret, forwarded=CLIENT_A) == 429
    # Another client through the same proxy: a bad token is a plain 401, a good one works.
    assert api_me(bad, forwarded=CLIENT_B) == 401
    assert api_me(secret, forwarded=CLIENT_B) == 200


def test_bad_tokens_with_forged_forwarded_for_are_throttled(
    behind_proxy: Any, researcher: Any
) -> None:
    _, secret = api_token_create(user=researcher, name="laptop", expires_at=None)
    attacker = "192.0.2.77"
    for attempt in range(TOKEN_LIMIT):
        assert api_me("gty_forged", peer=attacker, forwarded=f"198.18.1.{attempt}") == 401
    assert api_me(secret, peer=attacker, forwarded=CLIENT_B) == 429
    assert api_me(secret, forwarded=CLIENT_B) == 200


# ---------------------------------------------------------------- the setting


def test_trusted_proxies_are_read_from_the_environment() -> None:
    assert envproxies("P", environ={}) == []
    assert envproxies("P", environ={"P": "127.0.0.1, 10.0.0.0/8, ::1, fd00::/48"}) == [
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
        ipaddress.ip_network("fd00::/48"),
    ]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("proxy.example.org", "is not an IP address or CIDR network"),
        ("10.0.0.1/33", "is not an IP address or CIDR network"),
        # Host bits under the prefix: a typo more likely than a wish.
        ("10.0.0.1/24", "is not an IP address or CIDR network"),
        ("127.0.0.1, junk", "'junk' is not an IP address"),
        ("0.0.0.0/0", "wider than /8"),
        ("::/0", "wider than /32"),
        ("10.0.0.0/7", "wider than /8"),
    ],
)
def test_trusted_proxies_refuse_junk(raw: str, why: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=f"GANTRY_TRUSTED_PROXIES: .*{why}"):
        envproxies("GANTRY_TRUSTED_PROXIES", environ={"GANTRY_TRUSTED_PROXIES": raw})


def test_junk_trusted_proxies_stop_start_up() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings_test",
        "GANTRY_TRUSTED_PROXIES": "0.0.0.0/0",
    }
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "GANTRY_TRUSTED_PROXIES: 0.0.0.0/0 is wider than /8" in result.stderr
