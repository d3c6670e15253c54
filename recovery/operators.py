"""Operators' recovery actions: the cluster's recovery policy, clearing suspect nodes.
Both audited."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from core.audit import AuditAction, audit_event_record
from core.cluster_settings import cluster_settings_update
from core.roles import is_operator
from core.types import User
from nodes.models import Cluster, Node
from recovery.models import RecoveryPolicy, SuspectNode

POLICY_FIELDS = (
    "enabled",
    "max_attempts",
    "gpu_hours_budget",
    "on_hang",
    "exclude_suspects",
    "hang_factor",
    "hang_floor_seconds",
    "loss_spike_factor",
    "startup_grace_seconds",
    "state_exact_resume",
    "cancel_deadline_seconds",
    "node_view_deadline_seconds",
    "proving_start_deadline_seconds",
)


def recovery_policy_update(*, actor: User, cluster: Cluster, **values: Any) -> RecoveryPolicy:
    """Change a cluster's recovery policy (operators only), validated and audited with the
    values before and after."""
    return cluster_settings_update(
        actor=actor,
        model=RecoveryPolicy,
        cluster=cluster,
        fields=POLICY_FIELDS,
        values=values,
        action=AuditAction.RECOVERY_POLICY_UPDATE,
        what="recovery policies",
    )


def suspect_node_clear(*, actor: User, node: Node, why: str = "") -> int:
    """An operator clears a node's suspicions (it was repaired, or the evidence was wrong):
    later recoveries no longer exclude it. Audited; returns how many were cleared."""
    if not is_operator(actor):
        raise PermissionDenied("Only operators may clear suspect nodes.")
    now = timezone.now()
    with transaction.atomic():
        cleared = SuspectNode.objects.filter(node=node, cleared_at__isnull=True).update(
            cleared_at=now, cleared_by=actor
        )
        if cleared:
            audit_event_record(
                actor=actor,
                action=AuditAction.SUSPECT_NODE_CLEAR,
                target=node,
                details={"node": node.name, "cleared": cleared, "why": why[:500]},
            )
    return cleared
