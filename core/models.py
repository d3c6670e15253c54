from __future__ import annotations

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
