"""Celery tasks of the health app: thin, ids in, one service call."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.db.models import Q
from django.utils import timezone

from controlplane.tasknames import HEALTH_COLLECT, HEALTH_COLLECT_CLUSTER, task_send
from health.collection import health_collect
from health.models import HealthSource

# A collection's hard time limit; a claimed source is held at least this long, so a slow
# collection is never overtaken by the next one of the same cluster.
COLLECT_TIME_LIMIT_S = 120


@shared_task(
    name=HEALTH_COLLECT_CLUSTER,
    time_limit=COLLECT_TIME_LIMIT_S,
    soft_time_limit=COLLECT_TIME_LIMIT_S - 20,
    acks_late=True,
)
def health_collect_cluster_task(cluster_id: int) -> dict[str, object]:
    """Collect one cluster's probe files. Idempotent: a redelivery reads the files again and
    records only what changed. Not retried: the next turn comes after one interval."""
    result = health_collect(cluster_id=cluster_id)
    if result is None:
        return {"ok": False, "error": "no enabled health source"}
    return {"ok": result.ok, "error": result.error, "counts": result.counts}


@shared_task(name=HEALTH_COLLECT, time_limit=30, soft_time_limit=20)
def health_collect_due() -> int:
    """Beat: enqueue a collection for each enabled source whose turn has come. The claim
    is a conditional update of ``next_collect_at``: two beats never enqueue one turn twice."""
    now = timezone.now()
    enqueued = 0
    due = HealthSource.objects.filter(enabled=True).filter(
        Q(next_collect_at__isnull=True) | Q(next_collect_at__lte=now)
    )
    for source in due.only("id", "cluster_id", "next_collect_at", "interval_seconds"):
        hold = now + timedelta(seconds=max(source.interval_seconds, COLLECT_TIME_LIMIT_S + 10))
        claimed = HealthSource.objects.filter(
            pk=source.pk, next_collect_at=source.next_collect_at
        ).update(next_collect_at=hold)
        if claimed and task_send(HEALTH_COLLECT_CLUSTER, source.cluster_id):
            enqueued += 1
    return enqueued
