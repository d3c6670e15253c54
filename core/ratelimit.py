"""Login throttling: a few failed attempts per user name and per client address per window;
and bad API tokens per client address.

The client address is REMOTE_ADDR, the direct peer. Behind a reverse proxy that is the
proxy's, shared by every client, so one person's failures would throttle everyone: when the
peer is one of ``GANTRY_TRUSTED_PROXIES``, the client is the right-most X-Forwarded-For
address that is not itself a trusted proxy (the one the nearest untrusted hop connected
from; what lies further left the client wrote itself). A header from any other peer is
ignored: a client may not pick a fresh address per attempt. IPv6 clients are counted per
/64, the least a network hands one customer.

Counters live in the ``ratelimit`` cache (Redis in production, so every gunicorn worker
sees the same counts; a per-process cache would multiply the limit by the number of
workers). If the cache is down, logins are not blocked: refusing every login because
Redis restarted would be worse than a short window without throttling, and it is logged.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed, Throttled

from core.models import ApiToken

logger = logging.getLogger(__name__)

CACHE_ALIAS = "ratelimit"


def _key(kind: str, value: str) -> str:
    digest = hashlib.sha256(value.strip().lower().encode()).hexdigest()[:32]
    return f"gantry:ratelimit:{kind}:{digest}"


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# An IPv6 client may use every address of its /64: counted as one.
IPV6_CLIENT_PREFIX = 64


def _parse_address(value: str) -> IPAddress | None:
    """An address as a proxy may write it (``192.0.2.1``, ``192.0.2.1:443``,
    ``[2001:db8::1]:443``, ``::ffff:192.0.2.1``), or None when it is none."""
    text = value.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted_proxy(address: IPAddress) -> bool:
    return any(
        address.version == network.version and address in network
        for network in settings.TRUSTED_PROXIES
    )


def client_address(request: HttpRequest) -> str:
    """Who sent ``request``: REMOTE_ADDR, or behind a trusted proxy the right-most
    X-Forwarded-For address that is not a trusted proxy (see the module docstring)."""
    peer = _parse_address(str(request.META.get("REMOTE_ADDR") or ""))
    if peer is None:
        return "unknown"
    if not _trusted_proxy(peer):
        return str(peer)
    forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR") or "")
    if not forwarded.strip():
        return str(peer)
    for hop in reversed(forwarded.split(",")):
        address = _parse_address(hop)
        if address is None:
            # Not an address where a trusted proxy writes one: the nearest proxy stands
            # in (a bucket shared with others, never one the sender chose).
            return str(peer)
        if not _trusted_proxy(address):
            return str(address)
        peer = address
    return str(peer)


def _address_key(kind: str, address: str) -> str:
    parsed = _parse_address(address)
    if isinstance(parsed, ipaddress.IPv6Address):
        address = str(ipaddress.IPv6Network((parsed, IPV6_CLIENT_PREFIX), strict=False))
    return _key(kind, address)


class FailureCounter:
    def __init__(self, *, max_failures: int, window_seconds: int) -> None:
        self.max_failures = max_failures
        self.window_seconds = window_seconds

    def _count(self, key: str) -> int:
        try:
            return int(caches[CACHE_ALIAS].get(key) or 0)
        except Exception:
            logger.warning("rate-limit cache unavailable; not throttling", exc_info=True)
            return 0

    def blocked(self, *keys: str) -> bool:
        return any(self._count(key) >= self.max_failures for key in keys)

    def fail(self, *keys: str) -> None:
        cache = caches[CACHE_ALIAS]
        for key in keys:
            try:
                # add() starts the window; incr() keeps its expiry.
                if not cache.add(key, 1, timeout=self.window_seconds):
                    cache.incr(key)
            except ValueError:
                cache.set(key, 1, timeout=self.window_seconds)
            except Exception:
                logger.warning("rate-limit cache unavailable; not counting", exc_info=True)

    def reset(self, *keys: str) -> None:
        try:
            caches[CACHE_ALIAS].delete_many(list(keys))
        except Exception:
            logger.warning("rate-limit cache unavailable; not resetting", exc_info=True)


def login_counter() -> FailureCounter:
    return FailureCounter(
        max_failures=settings.LOGIN_MAX_FAILURES, window_seconds=settings.LOGIN_FAILURE_WINDOW
    )


LOCKED_MESSAGE = (
    "Too many failed log-in attempts for this user name or from this address; "
    "wait {minutes} minutes and try again."
)


class RateLimitedLoginView(auth_views.LoginView):
    """Django's login view, answering 429 with a clear message after too many failures."""

    template_name = "registration/login.html"

    def _keys(self, request: HttpRequest) -> tuple[str, str]:
        username = str(request.POST.get("username", ""))
        return _key("user", username), _address_key("ip", client_address(request))

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        counter = login_counter()
        if counter.blocked(*self._keys(request)):
            logger.warning(
                "login throttled for %r from %s",
                str(request.POST.get("username", ""))[:64],
                client_address(request),
            )
            form = self.get_form()
            minutes = max(1, counter.window_seconds // 60)
            form.add_error(None, LOCKED_MESSAGE.format(minutes=minutes))
            response = self.render_to_response(self.get_context_data(form=form))
            response.status_code = 429
            response["Retry-After"] = str(counter.window_seconds)
            return response
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        login_counter().fail(*self._keys(self.request))
        return super().form_invalid(form)

    def form_valid(self, form: Any) -> HttpResponse:
        user_key, _ = self._keys(self.request)
        login_counter().reset(user_key)
        return super().form_valid(form)


class ThrottledTokenAuthentication(TokenAuthentication):
    """Token auth that stops answering a client address after many bad tokens (429).

    ``Authorization: Token <secret>`` takes a personal token (``core.models.ApiToken``,
    made at /account/tokens/): a ``gty_`` secret, or a legacy key (a DRF authtoken key an
    operator made in the admin before, converted by migration core 0004). The token, its
    user and the user's roles come in one query (``core.selectors.api_token_find_by_secret``):
    a role check then costs no query of its own. A wrong, expired or revoked token is a 401
    and counts as a bad token for the address.
    """

    # DRF's default would be rest_framework.authtoken's Token, which is not installed.
    model = ApiToken

    def authenticate_credentials(self, key: str) -> Any:
        # Imported here: DRF imports this class while rest_framework.views is first being
        # imported, which core.services does (through core.errors) before it is complete.
        from core.selectors import api_token_find_by_secret
        from core.services import api_token_record_use

        token = api_token_find_by_secret(secret=key)
        if token is None:
            raise AuthenticationFailed("Invalid token.")
        now = timezone.now()
        status = token.status_at(now)
        if status == ApiToken.Status.REVOKED:
            raise AuthenticationFailed("Token revoked.")
        if status == ApiToken.Status.EXPIRED:
            raise AuthenticationFailed("Token expired.")
        if not token.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        api_token_record_use(token=token, now=now)
        return token.user, token

    def authenticate(self, request: Any) -> Any:
        counter = FailureCounter(
            max_failures=settings.TOKEN_MAX_FAILURES, window_seconds=settings.LOGIN_FAILURE_WINDOW
        )
        key = _address_key("token-ip", client_address(request))
        # Only a request that brings a token is refused (and costs a look at the counter).
        if request.META.get("HTTP_AUTHORIZATION") and counter.blocked(key):
            raise Throttled(
                wait=counter.window_seconds,
                detail="Too many requests with invalid tokens from this address.",
            )
        try:
            return super().authenticate(request)
        except AuthenticationFailed:
            counter.fail(key)
            raise
