from __future__ import annotations

import hashlib
from datetime import datetime

from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """Who did what to which object, and when. Written by services, never edited."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="audit_events",
    )
    # Kept as text too, so the log still reads right after a user is deleted.
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64, db_index=True, help_text="e.g. node.drain")
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_repr = models.CharField(max_length=255, blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        # The table kept its name when the model moved here from the controlplane app.
        db_table = "controlplane_auditevent"
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id", "-at"], name="audit_target")]

    def __str__(self) -> str:
        who = self.actor_name or "system"
        return f"{self.at:%Y-%m-%d %H:%M:%S} {who} {self.action} {self.target_repr}"


class ApiToken(models.Model):
    """A personal API token. Only the SHA-256 of its secret is kept; the secret is shown
    once, when the token is created (``core.services.api_token_create``)."""

    # Lets secret scanners recognise a leaked token, and tells a token made here from a
    # legacy key (below) without a lookup.
    SECRET_PREFIX = "gty_"  # noqa: S105
    # The first characters of the secret, shown in lists so a person can tell tokens
    # apart; "gty_" plus four random characters reveals too little to guess the rest.
    SHOWN_PREFIX_LENGTH = 8
    # Legacy keys: the DRF authtoken keys (40 hex digits, no prefix) that operators made in
    # the admin before Gantry had its own tokens. Migration core 0004 turned each into a
    # row here flagged ``legacy``, hashed like any secret, so clients keep sending the key
    # they have. A legacy key is never longer than DRF's key column; a longer secret
    # without the prefix is no token at all. Only the first four characters are shown,
    # as few random ones as a personal token shows after its prefix.
    LEGACY_KEY_MAX_LENGTH = 40
    LEGACY_SHOWN_PREFIX_LENGTH = 4

    class Status(models.TextChoices):
        ACTIVE = "active"
        EXPIRED = "expired"
        REVOKED = "revoked"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=64)
    prefix = models.CharField(max_length=SHOWN_PREFIX_LENGTH)
    key_hash = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the secret, hex")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    legacy = models.BooleanField(
        default=False,
        help_text="Converted from a DRF authtoken key: its secret has no gty_ prefix.",
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def hash_secret(secret: str) -> str:
        # A fast hash is enough: the secret has 256 bits of randomness (a legacy key 160),
        # so there is no dictionary to try, unlike a password.
        return hashlib.sha256(secret.encode()).hexdigest()

    @classmethod
    def could_be_legacy_key(cls, secret: str) -> bool:
        """Whether ``secret`` has the shape of a legacy key (no prefix, not too long);
        anything else without the prefix is refused without a lookup."""
        return not secret.startswith(cls.SECRET_PREFIX) and len(secret) <= cls.LEGACY_KEY_MAX_LENGTH

    def status_at(self, now: datetime) -> str:
        if self.revoked_at is not None:
            return self.Status.REVOKED
        if self.expires_at is not None and self.expires_at <= now:
            return self.Status.EXPIRED
        return self.Status.ACTIVE
