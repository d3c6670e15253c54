"""One watcher cycle for one cluster: every kind of Slurm-tracked object (jobs, drills) in
one ``squeue``, at most one ``sacct`` and one run-directory listing, then SFTP reads of
only the new bytes.

Cost in remote commands does not grow with the number of jobs. Safe to re-run anytime:
every change is a conditional update on the state it was read in. The cycle degrades
rather than stops: what squeue said is applied even when sacct fails, and one object's
bad data never aborts the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from drills.lifecycle import DRILLS
from jobs.job_lifecycle import JOBS
from jobs.lifecycle import SlurmLifecycle, slurm_views
from jobs.models import Job
from jobs.rundir import jobs_to_read, run_files_read
from nodes.cluster_access import slurm_client_for, transport_for
from nodes.models import Cluster
from nodes.slurm import errors as slurm_errors
from nodes.slurm.errors import describe_cluster_error

logger = logging.getLogger(__name__)

# Every kind of object Gantry runs as a Slurm job; each cycle looks at all of them.
KINDS: tuple[SlurmLifecycle, ...] = (JOBS, DRILLS)  # type: ignore[type-arg]


@dataclass
class ReconcileResult:
    commands: int = 0
    sftp_reads: int = 0
    bytes_read: int = 0
    state_changes: int = 0
    metric_points: int = 0
    checkpoints: int = 0
    requeued: int = 0
    errors: list[str] = field(default_factory=list)


def cluster_reconcile(*, cluster_id: int) -> ReconcileResult:
    """One watcher cycle for a cluster (see the module docstring)."""
    cluster = Cluster.objects.get(pk=cluster_id)
    result = ReconcileResult()
    now = timezone.now()
    for kind in KINDS:
        result.requeued += kind.requeue_stalled(cluster, now)
    tracked = [(kind, kind.active_in_slurm(cluster)) for kind in KINDS]
    if not any(objects for _, objects in tracked) and not _has_files_to_read(cluster):
        _reconcile_done(cluster, result, now)
        return result
    transport = transport_for(cluster)
    commands_before = transport.commands_run
    try:
        views = slurm_views(
            slurm_client_for(cluster), [obj for _, objects in tracked for obj in objects]
        )
        if not views.accounting_ok:
            result.errors.append(f"accounting (sacct) failed: {views.accounting_error}")
        for kind, objects in tracked:
            result.state_changes += kind.apply_views(objects, views, transport, now, result.errors)
        # Jobs that just ended get their files read in this same cycle.
        files = run_files_read(cluster=cluster, jobs=jobs_to_read(cluster), transport=transport)
    except slurm_errors.SlurmError as error:
        result.commands = transport.commands_run - commands_before
        _reconcile_failed(cluster, result, now, describe_cluster_error(error))
        return result
    result.sftp_reads = files.sftp_reads
    result.bytes_read = files.bytes_read
    result.metric_points = files.metric_points
    result.checkpoints = files.checkpoints
    result.errors += files.errors
    result.commands = transport.commands_run - commands_before
    _reconcile_done(cluster, result, now)
    return result


def _has_files_to_read(cluster: Cluster) -> bool:
    return (
        Job.objects.filter(cluster=cluster, files_final=False)
        .exclude(slurm_job_id="")
        .exclude(state__in=[Job.State.QUEUED, Job.State.SUBMITTING, Job.State.PENDING])
        .exists()
    )


def _reconcile_failed(cluster: Cluster, result: ReconcileResult, now: datetime, why: str) -> None:
    result.errors.append(why)
    Cluster.objects.filter(pk=cluster.pk).update(
        last_reconcile_error=why[:2000],
        last_reconcile_at=now,
        next_reconcile_at=now + timedelta(seconds=min(60, settings.RECONCILE_INTERVAL_SECONDS * 4)),
    )


def _reconcile_done(cluster: Cluster, result: ReconcileResult, now: datetime) -> None:
    changed = bool(result.state_changes or result.metric_points or result.checkpoints)
    idle = 0 if changed else cluster.reconcile_idle_cycles + 1
    interval = settings.RECONCILE_INTERVAL_SECONDS
    has_work = any(kind.has_work(cluster) for kind in KINDS) or (
        Job.objects.filter(cluster=cluster, files_final=False).exists()
    )
    # Back off while nothing changes; with nothing to watch, look rarely.
    wait = interval * min(2 ** min(idle, 3), 4) if has_work else max(30, interval)
    Cluster.objects.filter(pk=cluster.pk).update(
        reconcile_idle_cycles=idle,
        last_reconcile_at=now,
        last_reconcile_error="; ".join(result.errors)[:2000],
        next_reconcile_at=now + timedelta(seconds=wait),
    )
