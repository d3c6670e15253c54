"""When the watcher looks again: backing off while nothing changes, looking closely (the fast
interval, no back-off) while a drill is in flight, rarely with nothing to watch."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from drills.models import RestoreDrill
from factories import CheckpointFactory, ClusterFactory, JobFactory
from jobs.models import Job
from nodes.models import Cluster
from watcher.cycle import ReconcileResult, _reconcile_done

pytestmark = pytest.mark.django_db


def _next_wait(cluster: Cluster, *, idle_cycles: int) -> float:
    Cluster.objects.filter(pk=cluster.pk).update(reconcile_idle_cycles=idle_cycles)
    cluster.refresh_from_db()
    now = timezone.now()
    _reconcile_done(cluster, ReconcileResult(), now)
    cluster.refresh_from_db()
    assert cluster.next_reconcile_at is not None
    return (cluster.next_reconcile_at - now).total_seconds()


def test_a_running_job_backs_off_while_nothing_changes(settings: Any) -> None:
    settings.RECONCILE_INTERVAL_SECONDS = 5
    settings.RECONCILE_FAST_INTERVAL_SECONDS = 1
    cluster = ClusterFactory()
    JobFactory(cluster=cluster, state=Job.State.RUNNING, slurm_job_id="7")
    assert _next_wait(cluster, idle_cycles=0) == 10
    assert _next_wait(cluster, idle_cycles=5) == 20


def test_a_drill_in_flight_is_watched_at_the_fast_interval(settings: Any) -> None:
    settings.RECONCILE_INTERVAL_SECONDS = 5
    settings.RECONCILE_FAST_INTERVAL_SECONDS = 1
    cluster = ClusterFactory()
    job = JobFactory(cluster=cluster, state=Job.State.COMPLETED, files_final=True)
    drill = RestoreDrill.objects.create(
        checkpoint=CheckpointFactory(job=job),
        cluster=cluster,
        state=RestoreDrill.State.RUNNING,
        slurm_job_id="8",
    )
    assert _next_wait(cluster, idle_cycles=0) == 1
    assert _next_wait(cluster, idle_cycles=7) == 1
    RestoreDrill.objects.filter(pk=drill.pk).update(state=RestoreDrill.State.FINISHED)
    # Nothing left to watch: look rarely.
    assert _next_wait(cluster, idle_cycles=7) == 30


def test_the_fast_interval_never_slows_a_faster_configured_one(settings: Any) -> None:
    settings.RECONCILE_INTERVAL_SECONDS = 1
    settings.RECONCILE_FAST_INTERVAL_SECONDS = 3
    cluster = ClusterFactory()
    job = JobFactory(cluster=cluster, state=Job.State.COMPLETED, files_final=True)
    RestoreDrill.objects.create(
        checkpoint=CheckpointFactory(job=job), cluster=cluster, state=RestoreDrill.State.PENDING
    )
    assert _next_wait(cluster, idle_cycles=4) == 1


def test_a_cycle_due_before_beats_next_look_is_chained_once(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from watcher import tasks

    settings.RECONCILE_BEAT_TICK_SECONDS = 1.0
    sent: list[tuple[Any, float]] = []
    monkeypatch.setattr(
        tasks.cluster_reconcile_task,
        "apply_async",
        lambda args, countdown: sent.append((args, countdown)),
    )
    cluster = ClusterFactory()
    soon = timezone.now() + timedelta(seconds=0.5)
    Cluster.objects.filter(pk=cluster.pk).update(next_reconcile_at=soon)
    assert tasks.cluster_reconcile_chain(cluster_id=cluster.pk)
    assert len(sent) == 1 and sent[0][0] == (cluster.pk,) and 0 < sent[0][1] <= 0.5
    # Claimed: beat's conditional update (and a second chain) find the due time moved.
    cluster.refresh_from_db()
    assert cluster.next_reconcile_at is not None and cluster.next_reconcile_at > soon
    assert not tasks.cluster_reconcile_chain(cluster_id=cluster.pk)
    assert tasks.clusters_reconcile_due() == 0
    # Due after beat's next look: left to beat.
    Cluster.objects.filter(pk=cluster.pk).update(
        next_reconcile_at=timezone.now() + timedelta(seconds=5)
    )
    assert not tasks.cluster_reconcile_chain(cluster_id=cluster.pk) and len(sent) == 1
