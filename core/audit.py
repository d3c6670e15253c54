"""The audit log: who did what to which object. One event per operator action.

Actions are a fixed set of names (``AuditAction``), defined here and imported everywhere,
so the log can be filtered by a name that cannot drift between the place that writes it
and the place that reads it.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from core.models import AuditEvent
from core.types import Actor


class AuditAction(models.TextChoices):
    CLUSTER_REGISTER = "cluster.register"
    CLUSTER_UPDATE = "cluster.update"
    CLUSTER_PROBE = "cluster.probe"
    CLUSTER_SYNC_REQUEST = "cluster.sync_request"
    CLUSTER_DELETE = "cluster.delete"
    CLUSTER_USER_AUTH = "cluster.user_auth"
    CLUSTER_USER_CA_CREATE = "cluster.user_ca_create"
    CLUSTER_USER_CA_ROTATE = "cluster.user_ca_rotate"
    CLUSTER_USER_CA_ROTATE_FINISH = "cluster.user_ca_rotate_finish"
    CLUSTER_IDENTITY_SET = "cluster_identity.set"
    CLUSTER_IDENTITY_DELETE = "cluster_identity.delete"
    NODE_DRAIN = "node.drain"
    NODE_RESUME = "node.resume"
    JOB_SUBMIT = "job.submit"
    JOB_RESUME = "job.resume"
    JOB_CANCEL = "job.cancel"
    JOB_DELETE = "job.delete"
    JOB_HOLD = "job.hold"
    JOB_RELEASE = "job.release"
    JOB_TEMPLATE_CREATE = "job_template.create"
    JOB_TEMPLATE_UPDATE = "job_template.update"
    JOB_TEMPLATE_DELETE = "job_template.delete"
    CHECKPOINT_VERIFY = "checkpoint.verify"
    DRILL_START = "drill.start"
    DRILL_CANCEL = "drill.cancel"
    DRILL_DELETE = "drill.delete"
    DRILL_POLICY_UPDATE = "drill_policy.update"
    DRILL_BUDGET_UPDATE = "drill_budget.update"
    STUDY_CREATE = "study.create"
    # Action names, not secrets (ruff's S105 goes by the word "token").
    API_TOKEN_CREATE = "api_token.create"  # noqa: S105
    API_TOKEN_REVOKE = "api_token.revoke"  # noqa: S105
    NOTIFICATION_SUBSCRIBE = "notification.subscribe"
    NOTIFICATION_UNSUBSCRIBE = "notification.unsubscribe"
    # Gantry's own recovery acting on a job (actor: none), and operators' recovery actions.
    RECOVERY_CANCEL = "recovery.cancel"
    RECOVERY_RESUME = "recovery.resume"
    RECOVERY_POLICY_UPDATE = "recovery_policy.update"
    SUSPECT_NODE_CLEAR = "suspect_node.clear"
    # Gantry itself naming a node suspect of silent data corruption (``recovery.sdc``).
    SUSPECT_NODE_SDC = "suspect_node.sdc"
    # Where a cluster's health probes are collected from (operators), and a collection that
    # changed nodes' health (Gantry itself; placement reads the health).
    HEALTH_SOURCE_UPDATE = "health_source.update"
    HEALTH_COLLECT = "health.collect"
    ACCEPTANCE_START = "acceptance.start"
    ACCEPTANCE_CANCEL = "acceptance.cancel"


def audit_event_record(
    *,
    actor: Actor,
    action: str,
    target: models.Model | None = None,
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """Write one audit event. Call inside the service's transaction."""
    # None is Gantry itself (recovery, the command line), recorded as "system".
    signed_in = actor if actor is not None and actor.is_authenticated else None
    return AuditEvent.objects.create(
        actor=signed_in,
        actor_name=signed_in.get_username() if signed_in is not None else "system",
        action=str(action),
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:255] if target is not None else "",
        details=details or {},
    )
