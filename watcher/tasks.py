"""Celery tasks of the watcher: beat claims due clusters, one reconcile task per cluster."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import shared_task
from django.db.models import Q
from django.utils import timezone

from controlplane.tasknames import CLUSTER_RECONCILE, CLUSTERS_RECONCILE_DUE
from nodes.models import Cluster
from watcher.cycle import cluster_reconcile


@shared_task(name=CLUSTER_RECONCILE, acks_late=True, time_limit=240, soft_time_limit=200)
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


@shared_task(name=CLUSTERS_RECONCILE_DUE, time_limit=30, soft_time_limit=20)
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
