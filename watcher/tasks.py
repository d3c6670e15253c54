"""Celery tasks of the watcher: beat claims due clusters, one reconcile task per cluster."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
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
    cluster_reconcile_chain(cluster_id=cluster_id)
    return {
        "commands": result.commands,
        "state_changes": result.state_changes,
        "metric_points": result.metric_points,
        "checkpoints": result.checkpoints,
        "errors": result.errors,
    }


def cluster_reconcile_chain(*, cluster_id: int) -> bool:
    """A next cycle due sooner than beat's next look (the fast interval while a drill is in
    flight) is enqueued now with that countdown, claimed as beat claims (a conditional update
    of the due time), so it is never enqueued twice. Returns whether it enqueued one."""
    due = Cluster.objects.filter(pk=cluster_id).values_list("next_reconcile_at", flat=True).first()
    if due is None:
        return False
    now = timezone.now()
    delay = (due - now).total_seconds()
    if delay >= settings.RECONCILE_BEAT_TICK_SECONDS:
        return False
    hold = now + timedelta(seconds=250)
    if not Cluster.objects.filter(pk=cluster_id, next_reconcile_at=due).update(
        next_reconcile_at=hold
    ):
        return False  # beat (or another worker) took it
    cluster_reconcile_task.apply_async(args=(cluster_id,), countdown=max(0.0, delay))
    return True


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
