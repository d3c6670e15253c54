"""Reads of the core: personal API tokens."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404

from core.models import ApiToken
from core.prepared import PreparedRead
from core.roles import remember_roles, role_annotations
from core.types import User


def api_token_list_for_user(*, user: User) -> QuerySet[ApiToken]:
    """A person's own tokens, newest first. Nobody lists anyone else's here, operators
    included (they have the admin)."""
    if not getattr(user, "is_authenticated", False):
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user_id=user.pk)


def api_token_get_for_user(*, user: User, token_id: Any) -> ApiToken:
    """The one access check for a token: Http404 both for a missing token and for someone
    else's, so a token id says nothing about who owns it."""
    try:
        return api_token_list_for_user(user=user).get(pk=int(token_id))
    except (ApiToken.DoesNotExist, ValueError, TypeError):
        raise Http404("No such token.") from None


def _token_with_roles(*, legacy: bool) -> PreparedRead:
    def build(key_hash: str) -> QuerySet[ApiToken]:
        return (
            ApiToken.objects.select_related("user")
            .annotate(**role_annotations("user_id"))
            .filter(key_hash=key_hash, legacy=legacy)
        )

    # No hash is this: hashes are hex digests.
    return PreparedRead(build, key_hash="<the token's hash>")


_TOKEN_WITH_ROLES = {legacy: _token_with_roles(legacy=legacy) for legacy in (False, True)}


def api_token_find_by_secret(*, secret: str) -> ApiToken | None:
    """The token whose secret this is, whatever its state (the caller tells expired and
    revoked apart), or None. Looked up by hash: the secret itself is stored nowhere.

    One query brings the token, its user and the user's two roles. A secret without the
    ``gty_`` prefix can only be a legacy key (a converted DRF authtoken key,
    ``ApiToken.legacy``) and matches legacy tokens only; the prefix, tokens made here only.
    """
    legacy = not secret.startswith(ApiToken.SECRET_PREFIX)
    if legacy and not ApiToken.could_be_legacy_key(secret):
        return None
    # Compiled once (``core.prepared``): every API request with a token reads it.
    token = _TOKEN_WITH_ROLES[legacy].first(key_hash=ApiToken.hash_secret(secret))
    if token is not None:
        # The roles of its user came with it (one query for the caller's whole identity).
        remember_roles(token.user, token)
    return token
