"""Webhook signing secrets: made, kept encrypted, used to sign.

A receiver checks ``X-Gantry-Signature: sha256=<hex>``, the HMAC-SHA256 of the raw request
body under the secret it was shown when the subscription was created. The body holds the
event id and the send time (also in ``X-Gantry-Event-Id`` and ``X-Gantry-Timestamp``), so a
receiver can refuse replays and drop a second copy of an event it already handled.

Unlike an API token the secret cannot be stored as a hash: Gantry needs it to sign. It is
encrypted (Fernet: AES-128-CBC with HMAC-SHA256) with a key derived from ``SECRET_KEY``;
keys in ``SECRET_KEY_FALLBACKS`` still decrypt, so rotating ``SECRET_KEY`` the Django way
keeps existing webhooks working.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

# Tells a Gantry webhook secret apart (and lets secret scanners recognise a leaked one).
SECRET_PREFIX = "gwhsec_"  # noqa: S105 - a prefix, not a secret
SHOWN_PREFIX_LENGTH = 11
SIGNATURE_HEADER = "X-Gantry-Signature"


class SecretUnreadable(Exception):
    """The stored secret does not decrypt with SECRET_KEY or its fallbacks."""


def secret_new() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _fernet(key: str) -> Fernet:
    digest = hashlib.sha256(b"gantry webhook secret\x00" + key.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _keys() -> MultiFernet:
    keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return MultiFernet([_fernet(key) for key in keys])


def secret_encrypt(secret: str) -> str:
    return _keys().encrypt(secret.encode()).decode()


def secret_decrypt(token: str) -> str:
    try:
        return _keys().decrypt(token.encode()).decode()
    except (InvalidToken, ValueError):
        raise SecretUnreadable(
            "the signing secret cannot be decrypted (was SECRET_KEY changed without keeping "
            "the old one in SECRET_KEY_FALLBACKS?); create the subscription again"
        ) from None


def signature(secret: str, body: bytes) -> str:
    """The header value: ``sha256=`` and the hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_valid(secret: str, body: bytes, header: str) -> bool:
    """What a receiver does (and the tests): compare in constant time."""
    return hmac.compare_digest(signature(secret, body), header)
