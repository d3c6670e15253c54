"""Recovery's part of a watcher cycle: detect (crashes, hangs), then move open incidents on,
and record the silent data corruption that finished restore drills show (``recovery.sdc``).
Database work only: what it knows of the cluster is what the cycle already read (Slurm's
final records, the run-directory listing). No remote command is added per job."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobs.models import Job
from nodes.models import Cluster
from recovery.detect import hung_jobs, policy_for, progress_update
from recovery.sdc import sdc_record
from recovery.services import (
    crashes_open,
    divergences_open,
    hang_open,
    incidents_advance,
    spikes_open,
    stragglers_open,
)
from runs.rundir import RunDirectory

logger = logging.getLogger(__name__)


@dataclass
class RecoveryResult:
    opened: int = 0
    advanced: int = 0
    # Nodes newly suspected of silent data corruption.
    sdc_suspects: int = 0


def recovery_cycle(
    *,
    cluster: Cluster,
    seen: set[Any],
    now: datetime,
    listed: dict[Any, RunDirectory] | None = None,
) -> RecoveryResult:
    """``seen``: the jobs whose run directories this cycle's listing reached (the only ones
    whose quiet can count as a hang); ``listed``: what those directories showed, by job."""
    result = RecoveryResult()
    # A diverged run first: a job whose loss went NaN and then crashed is one incident.
    result.opened += divergences_open(cluster=cluster, now=now)
    result.opened += crashes_open(cluster=cluster, now=now, listed=listed)
    running = list(
        Job.objects.filter(cluster=cluster, state=Job.State.RUNNING)
        .exclude(slurm_job_id="")
        .select_related("cluster", "resume_from")
    )
    policy = policy_for(cluster)
    result.opened += spikes_open(jobs=running, policy=policy, now=now)
    result.opened += stragglers_open(jobs=running, now=now)
    progress = progress_update(jobs=running, seen=seen, now=now)
    for job, budget, state in hung_jobs(jobs=running, progress=progress, policy=policy, now=now):
        directory = (listed or {}).get(job.id)
        if hang_open(
            job=job, budget=budget, progress=state, policy=policy, now=now, directory=directory
        ):
            result.opened += 1
    # Before incidents move on: a resume leaves out what drills that just ended showed.
    result.sdc_suspects += sdc_record(cluster=cluster, now=now)
    result.advanced += incidents_advance(cluster=cluster, now=now)
    return result
