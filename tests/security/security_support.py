"""Helpers shared by the security tests (importable: conftest puts this folder on sys.path)."""

from __future__ import annotations

import json

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519


def error_shape_problem(status: int, content_type: str, body: bytes) -> str | None:
    """Why a 4xx/5xx body is not ``{"message": str, "extra": object}`` (None when it is)."""
    if status < 400:
        return None
    if "json" not in content_type:
        return f"{status} with content type {content_type!r}"
    try:
        data = json.loads(body)
    except ValueError:
        return f"{status} body is not JSON: {body[:120]!r}"
    if not isinstance(data, dict) or set(data) != {"message", "extra"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        return f"{status} body keys {keys}"
    if not isinstance(data["message"], str) or not data["message"]:
        return f"{status} message is not a non-empty string"
    if not isinstance(data["extra"], dict):
        return f"{status} extra is not an object"
    return None


def make_private_key_text() -> str:
    """A fresh, unencrypted OpenSSH ed25519 private key, as an operator would paste it."""
    key = ed25519.Ed25519PrivateKey.generate()
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
