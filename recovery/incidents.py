"""What the recovery steps share: a job's effective settings, its lineage, and the
incident's conditional move from one outcome to the next."""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from core.errors import ApplicationError
from jobs.lifecycle import job_event
from jobs.models import Job, JobEvent
from jobs.recovery_settings import RecoverySettings
from recovery.detect import policy_for
from recovery.models import Incident, RecoveryPolicy, SuspectNode

logger = logging.getLogger(__name__)


def job_recovery_settings(job: Job, policy: RecoveryPolicy | None = None) -> RecoverySettings:
    """The cluster's policy with the job's own overrides (``Job.recovery``) applied; a job
    whose stored overrides no longer validate gets the cluster's policy."""
    base = (policy or policy_for(job.cluster)).settings()
    try:
        return base.with_overrides(getattr(job, "recovery", None) or {})
    except ApplicationError:
        return base


def lineage_root(job: Job) -> Job:
    root = job
    seen = {job.id}
    while root.parent_id is not None and root.parent_id not in seen:
        seen.add(root.parent_id)
        parent = Job.objects.filter(id=root.parent_id).first()
        if parent is None:
            break
        root = parent
    return root


def lineage_jobs(root: Job) -> list[Job]:
    """The root and every job resumed from it, transitively."""
    found = [root]
    frontier = [root.id]
    while frontier:
        children = list(
            Job.objects.filter(parent_id__in=frontier).exclude(id__in=[j.id for j in found])
        )
        found.extend(children)
        frontier = [child.id for child in children]
    return found


def lineage_suspicions(root: Job) -> QuerySet[SuspectNode]:
    """The suspicions no operator cleared whose evidence comes from this lineage: its
    incidents, and the silent data corruption that drills of its checkpoints showed."""
    jobs = [job.id for job in lineage_jobs(root)]
    return SuspectNode.objects.filter(cleared_at__isnull=True).filter(
        Q(incident__lineage_root=root) | Q(drill__checkpoint__job_id__in=jobs)
    )


def incident_move(incident: Incident, to: str, *, reason: str = "", **values: Any) -> bool:
    """Conditional update from the outcome ``incident`` was read in."""
    if to not in Incident.ACTIVE_OUTCOMES:
        values.setdefault("closed_at", timezone.now())
    changed = bool(
        Incident.objects.filter(pk=incident.pk, outcome=incident.outcome).update(
            outcome=to, reason=reason or incident.reason, **values
        )
    )
    if changed:
        incident.outcome = to
        for key, value in values.items():
            setattr(incident, key, value)
        if to not in Incident.ACTIVE_OUTCOMES:
            job_event(
                incident.job, JobEvent.Kind.RECOVERY, message=f"recovery: {to}: {reason}"[:4000]
            )
    return changed
