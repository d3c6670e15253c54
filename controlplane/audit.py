from __future__ import annotations

from typing import Any

from django.db import models

from controlplane.models import AuditEvent


def audit_event_record(
    *,
    actor: Any,
    action: str,
    target: models.Model | None = None,
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """Write one audit event. Call inside the service's transaction."""
    authenticated = actor is not None and getattr(actor, "is_authenticated", False)
    return AuditEvent.objects.create(
        actor=actor if authenticated else None,
        actor_name=actor.get_username() if authenticated else "system",
        action=action,
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:255] if target is not None else "",
        details=details or {},
    )
