"""Celery tasks for the inventory: thin, id in, one service call."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from controlplane.tasknames import (
    CLUSTER_SYNC,
    CLUSTERS_SYNC_DUE,
    USER_CA_ENSURE,
    USER_CERTIFICATE_SIGN,
)
from nodes.access.signer import user_ca_public_key, user_certificate_sign
from nodes.models import Cluster
from nodes.sync import cluster_sync

logger = logging.getLogger(__name__)


@shared_task(name=CLUSTER_SYNC, time_limit=120, soft_time_limit=100, acks_late=True)
def cluster_sync_task(cluster_id: int) -> dict[str, object]:
    """Sync one cluster's inventory. Idempotent: a redelivery only repeats the comparison.

    Failures are not retried here: the cluster records the error and its next sync time
    backs off, and beat enqueues it again when it is due.
    """
    try:
        result = cluster_sync(cluster_id=cluster_id)
    except Cluster.DoesNotExist:
        return {"ok": False, "error": "cluster no longer exists"}
    return {"ok": result.ok, "error": result.error, "state_changes": result.state_changes}


@shared_task(name=CLUSTERS_SYNC_DUE, time_limit=30, soft_time_limit=20)
def clusters_sync_due() -> int:
    """Beat: enqueue a sync for each cluster whose next sync time has come.

    The claim is a conditional update on ``next_sync_at``: two beats (or a slow queue)
    never enqueue the same cluster twice for one due time.
    """
    now = timezone.now()
    enqueued = 0
    due = Cluster.objects.filter(Q(next_sync_at__isnull=True) | Q(next_sync_at__lte=now))
    for cluster in due.only("id", "next_sync_at"):
        # While a sync runs, hold the cluster for longer than a sync can take.
        hold = now + timedelta(seconds=max(settings.SYNC_INTERVAL_SECONDS, 130))
        if Cluster.objects.filter(pk=cluster.pk, next_sync_at=cluster.next_sync_at).update(
            next_sync_at=hold
        ):
            cluster_sync_task.delay(cluster.pk)
            enqueued += 1
    return enqueued


# The signer queue's (routed there by name, settings.CELERY_TASK_ROUTES): a web process
# waits for the answer, so short limits, and no retry (the web asks again on its next try).
@shared_task(name=USER_CERTIFICATE_SIGN, time_limit=20, soft_time_limit=15)
def user_certificate_sign_task(
    *, cluster: str, account: str, public_key: str, purpose: str
) -> dict[str, object]:
    """A certificate for a web process's key (``nodes.access.signer``). Read-only: safe to
    repeat."""
    return user_certificate_sign(
        cluster=cluster, account=account, public_key=public_key, purpose=purpose
    )


@shared_task(name=USER_CA_ENSURE, time_limit=20, soft_time_limit=15)
def user_ca_ensure_task(*, cluster_id: int) -> dict[str, object]:
    """The user CA's public key, made if missing (``nodes.access.signer``). Safe to repeat."""
    return user_ca_public_key(cluster_id=cluster_id)
