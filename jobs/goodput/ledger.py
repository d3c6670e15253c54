"""Goodput: where a training lineage's wall time went, and how often it should checkpoint.

Pure functions over plain inputs (no database): ``jobs.selectors.job_goodput`` gathers the
inputs with a fixed number of queries and calls these.

Ledger. A lineage is a root job and every job resumed from it, transitively. Its wall time
is the sum of each job's span (submitted → ended, or now while it runs) plus the idle gaps
between a job's end and the submission of the job resumed from it; for a plain chain of
resumes this is exactly the calendar time from the root's submission to the last end.
Each span is cut into buckets, in seconds:

* ``queued``: submitted → started (Slurm queue).
* ``startup``: started → the training loop's start (first logged step's wall time minus its
  ``elapsed``); the whole running time while no step is logged yet.
* ``restore``: for a resumed job, the part of that startup spent loading the checkpoint:
  the load time when one is known, else the whole startup (the trainer does not log its
  load time on its own, and the load is what a resume adds to a start).
* ``productive``: step time minus data wait minus checkpoint blocking, of preserved steps.
* ``data_wait``, ``checkpoint_blocking``: of preserved steps.
* ``lost_progress``: the whole step time of steps that a later job of the lineage computed
  again: a job's steps after the checkpoint its successor resumed from, and every step of a
  job that lies off the final timeline (a later job resumed from an earlier checkpoint).
* ``idle``: a job's end → its resume job's submission.
* ``recovery``: for a job that had an incident (a crash, hang, divergence or straggler that
  automatic recovery saw): its newest logged step → its end (a hang's quiet, detection,
  cancel), and the gap from its end to the submission of the job resumed from it (proving
  drill, resubmission), which would otherwise be ``idle``.
* A span ends when Slurm says the job ended, or at its newest logged step if that is
  later (Slurm's times are whole seconds; the trainer's are not); for the same reason its
  running part starts at Slurm's start or at Gantry's submit time, whichever is later.
* ``other``: the rest of the span (the time between logged steps, the final checkpoint wait,
  teardown), so that the buckets sum to the wall time exactly:
  ``other = wall − Σ(named buckets)``, never negative because step buckets are scaled down
  to fit the loop's window when clocks disagree.

Ratio = productive / wall.

Advice (Young/Daly, first order). With ``C`` the checkpoint cost (median blocking seconds
of the job's checkpoint steps), ``M`` the mean time to interruption for a job of this size
and ``R`` the restore time, the optimal interval is ``τ* = sqrt(2·C·M)`` (never shorter than
one step), and the expected goodput at an interval ``τ`` is
``g(τ) = 1 − C/τ − τ/(2M) − R/M``, clipped to [0, 1].

``M`` comes from the cluster's history, blended with a prior (Gamma-Poisson, posterior
mean): with ``F`` interruptions (those Slurm or Gantry's health checks evidence, never a
job's own claim: ``jobs.goodput.selectors._failure_history``) over
``H`` GPU-hours of ended jobs, and a job of ``G`` GPUs, the interruption rate per GPU-hour
is ``λ = (k₀ + F) / (k₀·M₀·G + H)`` and ``M = 1 / (λ·G)``: the prior counts as ``k₀ = 1``
interruption seen in ``M₀ = 24 h`` of a job this size. With no history ``M = M₀``; the
history dominates as ``F`` grows. ``prior_used`` says ``F < 3``, when the prior still
weighs at least a quarter of the estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

BUCKETS = (
    "queued",
    "startup",
    "restore",
    "productive",
    "data_wait",
    "checkpoint_blocking",
    "lost_progress",
    "idle",
    "recovery",
    "other",
)

# The prior mean time to interruption of a job, and how many interruptions it counts as.
PRIOR_MTTI_S = 24 * 3600.0
PRIOR_INTERRUPTIONS = 1.0
# Fewer observed interruptions than this: the prior still weighs at least a quarter.
MIN_OBSERVED_INTERRUPTIONS = 3


@dataclass(frozen=True)
class StepTotals:
    """Sums over a job's logged steps in one step range.

    ``steps`` is how many optimizer steps the range spans; with ``log_every > 1`` only
    every ``log_every``-th step has a point, so the sums are scaled by ``steps / points``.
    """

    points: int = 0
    steps: int = 0
    step_time_s: float = 0.0
    data_time_s: float = 0.0
    checkpoint_blocking_s: float = 0.0

    @property
    def scale(self) -> float:
        if self.points <= 0:
            return 0.0
        return max(1.0, self.steps / self.points)

    @property
    def time_s(self) -> float:
        return max(0.0, self.step_time_s) * self.scale

    @property
    def data_s(self) -> float:
        return max(0.0, self.data_time_s) * self.scale

    @property
    def blocking_s(self) -> float:
        return max(0.0, self.checkpoint_blocking_s) * self.scale


@dataclass(frozen=True)
class StepPoint:
    """One logged step, for computing ``StepTotals`` in Python (tests, small inputs)."""

    step: int
    step_time_s: float | None
    data_time_s: float | None = None
    checkpoint_blocking_s: float | None = None


def step_totals(points: Iterable[StepPoint], *, after: int, upto: int | None = None) -> StepTotals:
    """Totals of the points with ``after < step <= upto`` (no upper bound when None),
    spanning the steps from ``after`` to the highest logged one."""
    chosen = [p for p in points if p.step > after and (upto is None or p.step <= upto)]
    if not chosen:
        return StepTotals()
    return StepTotals(
        points=len(chosen),
        steps=max(p.step for p in chosen) - after,
        step_time_s=sum(p.step_time_s or 0.0 for p in chosen),
        data_time_s=sum(p.data_time_s or 0.0 for p in chosen),
        checkpoint_blocking_s=sum(p.checkpoint_blocking_s or 0.0 for p in chosen),
    )


@dataclass(frozen=True)
class LineageLink:
    """One job of a lineage: where it came from and from which step it started."""

    job_id: str
    created_at: datetime
    # The job it was resumed from (the resumed checkpoint's job, else its parent).
    source_id: str | None = None
    # The step of the checkpoint it resumed from; None when not known.
    resume_step: int | None = None


@dataclass(frozen=True)
class StepRanges:
    """Which of a job's steps are preserved: those with ``start < step <= cutoff``; the
    ones after ``cutoff`` are lost (computed again by a later job). ``cutoff`` None: all."""

    start: int
    cutoff: int | None


def lineage_step_ranges(links: Sequence[LineageLink]) -> dict[str, StepRanges]:
    """The preserved step range of each job of a lineage.

    The final timeline runs from the newest job (by creation) back through the jobs it was
    resumed from to the root. A job on it keeps its steps up to the checkpoint its successor
    resumed from (all of them for the newest job, or when that step is not known); a job off
    it keeps none: a later job resumed from an earlier checkpoint and redid its work.
    """
    if not links:
        return {}
    by_id = {link.job_id: link for link in links}
    head = max(links, key=lambda link: (link.created_at, link.job_id))
    cutoffs: dict[str, int | None] = {head.job_id: None}
    current = head
    while current.source_id in by_id and current.source_id not in cutoffs:
        source = by_id[current.source_id]
        cutoffs[source.job_id] = current.resume_step
        current = source
    ranges = {}
    for link in links:
        start = link.resume_step or 0
        if link.job_id in cutoffs:
            cutoff = cutoffs[link.job_id]
            ranges[link.job_id] = StepRanges(
                start=start, cutoff=None if cutoff is None else max(start, cutoff)
            )
        else:
            ranges[link.job_id] = StepRanges(start=start, cutoff=start)
    return ranges


@dataclass(frozen=True)
class JobTimes:
    """What the ledger needs of one job."""

    job_id: str
    submitted_at: datetime | None
    started_at: datetime | None
    # None while the job runs (or waits): its span ends now.
    ended_at: datetime | None
    # The training loop's start: the first logged step's wall time minus its elapsed.
    loop_started_at: datetime | None = None
    resumed: bool = False
    # The checkpoint load time of a resumed job, when known.
    restore_s: float | None = None
    preserved: StepTotals = field(default_factory=StepTotals)
    lost: StepTotals = field(default_factory=StepTotals)
    # The job it was resumed from, for the idle gap before it.
    source_id: str | None = None
    # Whether automatic recovery opened an incident on this job.
    incident: bool = False
    # The wall time of the newest logged step: proof the job still ran then, where Slurm's
    # end time (whole seconds) says it had ended already.
    last_step_at: datetime | None = None

    def end(self, now: datetime) -> datetime:
        """Where its span ends: its end (now while it runs), never before its last step."""
        end = self.ended_at or now
        if self.last_step_at is not None and self.last_step_at > end:
            return self.last_step_at
        return end


@dataclass(frozen=True)
class Ledger:
    wall_s: float
    buckets: dict[str, float]

    @property
    def ratio(self) -> float | None:
        if self.wall_s <= 0:
            return None
        return self.buckets["productive"] / self.wall_s

    def as_dict(self) -> dict[str, object]:
        return {
            "ratio": self.ratio,
            "wall_s": self.wall_s,
            "buckets": dict(self.buckets),
        }


def _seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def job_ledger(
    job: JobTimes, *, now: datetime, idle_before_s: float = 0.0, recovery_gap: bool = False
) -> Ledger:
    """The buckets of one job's span (plus the gap before it, if it was resumed: ``idle``,
    or ``recovery`` when ``recovery_gap``: the job it resumed had an incident)."""
    buckets = dict.fromkeys(BUCKETS, 0.0)
    buckets["recovery" if recovery_gap else "idle"] = max(0.0, idle_before_s)
    gap = max(0.0, idle_before_s)
    span_start = job.submitted_at or job.started_at
    if span_start is None:
        return Ledger(wall_s=gap, buckets=buckets)
    span = max(0.0, _seconds(job.end(now), span_start))
    if job.started_at is None:
        buckets["queued"] = span
        return Ledger(wall_s=span + gap, buckets=buckets)
    buckets["queued"] = _clamp(_seconds(job.started_at, span_start), 0.0, span)
    running = span - buckets["queued"]
    # Slurm's start is in whole seconds and can read before Gantry's own submit time: the
    # job's running part starts at the later of the two, so the loop's window is not cut.
    started = max(job.started_at, span_start)
    if job.loop_started_at is None:
        startup = running
    else:
        startup = _clamp(_seconds(job.loop_started_at, started), 0.0, running)
    if job.resumed:
        restore = startup if job.restore_s is None else _clamp(job.restore_s, 0.0, startup)
        buckets["restore"] = restore
        buckets["startup"] = startup - restore
    else:
        buckets["startup"] = startup
    window = running - startup
    preserved, lost = job.preserved, job.lost
    data_wait = min(preserved.data_s, preserved.time_s)
    blocking = min(preserved.blocking_s, preserved.time_s - data_wait)
    steps = {
        "productive": preserved.time_s - data_wait - blocking,
        "data_wait": data_wait,
        "checkpoint_blocking": blocking,
        "lost_progress": lost.time_s,
    }
    total = sum(steps.values())
    # Clocks of the node and of Slurm disagree a little: never more step time than window.
    factor = window / total if total > window and total > 0 else 1.0
    for name, seconds in steps.items():
        buckets[name] = seconds * factor
    wall = span + gap
    named = sum(seconds for name, seconds in buckets.items() if name != "other")
    buckets["other"] = max(0.0, wall - named)
    if job.incident and job.last_step_at is not None:
        # After its newest step the job made no progress: the incident's part, out of the
        # time no other bucket claims.
        quiet = max(0.0, _seconds(job.end(now), job.last_step_at))
        moved = min(quiet, buckets["other"])
        buckets["recovery"] += moved
        buckets["other"] -= moved
    return Ledger(wall_s=wall, buckets=buckets)


def idle_before(job: JobTimes, *, source_ended_at: datetime | None, now: datetime) -> float:
    """The idle gap before a resumed job: the end of the job it was resumed from to its
    own submission (0 when it was not resumed or its source has not ended)."""
    if source_ended_at is None:
        return 0.0
    waited_until = job.submitted_at or job.started_at or job.ended_at or now
    return max(0.0, _seconds(waited_until, source_ended_at))


def lineage_ledgers(jobs: Sequence[JobTimes], *, now: datetime) -> tuple[Ledger, dict[str, Ledger]]:
    """The lineage's ledger and each job's (which sum to it). A job's ledger holds the idle
    gap between the end of the job it was resumed from and its own submission."""
    by_id = {job.job_id: job for job in jobs}
    per_job: dict[str, Ledger] = {}
    for job in jobs:
        source = by_id.get(job.source_id) if job.source_id else None
        source_end = source.end(now) if source is not None and source.ended_at else None
        idle = idle_before(job, source_ended_at=source_end, now=now)
        per_job[job.job_id] = job_ledger(
            job,
            now=now,
            idle_before_s=idle,
            recovery_gap=source is not None and source.incident,
        )
    return sum_ledgers(per_job.values()), per_job


def lineages(links: Sequence[LineageLink]) -> list[list[LineageLink]]:
    """Split links of many jobs into lineages: jobs joined through the job each was resumed
    from (a source outside ``links`` starts a lineage of its own there)."""
    parent = {link.job_id: link.job_id for link in links}

    def root(job_id: str) -> str:
        while parent[job_id] != job_id:
            parent[job_id] = parent[parent[job_id]]
            job_id = parent[job_id]
        return job_id

    for link in links:
        if link.source_id in parent:
            parent[root(link.job_id)] = root(link.source_id)
    groups: dict[str, list[LineageLink]] = {}
    for link in links:
        groups.setdefault(root(link.job_id), []).append(link)
    return list(groups.values())


def iso_week(moment: datetime) -> str:
    """The ISO week of ``moment`` (in its own time zone), as ``2026-W09``."""
    year, week, _ = moment.isocalendar()
    return f"{year}-W{week:02d}"


def sum_ledgers(ledgers: Iterable[Ledger]) -> Ledger:
    """Ledgers added bucket by bucket (their ratio is Σ productive / Σ wall)."""
    buckets = dict.fromkeys(BUCKETS, 0.0)
    wall = 0.0
    for ledger in ledgers:
        wall += ledger.wall_s
        for name in BUCKETS:
            buckets[name] += ledger.buckets[name]
    return Ledger(wall_s=wall, buckets=buckets)


# Advice -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailureHistory:
    """A cluster's ended jobs: how many were interrupted, over how many GPU-hours."""

    interruptions: int = 0
    gpu_hours: float = 0.0


def job_gpus(*, nodes: int, gpus_per_node: int, tasks_per_node: int) -> int:
    """GPUs of a job; its ranks when it asks for no GPU (each rank fails alike)."""
    return max(1, nodes * (gpus_per_node or tasks_per_node))


def mean_time_to_interruption(
    history: FailureHistory, *, gpus: int, prior_s: float = PRIOR_MTTI_S
) -> tuple[float, bool]:
    """Seconds between interruptions for a job of ``gpus`` GPUs, and whether the prior
    still weighs much (see the module docstring for the blend)."""
    gpus = max(1, gpus)
    prior_gpu_hours = PRIOR_INTERRUPTIONS * (prior_s / 3600.0) * gpus
    rate_per_gpu_hour = (PRIOR_INTERRUPTIONS + max(0, history.interruptions)) / (
        prior_gpu_hours + max(0.0, history.gpu_hours)
    )
    mtti_s = 3600.0 / (rate_per_gpu_hour * gpus)
    return mtti_s, history.interruptions < MIN_OBSERVED_INTERRUPTIONS


def young_daly_interval(*, checkpoint_cost_s: float, mtti_s: float) -> float:
    """τ* = sqrt(2·C·M)."""
    return math.sqrt(2.0 * max(0.0, checkpoint_cost_s) * max(0.0, mtti_s))


def expected_goodput(
    *, interval_s: float, checkpoint_cost_s: float, mtti_s: float, restore_s: float
) -> float | None:
    """First order: 1 − C/τ − τ/(2M) − R/M, clipped to [0, 1]."""
    if interval_s <= 0 or mtti_s <= 0:
        return None
    waste = checkpoint_cost_s / interval_s + interval_s / (2 * mtti_s) + restore_s / mtti_s
    return _clamp(1.0 - waste, 0.0, 1.0)


def median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def checkpoint_interval_steps(
    checkpoint_steps: Iterable[int], *, start_step: int = 0, configured: int | None = None
) -> int | None:
    """Steps between checkpoints: the median gap between the job's checkpoint steps
    (from its start step), else the configured ``checkpoint_every``."""
    steps = sorted({step for step in checkpoint_steps if step > start_step})
    gaps = [b - a for a, b in zip([start_step, *steps], steps, strict=False)]
    # The trainer also saves the final step: a short last gap is that, not the interval.
    if len(gaps) >= 2 and gaps[-1] < gaps[-2]:
        gaps.pop()
    gap = median([float(g) for g in gaps])
    if gap is not None and gap > 0:
        return round(gap)
    if configured and configured > 0:
        return configured
    return None


@dataclass(frozen=True)
class Advice:
    current_interval_s: float | None
    optimal_interval_s: float | None
    expected_ratio_now: float | None
    expected_ratio_optimal: float | None
    checkpoint_cost_s: float | None
    mtti_s: float
    restore_s: float | None
    prior_used: bool
    restore_source: str
    interruptions: int
    gpu_hours: float

    def as_dict(self) -> dict[str, object]:
        return {
            "current_interval_s": self.current_interval_s,
            "optimal_interval_s": self.optimal_interval_s,
            "expected_ratio_now": self.expected_ratio_now,
            "expected_ratio_optimal": self.expected_ratio_optimal,
            "inputs": {
                "checkpoint_cost_s": self.checkpoint_cost_s,
                "mtti_s": self.mtti_s,
                "restore_s": self.restore_s,
                "prior_used": self.prior_used,
                "restore_source": self.restore_source,
                "interruptions": self.interruptions,
                "gpu_hours": self.gpu_hours,
            },
        }


def checkpoint_advice(
    *,
    checkpoint_cost_s: float | None,
    history: FailureHistory,
    gpus: int,
    step_time_s: float | None,
    interval_steps: int | None,
    restore_s: float | None,
    restore_source: str = "none",
) -> Advice:
    """Young/Daly advice for one job: the interval it uses, the optimal one, and the
    expected goodput of each. Values it cannot compute are None."""
    mtti_s, prior_used = mean_time_to_interruption(history, gpus=gpus)
    restore = restore_s if restore_s is not None else 0.0
    current = None
    if interval_steps and step_time_s and step_time_s > 0:
        current = interval_steps * step_time_s
    optimal = None
    if checkpoint_cost_s is not None and checkpoint_cost_s > 0:
        optimal = young_daly_interval(checkpoint_cost_s=checkpoint_cost_s, mtti_s=mtti_s)
        # One cannot checkpoint more often than once a step.
        if step_time_s and step_time_s > 0:
            optimal = max(optimal, step_time_s)
    cost = checkpoint_cost_s or 0.0
    now_ratio = (
        expected_goodput(
            interval_s=current, checkpoint_cost_s=cost, mtti_s=mtti_s, restore_s=restore
        )
        if current
        else None
    )
    optimal_ratio = (
        expected_goodput(
            interval_s=optimal, checkpoint_cost_s=cost, mtti_s=mtti_s, restore_s=restore
        )
        if optimal
        else None
    )
    return Advice(
        current_interval_s=current,
        optimal_interval_s=optimal,
        expected_ratio_now=now_ratio,
        expected_ratio_optimal=optimal_ratio,
        checkpoint_cost_s=checkpoint_cost_s,
        mtti_s=mtti_s,
        restore_s=restore_s,
        prior_used=prior_used,
        restore_source=restore_source if restore_s is not None else "none",
        interruptions=history.interruptions,
        gpu_hours=history.gpu_hours,
    )


def format_duration(seconds: float | None) -> str:
    """A duration for people: "42 s", "3.5 min", "2.1 h", "1.5 d"."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
