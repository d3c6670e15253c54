"""Celery tasks for jobs: thin, ids in, one service call each."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs.drills import (
    checkpoint_verify,
    drill_policies_apply,
    restore_drill_submit_gave_up,
    restore_drill_submit_to_slurm,
)
from jobs.services import cluster_reconcile, job_submit_gave_up, job_submit_to_slurm
from nodes.models import Cluster
from nodes.slurm.errors import TRANSIENT_ERRORS

logger = logging.getLogger(__name__)


@shared_task(
    bind=True,
    name="jobs.job_submit",
    acks_late=True,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=8,
    time_limit=120,
    soft_time_limit=100,
)
def job_submit_task(self: Any, job_id: str) -> str:
    """Submit one job to Slurm. Idempotent (tag lookup before sbatch), so acks_late is safe
    and a redelivery after a worker crash adopts the Slurm job instead of submitting again.
    When retries run out on a transient error the job goes back to ``queued``."""
    try:
        return job_submit_to_slurm(job_id=job_id)
    except TRANSIENT_ERRORS as error:
        if self.request.retries >= self.max_retries:
            job_submit_gave_up(job_id=job_id, error=error)
            return "gave up for now: cluster unreachable"
        raise


@shared_task(name="jobs.cluster_reconcile", acks_late=True, time_limit=240, soft_time_limit=200)
def cluster_reconcile_task(cluster_id: int) -> dict[str, Any]:
    """One watcher cycle for one cluster. Idempotent: it only moves states forward."""
    try:
        result = cluster_reconcile(cluster_id=cluster_id)
    except Cluster.DoesNotExist:
        return {"error": "cluster no longer exists"}
    return {
        "commands": result.commands,
        "state_changes": result.state_changes,
        "metric_points": result.metric_points,
        "checkpoints": result.checkpoints,
        "errors": result.errors,
    }


@shared_task(name="jobs.clusters_reconcile_due", time_limit=30, soft_time_limit=20)
def clusters_reconcile_due() -> int:
    """Beat: one reconcile task per cluster whose next cycle has come, claimed with a
    conditional update so a cluster never has two cycles queued for one due time."""
    now = timezone.now()
    enqueued = 0
    due = Cluster.objects.filter(Q(next_reconcile_at__isnull=True) | Q(next_reconcile_at__lte=now))
    for cluster in due.only("id", "next_reconcile_at"):
        hold = now + timedelta(seconds=250)
        if Cluster.objects.filter(
            pk=cluster.pk, next_reconcile_at=cluster.next_reconcile_at
        ).update(next_reconcile_at=hold):
            cluster_reconcile_task.delay(cluster.pk)
            enqueued += 1
    return enqueued


@shared_task(
    bind=True,
    name="jobs.restore_drill_submit",
    acks_late=True,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=2,
    retry_backoff_max=30,
    retry_jitter=False,
    time_limit=120,
    soft_time_limit=100,
)
def restore_drill_submit_task(self: Any, drill_id: str) -> str:
    """Submit a drill's Slurm job. Idempotent like the job submit (tag lookup first).
    When the cluster stays unreachable the drill ends ``error``: it could not run."""
    self.max_retries = settings.DRILL_SUBMIT_RETRIES
    try:
        return restore_drill_submit_to_slurm(drill_id=drill_id)
    except TRANSIENT_ERRORS as error:
        if self.request.retries >= self.max_retries:
            restore_drill_submit_gave_up(drill_id=drill_id, error=error)
            return "gave up: cluster unreachable"
        raise


@shared_task(name="jobs.checkpoint_verify", time_limit=700, soft_time_limit=650)
def checkpoint_verify_task(checkpoint_id: int) -> str:
    """Integrity check of one checkpoint; read-only on the cluster, safe to repeat."""
    checkpoint = checkpoint_verify(checkpoint_id=checkpoint_id)
    return checkpoint.integrity


@shared_task(name="jobs.drill_policies_apply", time_limit=60, soft_time_limit=50)
def drill_policies_apply_task() -> int:
    """Beat: start the drills that policies ask for, bounded per cluster."""
    return drill_policies_apply()
