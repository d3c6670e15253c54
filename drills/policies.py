"""Scheduled restore drills: per-cluster policies set by operators, applied by beat."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.utils import timezone

from core.audit import AuditAction
from core.cluster_settings import cluster_settings_update
from core.errors import ApplicationError
from core.types import User
from drills.models import DrillPolicy, RestoreDrill
from drills.services import restore_drill_start
from jobs.models import Checkpoint, Job
from nodes.models import Cluster

logger = logging.getLogger(__name__)

POLICY_FIELDS = (
    "enabled",
    "running_every_hours",
    "drill_final_checkpoint",
    "max_in_flight",
    "steps",
)


def _final_since(policy: DrillPolicy) -> None:
    """When drilling final checkpoints was (last) turned on: only checkpoints from then on."""
    if policy.enabled and policy.drill_final_checkpoint and policy.final_since is None:
        policy.final_since = timezone.now()
    if not (policy.enabled and policy.drill_final_checkpoint):
        policy.final_since = None


def drill_policy_update(*, actor: User, cluster: Cluster, **values: Any) -> DrillPolicy:
    """Change a cluster's drill policy (operators only); validated and audited with the
    values before and after. Refused with the field and why."""
    return cluster_settings_update(
        actor=actor,
        model=DrillPolicy,
        cluster=cluster,
        fields=POLICY_FIELDS,
        values=values,
        action=AuditAction.DRILL_POLICY_UPDATE,
        what="drill policies",
        prepare=_final_since,
    )


def drill_policies_apply() -> int:
    """Beat: start the drills the policies ask for, at most ``max_in_flight`` per cluster."""
    started = 0
    for policy in DrillPolicy.objects.filter(enabled=True).select_related("cluster"):
        in_flight = RestoreDrill.objects.filter(
            cluster=policy.cluster, state__in=RestoreDrill.ACTIVE_STATES
        ).count()
        room = policy.max_in_flight - in_flight
        if room <= 0:
            continue
        for checkpoint, trigger in _policy_candidates(policy):
            if room <= 0:
                break
            try:
                # To the run's next checkpoint where there is one; else the policy's K steps.
                restore_drill_start(
                    actor=None,
                    checkpoint=checkpoint,
                    steps=None,
                    fallback_steps=policy.steps,
                    trigger=trigger,
                )
            except ApplicationError as error:
                logger.info("policy drill of %s skipped: %s", checkpoint, error.message)
                continue
            room -= 1
            started += 1
    return started


def _newest_drillable_checkpoint(job: Job, steps: int) -> Checkpoint | None:
    """The newest checkpoint still on the cluster whose state Gantry recorded and that the
    original run logged ``steps`` steps after: a drill compares against those. (The final
    checkpoint of a run has no steps after it, so the last drillable one is the one
    before it.)"""
    last_step = job.last_step or 0
    return (
        job.checkpoints.filter(
            deleted_at__isnull=True,
            step__lte=last_step - steps,
            step__in=job.fingerprints.values("step"),
        )
        .order_by("-step")
        .first()
    )


def _policy_candidates(policy: DrillPolicy) -> list[tuple[Checkpoint, str]]:
    now = timezone.now()
    candidates: list[tuple[Checkpoint, str]] = []
    if policy.running_every_hours:
        since = now - timedelta(hours=policy.running_every_hours)
        for job in Job.objects.filter(cluster=policy.cluster, state=Job.State.RUNNING).order_by(
            "created_at"
        ):
            checkpoint = _newest_drillable_checkpoint(job, policy.steps)
            if checkpoint is None:
                continue
            recent = RestoreDrill.objects.filter(checkpoint__job=job, created_at__gte=since)
            if policy.cluster.verifier_account:
                # The owner's self-attested drill does not stand in for a verifier's.
                recent = recent.filter(attestation=RestoreDrill.Attestation.VERIFIER)
            if not recent.exists():
                candidates.append((checkpoint, RestoreDrill.Trigger.POLICY_RUNNING))
    if policy.drill_final_checkpoint and policy.final_since is not None:
        for job in Job.objects.filter(
            cluster=policy.cluster,
            state=Job.State.COMPLETED,
            files_final=True,
            ended_at__gte=policy.final_since,
        ).order_by("ended_at"):
            checkpoint = _newest_drillable_checkpoint(job, policy.steps)
            if checkpoint is None:
                continue
            if not RestoreDrill.objects.filter(
                checkpoint__job=job, trigger=RestoreDrill.Trigger.POLICY_FINAL
            ).exists():
                candidates.append((checkpoint, RestoreDrill.Trigger.POLICY_FINAL))
    return candidates
