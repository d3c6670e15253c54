"""Writes of the core: personal API tokens.

A token's secret is generated here, returned once to the caller that shows it, and never
stored, logged or put in an audit event: only its SHA-256 and its first characters are kept.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.audit import AuditAction, audit_event_record
from core.errors import FieldError
from core.models import ApiToken
from core.roles import is_operator
from core.selectors import api_token_get_for_user
from core.types import User

NAME_MAX_LENGTH = 64
MAX_LIFETIME = timedelta(days=365)
# last_used_at is for people ("used 3 minutes ago"), so a minute's precision is plenty and
# saves a database write on almost every API call.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def _check_token_input(*, name: str, expires_at: datetime | None, now: datetime) -> str:
    name = name.strip()
    if not name:
        raise FieldError("name", "A name is required, e.g. the machine or script using it.")
    if len(name) > NAME_MAX_LENGTH:
        raise FieldError("name", f"At most {NAME_MAX_LENGTH} characters.")
    if expires_at is not None:
        if timezone.is_naive(expires_at):
            raise FieldError("expires_at", "The expiry needs a time zone.")
        if expires_at <= now:
            raise FieldError("expires_at", "The expiry must be in the future.")
        if expires_at > now + MAX_LIFETIME:
            raise FieldError("expires_at", f"At most {MAX_LIFETIME.days} days from now.")
    return name


def api_token_create(*, user: User, name: str, expires_at: datetime | None) -> tuple[ApiToken, str]:
    """A new token for ``user``; returns it with its secret, which exists only in the
    return value: show it once and drop it."""
    now = timezone.now()
    name = _check_token_input(name=name, expires_at=expires_at, now=now)
    secret = ApiToken.SECRET_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user,
            name=name,
            prefix=secret[: ApiToken.SHOWN_PREFIX_LENGTH],
            key_hash=ApiToken.hash_secret(secret),
            expires_at=expires_at,
        )
        audit_event_record(
            actor=user,
            action=AuditAction.API_TOKEN_CREATE,
            target=token,
            details={
                "name": token.name,
                "prefix": token.prefix,
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
        )
    return token, secret


def _revoke(*, actor: User, token: ApiToken) -> ApiToken:
    now = timezone.now()
    with transaction.atomic():
        # Revoked already (twice-clicked button, another tab, an operator): nothing to do,
        # and no second audit event.
        if not ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now):
            token.refresh_from_db(fields=["revoked_at"])
            return token
        token.revoked_at = now
        audit_event_record(
            actor=actor,
            action=AuditAction.API_TOKEN_REVOKE,
            target=token,
            details={"name": token.name, "prefix": token.prefix, "owner": token.user_id},
        )
    return token


def api_token_revoke(*, user: User, token_id: Any) -> ApiToken:
    """Revoke one of ``user``'s own tokens; someone else's is not found (Http404)."""
    token = api_token_get_for_user(user=user, token_id=token_id)
    return _revoke(actor=user, token=token)


def api_token_revoke_by_operator(*, actor: User, token: ApiToken) -> ApiToken:
    """An operator revokes anyone's token (the admin's action), e.g. one that leaked."""
    if not is_operator(actor):
        raise PermissionDenied("Only operators may revoke other people's tokens.")
    return _revoke(actor=actor, token=token)


def api_token_record_use(*, token: ApiToken, now: datetime | None = None) -> None:
    """Note that ``token`` was just used, at most once per ``LAST_USED_RESOLUTION``."""
    now = now or timezone.now()
    if token.last_used_at is not None and now - token.last_used_at < LAST_USED_RESOLUTION:
        return
    # Conditional: of the workers that saw the same stale value, only the first writes.
    ApiToken.objects.filter(pk=token.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
    ).update(last_used_at=now)
    token.last_used_at = now
