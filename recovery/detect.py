"""Detection on positive evidence only: a job that ended failed, out of memory, on a node
failure or at its time limit (Slurm's own final record), a running job whose metrics stopped
growing for longer than a budget measured from its own step times (while Gantry could read
its run directory every time it looked).

What Gantry could not see is never evidence: an SSH time-out, sacct being down, a listing
that did not reach a directory. A job Gantry declared ``lost`` (Slurm forgot it) is not
taken for a crash either: that state rests on Gantry's view, not on the job's.

A job Slurm preempted (no longer requeued by Slurm: Gantry submits with ``--no-requeue``)
is resumed like a crash, as its own signal: it names no node. A cancelled job (by its
owner, an operator, or Gantry itself) is never recovered.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jobs.models import Job, MetricPoint
from nodes.models import Cluster
from recovery.models import Incident, JobProgress, RecoveryPolicy

# Final states that are the job's own failure, and the signal each one is.
FAILURE_SIGNALS = {
    Job.State.FAILED: Incident.Signal.CRASH,
    Job.State.NODE_FAIL: Incident.Signal.NODE_FAILURE,
    Job.State.TIMEOUT: Incident.Signal.TIMEOUT,
}
# A failure older than this when first seen (a job that ended before recovery watched,
# or while the watcher was stopped for long) is not recovered after the fact.
CRASH_LOOKBACK = timedelta(hours=1)
# Logged steps at the start of a run (or of a resume) left out of the step-time figure:
# compilation, warm-up and the restore make them slow.
WARMUP_POINTS = 3
# Logged steps the step-time figure is measured over (the newest ones).
MEASURED_POINTS = 64


@dataclass(frozen=True)
class HangBudget:
    """How long a running job may go without a new logged step before it is a hang."""

    seconds: float
    # The measured figures behind it (for the incident's evidence).
    p95_interval_s: float | None
    save_allowance_s: float
    points: int
    startup: bool

    def as_evidence(self) -> dict[str, Any]:
        return {
            "budget_s": round(self.seconds, 3),
            "p95_interval_s": None
            if self.p95_interval_s is None
            else round(self.p95_interval_s, 3),
            "save_allowance_s": round(self.save_allowance_s, 3),
            "points_measured": self.points,
            "startup": self.startup,
        }


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` percentile of ``values`` (nearest rank, never interpolated)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def hang_budget(
    *,
    wall_times: list[float],
    blocking_times: list[float],
    factor: float,
    floor_s: float,
    startup_grace_s: float,
) -> HangBudget:
    """The budget from a job's own logged steps (oldest first): ``factor`` × the p95 time
    between consecutive logged steps, at least ``floor_s``, plus ``factor`` × the longest
    checkpoint blocking time seen (a save in progress is never a hang). The warm-up steps
    are left out; with fewer than two steps after them, the job is still starting (or
    restoring): the start-up grace applies."""
    measured = wall_times[WARMUP_POINTS:]
    intervals = [
        later - earlier for earlier, later in itertools.pairwise(measured) if later >= earlier
    ]
    finite_blocking = [b for b in blocking_times if math.isfinite(b) and b >= 0]
    save_allowance = factor * max(finite_blocking, default=0.0)
    if len(intervals) < 2:
        return HangBudget(
            seconds=max(startup_grace_s, floor_s) + save_allowance,
            p95_interval_s=None,
            save_allowance_s=save_allowance,
            points=len(intervals),
            startup=True,
        )
    p95 = percentile(intervals, 0.95)
    return HangBudget(
        seconds=max(factor * p95, floor_s) + save_allowance,
        p95_interval_s=p95,
        save_allowance_s=save_allowance,
        points=len(intervals),
        startup=False,
    )


def policy_for(cluster: Cluster) -> RecoveryPolicy:
    """The cluster's policy (its defaults until an operator saved one; not stored)."""
    found = RecoveryPolicy.objects.filter(cluster=cluster).first()
    return found if found is not None else RecoveryPolicy(cluster=cluster)


def crashed_jobs(cluster: Cluster, now: datetime) -> list[Job]:
    """Jobs that ended in a failure of their own (or were preempted), recently, are still
    the newest of their lineage (nothing resumed from them yet) and have no incident.
    Cancelled jobs (by their owner, an operator or Gantry) never are; nor is a "time-out"
    that only a signal before the time limit shows (``stopped_before_its_limit``)."""
    found = (
        Job.objects.filter(
            cluster=cluster,
            state__in=list(FAILURE_SIGNALS),
            ended_at__gte=now - CRASH_LOOKBACK,
            incidents__isnull=True,
            children__isnull=True,
        )
        .exclude(slurm_job_id="")
        .select_related("cluster")
    )
    return [job for job in found if not stopped_before_its_limit(job)]


def diverged_jobs(cluster: Cluster) -> list[Job]:
    """Running (or just ended, not cancelled by a person) jobs that logged a loss that is
    not a finite number, still the newest of their lineage, with no incident."""
    return list(
        Job.objects.filter(
            cluster=cluster,
            nonfinite_loss_step__isnull=False,
            state__in=[Job.State.RUNNING, *FAILURE_SIGNALS, Job.State.COMPLETED],
            incidents__isnull=True,
            children__isnull=True,
        )
        .exclude(slurm_job_id="")
        .select_related("cluster")
    )


# Slurm's final states that Gantry's ``failed`` folds in, as the reason ``jobs.lifecycle``
# keeps (``final_values``), and the signal each one is. A preemption is no failure of the
# job or its nodes (``--no-requeue``: Slurm does not run it again, recovery does).
_FAILED_BY_REASON = (
    ("preempted", Incident.Signal.PREEMPTED),
    ("boot failure", Incident.Signal.BOOT_FAILURE),
    ("out of memory", Incident.Signal.OUT_OF_MEMORY),
)


def signal_of(job: Job) -> str:
    reason = (job.state_reason or "").lower()
    if job.state == Job.State.FAILED:
        for prefix, signal in _FAILED_BY_REASON:
            if reason.startswith(prefix):
                return signal
        if "out of memory" in reason:
            return Incident.Signal.OUT_OF_MEMORY
    return FAILURE_SIGNALS[Job.State(job.state)]


# A job Gantry took for timed out from its exit record alone (no accounting, squeue no
# longer showing it) that ran this much shorter than its time limit was stopped by someone
# (a preemption, an owner's or operator's scancel on the cluster): Gantry cannot tell
# which, so it does not recover it.
TIMEOUT_SLACK = timedelta(minutes=2)
_INFERRED_FROM_SIGNAL = "stopped by sig"


def stopped_before_its_limit(job: Job) -> bool:
    if job.state != Job.State.TIMEOUT:
        return False
    if not (job.state_reason or "").lower().startswith(_INFERRED_FROM_SIGNAL):
        return False
    if job.started_at is None or job.ended_at is None:
        return True
    ran = job.ended_at - job.started_at
    return ran < timedelta(minutes=job.time_limit_minutes) - TIMEOUT_SLACK


def progress_update(*, jobs: list[Job], seen: set[Any], now: datetime) -> dict[Any, JobProgress]:
    """Move each running job's progress clock: ``seen``, the jobs whose run directory the
    cycle's listing reached; their metrics grew when their offset moved."""
    known = {p.job_id: p for p in JobProgress.objects.filter(job__in=jobs)}
    for job in jobs:
        progress = known.get(job.id)
        if progress is None:
            # First sight: the clock starts now (never earlier: no hang on first sight).
            known[job.id] = JobProgress.objects.create(
                job=job, metrics_offset=job.metrics_offset, grew_at=now, seen_at=now
            )
            continue
        if job.id not in seen:
            continue
        values: dict[str, Any] = {"seen_at": now}
        if job.metrics_offset != progress.metrics_offset:
            values.update(metrics_offset=job.metrics_offset, grew_at=now)
        JobProgress.objects.filter(pk=progress.pk).update(**values)
        for key, value in values.items():
            setattr(progress, key, value)
    return known


def measured_budget(job: Job, policy: RecoveryPolicy) -> HangBudget:
    """``hang_budget`` from the job's newest logged steps (one query)."""
    rows = list(
        MetricPoint.objects.filter(job=job)
        .order_by("-step")
        .values_list("wall_time", "checkpoint_blocking_s")[:MEASURED_POINTS]
    )
    rows.reverse()
    started = job.resume_from.step if job.resume_from_id and job.resume_from else None
    if started is not None and len(rows) < MEASURED_POINTS:
        # Points at or before the resumed step belong to the job it resumed from.
        steps = list(
            MetricPoint.objects.filter(job=job)
            .order_by("-step")
            .values_list("step", flat=True)[:MEASURED_POINTS]
        )
        steps.reverse()
        rows = [row for row, step in zip(rows, steps, strict=True) if step > started]
    wall = [row[0].timestamp() for row in rows if row[0] is not None]
    blocking = [float(row[1]) for row in rows if row[1] is not None]
    return hang_budget(
        wall_times=wall,
        blocking_times=blocking,
        factor=policy.hang_factor,
        floor_s=float(policy.hang_floor_seconds),
        startup_grace_s=float(policy.startup_grace_seconds),
    )


def hung_jobs(
    *, jobs: list[Job], progress: dict[Any, JobProgress], policy: RecoveryPolicy, now: datetime
) -> list[tuple[Job, HangBudget, JobProgress]]:
    """Running jobs seen this very cycle whose metrics have not grown for longer than their
    budget, with no incident yet."""
    found = []
    with_incident = set(Incident.objects.filter(job__in=jobs).values_list("job_id", flat=True))
    for job in jobs:
        state = progress.get(job.id)
        if state is None or job.id in with_incident or state.seen_at != now:
            continue
        quiet = (now - state.grew_at).total_seconds()
        if quiet <= policy.hang_floor_seconds:
            continue
        budget = measured_budget(job, policy)
        if quiet > budget.seconds:
            found.append((job, budget, state))
    return found


# Logged losses before a step that the spike test compares it with, and how many logged
# steps in a row must be over the bound (one high point is noise, two are a trend).
SPIKE_WINDOW = 16
SPIKE_PERSIST = 2


@dataclass(frozen=True)
class Spike:
    step: int
    loss: float
    median: float
    factor: float

    def as_evidence(self) -> dict[str, Any]:
        return {
            "spike_step": self.step,
            "loss": self.loss,
            "median_before": self.median,
            "factor": self.factor,
            "window": SPIKE_WINDOW,
            "persist": SPIKE_PERSIST,
        }


def loss_spike(points: list[tuple[int, float | None]], factor: float) -> Spike | None:
    """The first logged step (oldest first in ``points``) whose loss is over ``factor`` ×
    the median of the ``SPIKE_WINDOW`` finite losses before it, with the next logged
    steps over the same bound too (``SPIKE_PERSIST`` in a row). The warm-up points and
    steps without a full window are never judged; non-finite losses are the NaN check's."""
    if factor <= 0:
        return None
    finite = [
        (step, float(loss))
        for step, loss in points[WARMUP_POINTS:]
        if loss is not None and math.isfinite(loss)
    ]
    for index in range(SPIKE_WINDOW, len(finite) - SPIKE_PERSIST + 1):
        before = sorted(loss for _, loss in finite[index - SPIKE_WINDOW : index])
        median = before[len(before) // 2]
        bound = factor * median
        if median > 0 and all(loss > bound for _, loss in finite[index : index + SPIKE_PERSIST]):
            step, loss = finite[index]
            return Spike(step=step, loss=loss, median=median, factor=factor)
    return None


def spiked_jobs(jobs: list[Job], policy: RecoveryPolicy) -> list[tuple[Job, Spike]]:
    """Running jobs whose newest logged losses spiked (one query per job), with no
    incident yet."""
    if policy.loss_spike_factor <= 0:
        return []
    with_incident = set(Incident.objects.filter(job__in=jobs).values_list("job_id", flat=True))
    found = []
    for job in jobs:
        if job.id in with_incident:
            continue
        rows = list(
            MetricPoint.objects.filter(job=job)
            .order_by("-step")
            .values_list("step", "loss")[: MEASURED_POINTS + SPIKE_WINDOW]
        )
        rows.reverse()
        spike = loss_spike(rows, policy.loss_spike_factor)
        if spike is not None:
            found.append((job, spike))
    return found
