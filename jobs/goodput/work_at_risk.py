"""Reads for work at risk: what a running job would lose if it died now.

For each running job, GPU-hours (allocated GPUs × time, ``goodput.job_gpus``: a job without
GPUs counts its ranks) since its newest *proven* checkpoint and since its newest *written*
one. Proven: a restore drill passed on it (``Checkpoint.last_proven_at``, which a failed
drill clears). Only checkpoints one can still resume from count: not removed by the
trainer's retention, not failed in an integrity check. A checkpoint's moment is when the
trainer saved it (its manifest), else when Gantry registered it, and never before the
job started. A job with no such checkpoint of its own risks everything since it started:
what came before belongs to the allocation of the job it was resumed from, and whether
that checkpoint was proven is reported (``resumed_from``).

Operators set ``Cluster.proven_checkpoint_max_age_minutes``; a running job whose newest
proven checkpoint is older than that (or that has run that long without one) is a breach:
the overview lists breaches and ``notifications`` notifies them.

One query for any number of jobs (the checkpoints are subqueries).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from jobs import checkpoint_state
from jobs.goodput import ledger as goodput
from jobs.models import Checkpoint, Job

# The states in which a job holds its allocation and makes progress that can be lost.
AT_RISK_STATES = (Job.State.RUNNING,)


@dataclass(frozen=True)
class SinceCheckpoint:
    """Work since one reference point: a checkpoint, or the job's start (``step`` None)."""

    step: int | None
    at: datetime
    age_s: float
    gpu_hours: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_step": self.step,
            "since": self.at,
            "age_s": self.age_s,
            "gpu_hours": self.gpu_hours,
        }


@dataclass(frozen=True)
class JobRisk:
    job_id: str
    name: str
    owner_id: int
    cluster_id: int
    cluster: str
    gpus: int
    proven: SinceCheckpoint
    written: SinceCheckpoint
    # The cluster's limit on the proven checkpoint's age, in seconds; None: no limit.
    max_proven_age_s: float | None
    resumed_from_step: int | None
    resumed_from_proven: bool | None

    @property
    def breached(self) -> bool:
        return self.max_proven_age_s is not None and self.proven.age_s > self.max_proven_age_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "since_proven": self.proven.as_dict(),
            "since_written": self.written.as_dict(),
            "max_proven_age_s": self.max_proven_age_s,
            "breached": self.breached,
            "resumed_from": (
                None
                if self.resumed_from_step is None
                else {"checkpoint_step": self.resumed_from_step, "proven": self.resumed_from_proven}
            ),
        }


def gpu_hours(*, gpus: int, seconds: float) -> float:
    return max(0, gpus) * max(0.0, seconds) / 3600.0


def since_checkpoint(
    *, step: int | None, at: datetime | None, started_at: datetime, gpus: int, now: datetime
) -> SinceCheckpoint:
    """Work since a checkpoint saved ``at`` (never before the job's start), or since the
    start when there is none."""
    if step is None or at is None:
        step, reference = None, started_at
    else:
        reference = max(at, started_at)
    age = max(0.0, (now - reference).total_seconds())
    return SinceCheckpoint(
        step=step, at=reference, age_s=age, gpu_hours=gpu_hours(gpus=gpus, seconds=age)
    )


def _newest(checkpoints: QuerySet[Checkpoint], field: str) -> Subquery:
    return Subquery(checkpoints.values(field)[:1])


def work_at_risk(*, jobs: QuerySet[Job], now: datetime | None = None) -> list[JobRisk]:
    """Work at risk of each running job among ``jobs`` (the caller passes what the person
    may see), oldest start first. One query."""
    now = now or timezone.now()
    return [_job_risk(row, now=now) for row in _risk_rows(jobs)]


@dataclass(frozen=True)
class RunningJobs:
    """The running jobs among some, as the overview sums them up."""

    risks: list[JobRisk]
    # Σ samples/s now (``Job.throughput_now``) of the running jobs.
    throughput_now: float
    # Running jobs whose newest checkpoint a restore drill proved (the drills page's
    # "proven share", ``drills.selectors.drill_fleet_health``).
    newest_proven: int

    @property
    def count(self) -> int:
        return len(self.risks)


def running_jobs_summary(*, jobs: QuerySet[Job], now: datetime | None = None) -> RunningJobs:
    """``work_at_risk`` of ``jobs`` with the running jobs' throughput and how many have a
    proven newest checkpoint, in its one query."""
    now = now or timezone.now()
    rows = list(
        _risk_rows(
            jobs,
            throughput=F("throughput_now"),
            newest_proven_at=checkpoint_state.newest_checkpoint_proof(),
        )
    )
    return RunningJobs(
        risks=[_job_risk(row, now=now) for row in rows],
        throughput_now=sum(row["throughput"] or 0.0 for row in rows),
        newest_proven=sum(row["newest_proven_at"] is not None for row in rows),
    )


def _risk_rows(jobs: QuerySet[Job], **extra: Any) -> QuerySet[Job, dict[str, Any]]:
    """The running jobs among ``jobs`` with their newest usable checkpoints (subqueries),
    as ``values()`` rows, oldest start first; ``extra`` annotations come along."""
    usable = (
        checkpoint_state.usable(Checkpoint.objects.filter(job=OuterRef("pk")))
        .annotate(moment=Coalesce("saved_at", "registered_at"))
        .order_by("-step")
    )
    proven = checkpoint_state.proven(usable)
    return (
        jobs.filter(state__in=AT_RISK_STATES)
        .annotate(
            proven_step=_newest(proven, "step"),
            proven_at=_newest(proven, "moment"),
            written_step=_newest(usable, "step"),
            written_at=_newest(usable, "moment"),
            resumed_step=F("resume_from__step"),
            resumed_proven_at=F("resume_from__last_proven_at"),
            max_age_minutes=F("cluster__proven_checkpoint_max_age_minutes"),
            cluster_name=F("cluster__name"),
            **extra,
        )
        .values(
            *extra,
            "id",
            "name",
            "owner_id",
            "cluster_id",
            "cluster_name",
            "max_age_minutes",
            "nodes",
            "gpus_per_node",
            "tasks_per_node",
            "created_at",
            "submitted_at",
            "started_at",
            "proven_step",
            "proven_at",
            "written_step",
            "written_at",
            "resumed_step",
            "resumed_proven_at",
        )
        .order_by("started_at", "created_at", "id")
    )


def _job_risk(row: dict[str, Any], *, now: datetime) -> JobRisk:
    gpus = goodput.job_gpus(
        nodes=row["nodes"], gpus_per_node=row["gpus_per_node"], tasks_per_node=row["tasks_per_node"]
    )
    # Running without a start time recorded (not seen by the watcher yet): from submission.
    started_at = row["started_at"] or row["submitted_at"] or row["created_at"]
    max_age = row["max_age_minutes"]
    return JobRisk(
        job_id=str(row["id"]),
        name=row["name"],
        owner_id=row["owner_id"],
        cluster_id=row["cluster_id"],
        cluster=row["cluster_name"],
        gpus=gpus,
        proven=since_checkpoint(
            step=row["proven_step"], at=row["proven_at"], started_at=started_at, gpus=gpus, now=now
        ),
        written=since_checkpoint(
            step=row["written_step"],
            at=row["written_at"],
            started_at=started_at,
            gpus=gpus,
            now=now,
        ),
        max_proven_age_s=None if max_age is None else max_age * 60.0,
        resumed_from_step=row["resumed_step"],
        resumed_from_proven=(
            None if row["resumed_step"] is None else row["resumed_proven_at"] is not None
        ),
    )


def job_work_at_risk(*, job: Job, now: datetime | None = None) -> JobRisk | None:
    """The job's work at risk while it runs; None otherwise."""
    if job.state not in AT_RISK_STATES:
        return None
    found = work_at_risk(jobs=Job.objects.filter(pk=job.pk), now=now)
    return found[0] if found else None


def proven_age_breaches(*, jobs: QuerySet[Job], now: datetime | None = None) -> list[JobRisk]:
    """Running jobs among ``jobs`` whose newest proven checkpoint is older than their
    cluster allows, oldest proof first. One query."""
    limited = jobs.filter(cluster__proven_checkpoint_max_age_minutes__isnull=False)
    breaches = [risk for risk in work_at_risk(jobs=limited, now=now) if risk.breached]
    return sorted(breaches, key=lambda risk: -risk.proven.age_s)


@dataclass
class ClusterRisk:
    cluster: str
    jobs: int = 0
    since_proven_gpu_hours: float = 0.0
    since_written_gpu_hours: float = 0.0
    breaches: int = 0


def work_at_risk_by_cluster(risks: list[JobRisk]) -> dict[int, ClusterRisk]:
    """The work at risk of running jobs summed per cluster."""
    totals: dict[int, ClusterRisk] = {}
    for risk in risks:
        total = totals.setdefault(risk.cluster_id, ClusterRisk(cluster=risk.cluster))
        total.jobs += 1
        total.since_proven_gpu_hours += risk.proven.gpu_hours
        total.since_written_gpu_hours += risk.written.gpu_hours
        total.breaches += risk.breached
    return totals
