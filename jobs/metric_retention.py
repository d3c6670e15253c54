"""Metric retention: a long job's old logged steps folded into roll-ups (``MetricRollup``).

A job keeps its newest ``GANTRY_METRICS_FULL_RESOLUTION_STEPS`` logged steps as raw points,
and a job with no more than that is never touched. Older steps go, bucket by aligned bucket
of ``GANTRY_METRICS_ROLLUP_BUCKET`` steps, into one roll-up row each, and their raw points
are deleted. Some steps stay raw whatever their age, because a reader needs each of them:

- the steps from each checkpoint still on the cluster (or that a job resumed from) up to
  ``GANTRY_DRILL_MAX_REPLAY_STEPS`` after it: a drill compares its losses step by step with
  these (``drills.reference``), and goodput splits a redone job's steps at the resumed step;
- the steps before and at the job's first non-finite loss: recovery's evidence
  (``recovery.detect``, ``recovery.resume``);
- every step that saved a checkpoint (``checkpoint_blocking_s > 0``): the median save cost
  reads those (``jobs.goodput.selectors``).

A bucket that overlaps a kept range stays wholly raw (and is rolled up once the checkpoint
is gone), so a roll-up never straddles a resumed step. Recovery reads the newest points,
always in the raw window.

Safe to re-run and to run twice at once: each batch runs in one transaction that locks the
job's row (ingest takes the same lock to store points), inserts the roll-ups, deletes the
points they hold and moves the job's ``metrics_rolled_up_to`` watermark conditionally on
the value it read; a racing second run finds the points gone, and the unique (job, first
step) of roll-ups fails closed should anything slip through.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Avg, Count, F, Max, Min, Q, QuerySet, Sum

from core.prepared import int_literal
from jobs.models import Checkpoint, Job, MetricPoint, MetricRollup

logger = logging.getLogger(__name__)

# Buckets per transaction: bounded work (and lock time) per batch.
BATCH_BUCKETS = 256
# Steps before a non-finite loss kept raw: recovery reads up to 256 logged steps back.
NONFINITE_KEEP_STEPS = 256
_INF = math.inf
# Finite and non-finite values of the loss (PostgreSQL orders NaN above +inf).
_FINITE_LOSS = Q(loss__gt=-_INF, loss__lt=_INF)
_NONFINITE_LOSS = Q(loss__gte=_INF) | Q(loss__lte=-_INF)
# Roll-up column stems of the chart's series, by the raw point's field.
ROLLUP_SERIES = {
    "loss": "loss",
    "samples_per_s": "samples_per_s",
    "tokens_per_s": "tokens_per_s",
    "step_time_s": "step_time",
    "data_time_s": "data_time",
    "checkpoint_blocking_s": "checkpoint_blocking",
    "elapsed_s": "elapsed",
}


class _Raced(Exception):
    """Another run moved the watermark first: this batch's transaction is rolled back."""


@dataclass
class RollupResult:
    jobs: int = 0
    buckets: int = 0
    points: int = 0


def kept_ranges(job: Job) -> list[tuple[int, int]]:
    """The step ranges (inclusive) of ``job`` that stay raw whatever their age (see the
    module's docstring), bar the newest window and the checkpoint-saving steps."""
    replay = int(settings.DRILL_MAX_REPLAY_STEPS)
    steps = (
        Checkpoint.objects.filter(job_id=job.id)
        .filter(Q(deleted_at__isnull=True) | Q(resumed_jobs__isnull=False))
        .values_list("step", flat=True)
        .distinct()
    )
    ranges = [(int(step), int(step) + replay) for step in steps]
    if job.nonfinite_loss_step is not None:
        bad = int(job.nonfinite_loss_step)
        ranges.append((max(0, bad - NONFINITE_KEEP_STEPS), bad))
    return ranges


def _full_resolution_from(job_id: Any, keep: int) -> int | None:
    """The step of the job's ``keep``-th newest raw point (None: it has no more)."""
    found = (
        MetricPoint.objects.filter(job_id=job_id)
        .order_by("-step")
        .values_list("step", flat=True)[keep - 1 : keep]
    )
    return next(iter(found), None)


def _eligible(job: Job, limit: int, width: int) -> QuerySet[MetricPoint]:
    """The job's raw points that may be rolled up: below ``limit`` (a bucket start), not
    in a bucket that overlaps a kept range, not a step that saved a checkpoint."""
    points = MetricPoint.objects.filter(job_id=job.id, step__lt=limit).exclude(
        checkpoint_blocking_s__gt=0
    )
    for low, high in kept_ranges(job):
        points = points.exclude(
            step__gte=(low // width) * width, step__lt=(high // width + 1) * width
        )
    return points


def _aggregates() -> dict[str, Any]:
    """The roll-up's columns as aggregates of its raw points."""
    values: dict[str, Any] = {
        "first_step": Min("step"),
        "last_step": Max("step"),
        "count": Count("id"),
        "first_wall_time": Min("wall_time"),
        "last_wall_time": Max("wall_time"),
        "first_elapsed_s": Min("elapsed_s"),
        "loss_min": Min("loss", filter=_FINITE_LOSS),
        "loss_max": Max("loss", filter=_FINITE_LOSS),
        "loss_mean": Avg("loss", filter=_FINITE_LOSS),
        "loss_nonfinite": Count("id", filter=_NONFINITE_LOSS),
        "step_time_mean": Avg("step_time_s"),
        "samples_per_s_mean": Avg("samples_per_s"),
        "loss_sum": Sum("loss", filter=_FINITE_LOSS),
        "loss_count": Count("loss", filter=_FINITE_LOSS),
    }
    for field, stem in ROLLUP_SERIES.items():
        if field != "loss":
            values[f"{stem}_sum"] = Sum(field)
            values[f"{stem}_count"] = Count(field)
    return values


def _rollup_rows(job_id: Any, points: QuerySet[MetricPoint], width: int) -> list[MetricRollup]:
    rows = (
        points.annotate(bucket=F("step") / int_literal(width))
        .values("bucket")
        .annotate(**_aggregates())
        .order_by("bucket")
    )
    rollups = []
    for row in rows:
        row.pop("bucket")
        for key, value in row.items():
            if value is None and key.endswith("_sum"):
                row[key] = 0.0
        rollups.append(MetricRollup(job_id=job_id, **row))
    return rollups


def _batch(job_id: Any, keep: int, width: int) -> tuple[int, int]:
    """Roll up one batch of the job's oldest eligible buckets: (points, buckets) rolled up,
    (0, 0) when nothing is left to do. One transaction."""
    with transaction.atomic():
        job = (
            Job.objects.select_for_update()
            .only("id", "metrics_rolled_up_to", "nonfinite_loss_step")
            .get(id=job_id)
        )
        newest_kept = _full_resolution_from(job.id, keep)
        if newest_kept is None:
            return 0, 0
        limit = (newest_kept // width) * width
        eligible = _eligible(job, limit, width)
        first = eligible.order_by("step").values_list("step", flat=True).first()
        if first is None:
            return 0, 0
        upto = min(limit, (first // width + BATCH_BUCKETS) * width)
        batch = eligible.filter(step__lt=upto)
        rollups = _rollup_rows(job.id, batch, width)
        MetricRollup.objects.bulk_create(rollups)
        deleted, _ = batch.delete()
        old = job.metrics_rolled_up_to
        mark = upto - 1 if old is None else max(old, upto - 1)
        same = Q(metrics_rolled_up_to__isnull=True) if old is None else Q(metrics_rolled_up_to=old)
        if not Job.objects.filter(same, id=job.id).update(metrics_rolled_up_to=mark):
            raise _Raced
        if deleted != sum(rollup.count for rollup in rollups):
            raise IntegrityError(f"job {job.id}: deleted {deleted} points, rolled up other")
        return deleted, len(rollups)


def metrics_rollup_job(
    *, job_id: Any, deadline: float | None = None, keep: int | None = None
) -> RollupResult:
    """Roll up the job's eligible old steps, batch by batch, until none is left or the
    ``deadline`` (``time.monotonic()``) passes. Safe to re-run (see the module)."""
    keep = keep or int(settings.METRICS_FULL_RESOLUTION_STEPS)
    width = int(settings.METRICS_ROLLUP_BUCKET)
    result = RollupResult(jobs=1)
    while deadline is None or time.monotonic() < deadline:
        try:
            rolled, buckets = _batch(job_id, keep, width)
        except (_Raced, IntegrityError) as error:
            # Another run got there first (or a bucket was rolled up already): next time.
            logger.info("metric roll-up of job %s stopped: %r", job_id, error)
            break
        if not rolled:
            break
        result.points += rolled
        result.buckets += buckets
    return result


def metrics_rollup_due(*, time_budget_s: float = 120.0) -> RollupResult:
    """Roll up every long job's old steps: the jobs with more logged steps than the full
    resolution window whose point sums ingest keeps (the readers take a roll-up's sums
    from there); within ``time_budget_s``, the rest next time."""
    keep = int(settings.METRICS_FULL_RESOLUTION_STEPS)
    deadline = time.monotonic() + time_budget_s
    total = RollupResult()
    candidates = (
        Job.objects.filter(points_count__gt=keep, points_totals_offset=F("metrics_offset"))
        .order_by("created_at")
        .values_list("id", flat=True)
    )
    for job_id in candidates:
        if time.monotonic() >= deadline:
            break
        done = metrics_rollup_job(job_id=job_id, deadline=deadline, keep=keep)
        total.jobs += 1 if done.points else 0
        total.buckets += done.buckets
        total.points += done.points
    return total


def rollups_invalidate_from(*, job_id: Any, step: int, watermark: int | None) -> int | None:
    """Ingest is storing ``step`` again (a run resumed in place replays its steps): drop
    the job's roll-ups from the one holding ``step`` on (the replay supersedes them) and
    return the watermark to set; the caller holds the job's row. None: no roll-up left."""
    width = int(settings.METRICS_ROLLUP_BUCKET)
    if watermark is None or step > watermark:
        return watermark
    MetricRollup.objects.filter(job_id=job_id, last_step__gte=step).delete()
    lowered = (step // width) * width - 1
    return lowered if lowered >= 0 else None


def stored_totals(job_id: Any) -> dict[str, Any]:
    """Sums over every logged step of the job, raw points and roll-ups together: count,
    last step, step/data/blocking seconds, and the first step's wall time and elapsed
    seconds and the last step's wall time."""
    points = MetricPoint.objects.filter(job_id=job_id)
    raw = points.aggregate(
        count=Count("id"),
        last=Max("step"),
        step_time=Sum("step_time_s"),
        data_time=Sum("data_time_s"),
        blocking=Sum("checkpoint_blocking_s"),
    )
    first: Mapping[str, Any] | None = (
        points.order_by("step").values("step", "wall_time", "elapsed_s").first()
    )
    last: Mapping[str, Any] | None = points.order_by("-step").values("step", "wall_time").first()
    rolled = MetricRollup.objects.filter(job_id=job_id)
    sums = rolled.aggregate(
        count=Sum("count"),
        last=Max("last_step"),
        step_time=Sum("step_time_sum"),
        data_time=Sum("data_time_sum"),
        blocking=Sum("checkpoint_blocking_sum"),
    )
    if sums["count"]:
        head = (
            rolled.order_by("first_step")
            .values("first_step", "first_wall_time", "first_elapsed_s")
            .first()
        )
        tail = rolled.order_by("-last_step").values("last_step", "last_wall_time").first()
        if head and (first is None or head["first_step"] < first["step"]):
            first = {"wall_time": head["first_wall_time"], "elapsed_s": head["first_elapsed_s"]}
        if tail and (last is None or tail["last_step"] > last["step"]):
            last = {"wall_time": tail["last_wall_time"]}
    lasts = [value for value in (raw["last"], sums["last"]) if value is not None]
    return {
        "count": (raw["count"] or 0) + (sums["count"] or 0),
        "last": max(lasts) if lasts else None,
        "step_time": (raw["step_time"] or 0.0) + (sums["step_time"] or 0.0),
        "data_time": (raw["data_time"] or 0.0) + (sums["data_time"] or 0.0),
        "blocking": (raw["blocking"] or 0.0) + (sums["blocking"] or 0.0),
        "first_wall": first["wall_time"] if first else None,
        "first_elapsed": first["elapsed_s"] if first else None,
        "last_wall": last["wall_time"] if last else None,
    }
