"""A job's whole metric series downsampled for its charts, kept up to date incrementally.

The job page polls its metrics every few seconds while the job runs, and every watcher cycle
appends steps. Averaging every stored point into buckets again on each new chunk costs a
scan of all of them (100k points: ~60-100 ms on PostgreSQL); this module does it once and
then only reads the steps of the newest bucket and after.

Buckets are aligned: bucket ``b`` of width ``w`` (a power of two) holds steps ``b*w`` to
``(b+1)*w - 1``, and ``w`` is the smallest power of two that leaves at most ``max_points``
buckets between the first and the newest step. Each bucket keeps its point count, its last
step and per series the sum and the count of values (a mean skips missing values, as SQL's
AVG does), so that

- new steps (appended after the newest stored one, as a running job's are) change only the
  last bucket and add new ones: read the points from the last bucket's first step on;
- when the steps outgrow ``max_points`` buckets, the width doubles and pairs of buckets
  merge exactly (sums and counts add up).

A chunk that rewrites stored steps (a resumed run) or a bulk load sets the job's
``points_rebuilt_offset`` (``jobs.ingest``), which is in the cache key: the series is then
built again from every point. So is a job whose point sums ingest did not keep. The state
lives in ``core.cache`` (Redis, shared by the web workers); a lost state costs one full
build.
"""

from __future__ import annotations

import math
from typing import Any

from django.db.models import Count, ExpressionWrapper, F, IntegerField, Max, Min, QuerySet, Sum

from core import cache
from core.prepared import int_literal
from jobs.metric_retention import ROLLUP_SERIES
from jobs.models import Job, MetricPoint, MetricRollup

# One bucket: [index, points, last step, [sum per series], [values per series]].
Bucket = list[Any]


def width_for(lo: int, hi: int, max_points: int) -> int:
    """The smallest power of two ``w`` with at most ``max_points`` aligned buckets of ``w``
    steps from step ``lo`` to step ``hi``."""
    width = 1
    while hi // width - lo // width + 1 > max_points:
        width *= 2
    return width


def _buckets(job: Job, width: int, series: tuple[str, ...], from_step: int) -> list[Bucket]:
    """The job's points from ``from_step`` on, in buckets of ``width`` steps (one query, and
    one more for its roll-ups when ``from_step`` reaches back to them)."""
    aggregates: dict[str, Any] = {"points": Count("id"), "last": Max("step")}
    for name in series:
        aggregates[f"sum_{name}"] = Sum(name)
        aggregates[f"n_{name}"] = Count(name)
    rows = (
        MetricPoint.objects.filter(job=job, step__gte=from_step)
        .annotate(bucket=F("step") / int_literal(width))
        .values("bucket")
        .annotate(**aggregates)
        .order_by("bucket")
    )
    buckets = [
        [
            row["bucket"],
            row["points"],
            row["last"],
            [float(row[f"sum_{name}"] or 0.0) for name in series],
            [row[f"n_{name}"] for name in series],
        ]
        for row in rows
    ]
    rolled_to = job.metrics_rolled_up_to
    if rolled_to is None or from_step > rolled_to:
        return buckets
    return _merge_same(buckets + rollup_buckets(job.id, width, series, from_step))


def rollup_buckets(
    job_id: Any, width: int, series: tuple[str, ...], from_step: int
) -> list[Bucket]:
    """The job's roll-ups from ``from_step`` on as buckets of ``width`` steps, each in the
    bucket of its first step: whole roll-ups when ``width`` is a multiple of theirs (both
    powers of two), so the figures are those of the raw points they replaced."""
    rollups = MetricRollup.objects.filter(job_id=job_id, first_step__gte=from_step)
    bucket = F("first_step") / int_literal(width)
    return _rollups_as_buckets(rollups.annotate(bucket=bucket), series)


def _rollups_as_buckets(rollups: QuerySet[Any], series: tuple[str, ...]) -> list[Bucket]:
    """Roll-ups annotated with their ``bucket``, summed per bucket (one query). A bucket
    that holds a non-finite loss has a NaN loss sum, as SQL's sum of the raw points has."""
    aggregates: dict[str, Any] = {"points": Sum("count"), "last": Max("last_step")}
    for name in series:
        stem = ROLLUP_SERIES[name]
        aggregates[f"sum_{name}"] = Sum(f"{stem}_sum")
        aggregates[f"n_{name}"] = Sum(f"{stem}_count")
    aggregates["nonfinite"] = Sum("loss_nonfinite")
    buckets = []
    for row in rollups.values("bucket").annotate(**aggregates).order_by("bucket"):
        sums = [float(row[f"sum_{name}"] or 0.0) for name in series]
        counts = [int(row[f"n_{name}"] or 0) for name in series]
        if row["nonfinite"] and "loss" in series:
            index = series.index("loss")
            sums[index], counts[index] = math.nan, counts[index] + row["nonfinite"]
        buckets.append([row["bucket"], row["points"], row["last"], sums, counts])
    return buckets


def _merge_same(buckets: list[Bucket]) -> list[Bucket]:
    """``buckets`` in order of their index, those with the same index added up."""
    merged: list[Bucket] = []
    for index, points, last, sums, counts in sorted(buckets, key=lambda bucket: bucket[0]):
        if merged and merged[-1][0] == index:
            into = merged[-1]
            into[1] += points
            into[2] = max(into[2], last)
            into[3] = [a + b for a, b in zip(into[3], sums, strict=True)]
            into[4] = [a + b for a, b in zip(into[4], counts, strict=True)]
        else:
            merged.append([index, points, last, list(sums), list(counts)])
    return merged


def _merge_pairs(buckets: list[Bucket]) -> list[Bucket]:
    """The same points in buckets twice as wide."""
    merged: list[Bucket] = []
    for index, points, last, sums, counts in buckets:
        if merged and merged[-1][0] == index // 2:
            into = merged[-1]
            into[1] += points
            into[2] = max(into[2], last)
            into[3] = [a + b for a, b in zip(into[3], sums, strict=True)]
            into[4] = [a + b for a, b in zip(into[4], counts, strict=True)]
        else:
            merged.append([index // 2, points, last, list(sums), list(counts)])
    return merged


def _build(job: Job, max_points: int, series: tuple[str, ...]) -> dict[str, Any] | None:
    """Every stored point in buckets, or None when the job has none."""
    # Both ends from the (job, step) index (PostgreSQL's min/max optimisation).
    ends = MetricPoint.objects.filter(job=job).aggregate(lo=Min("step"), hi=Max("step"))
    lo, hi = ends["lo"], ends["hi"]
    if job.metrics_rolled_up_to is not None:
        rolled = MetricRollup.objects.filter(job=job).aggregate(
            lo=Min("first_step"), hi=Max("last_step")
        )
        if rolled["lo"] is not None:
            lo = rolled["lo"] if lo is None else min(lo, rolled["lo"])
            hi = rolled["hi"] if hi is None else max(hi, rolled["hi"])
    if lo is None or hi is None:
        return None
    width = width_for(lo, hi, max_points)
    return {"lo": lo, "width": width, "buckets": _buckets(job, width, series, lo)}


def _extend(state: dict[str, Any], job: Job, max_points: int, series: tuple[str, ...]) -> None:
    """``state`` with the steps stored since it was built (appended after its newest)."""
    buckets: list[Bucket] = state["buckets"]
    width: int = state["width"]
    last = buckets[-1][0]
    fresh = _buckets(job, width, series, last * width)
    buckets[:] = [bucket for bucket in buckets if bucket[0] < last] + fresh
    while buckets[-1][0] - buckets[0][0] + 1 > max_points:
        width *= 2
        buckets[:] = _merge_pairs(buckets)
    state["width"] = width


def _keep(key: str | None, state: dict[str, Any], offset: int) -> None:
    """Keep ``state`` (its points as of ``offset``) for the next request."""
    state["offset"] = offset
    if key:
        cache.put(cache.JOB_SERIES_STATE, key, state)


def downsampled_series(job: Job, max_points: int, series: tuple[str, ...]) -> dict[str, Any]:
    """The job's every stored step in at most ``max_points`` points: ``count`` (stored
    points), ``step`` (each bucket's last step) and ``series`` (each bucket's mean per
    series, None without values), as of ``job.metrics_offset``."""
    key = (
        cache.key_job_series_state(
            job_id=job.id,
            rebuilt_offset=job.points_rebuilt_offset,
            max_points=max_points,
            series=series,
        )
        if job.points_totals_valid
        else None
    )
    state = cache.get(cache.JOB_SERIES_STATE, key) if key else None
    if state is None:
        state = _build(job, max_points, series)
        if state is None:
            return {"count": 0, "step": [], "series": {name: [] for name in series}}
        _keep(key, state, job.metrics_offset)
    elif state["offset"] < job.metrics_offset:
        _extend(state, job, max_points, series)
        _keep(key, state, job.metrics_offset)
    # (A state newer than the job row read here, kept by another request, is shown as is.)
    buckets = state["buckets"]
    return {
        "count": sum(bucket[1] for bucket in buckets),
        "step": [bucket[2] for bucket in buckets],
        "series": {
            name: [bucket[3][i] / bucket[4][i] if bucket[4][i] else None for bucket in buckets]
            for i, name in enumerate(series)
        },
    }


def ranged_series(
    job: Job,
    step_min: int | None,
    step_max: int | None,
    max_points: int,
    series: tuple[str, ...],
) -> dict[str, Any]:
    """The job's steps from ``step_min`` to ``step_max`` (either end open), raw points and
    the roll-ups wholly inside the range together, in at most ``max_points`` points:
    ``count`` (logged steps), ``downsampled``, ``step`` and ``series`` (as
    ``downsampled_series``). A roll-up is one point (its last step, its means) when the
    range holds no more points than that; over it, points and roll-ups go into
    ``max_points`` equal buckets of steps. The cost follows the raw points and roll-ups
    stored, not the steps they stand for."""
    points = MetricPoint.objects.filter(job=job)
    rollups = MetricRollup.objects.filter(job=job)
    if step_min is not None:
        points = points.filter(step__gte=step_min)
        rollups = rollups.filter(first_step__gte=step_min)
    if step_max is not None:
        points = points.filter(step__lte=step_max)
        rollups = rollups.filter(last_step__lte=step_max)
    raw = points.aggregate(lo=Min("step"), hi=Max("step"), n=Count("id"))
    rolled = rollups.aggregate(lo=Min("first_step"), hi=Max("last_step"), n=Sum("count"))
    count = (raw["n"] or 0) + (rolled["n"] or 0)
    ends = [
        value for value in (raw["lo"], raw["hi"], rolled["lo"], rolled["hi"]) if value is not None
    ]
    if not count:
        buckets: list[Bucket] = []
    elif count <= max_points:
        buckets = _merge_same(
            _range_buckets(points, None, series)
            + _rollups_as_buckets(rollups.annotate(bucket=F("last_step")), series)
        )
    else:
        lo, hi = min(ends, default=0), max(ends, default=0)
        index = (lo, max_points, hi - lo + 1)
        buckets = _merge_same(
            _range_buckets(points, index, series)
            + _rollups_as_buckets(rollups.annotate(bucket=_bucket_of("first_step", index)), series)
        )
    return {
        "count": count,
        "downsampled": count > max_points or bool(rolled["n"]),
        "step": [bucket[2] for bucket in buckets],
        "series": {
            name: [bucket[3][i] / bucket[4][i] if bucket[4][i] else None for bucket in buckets]
            for i, name in enumerate(series)
        },
    }


def _bucket_of(field: str, index: tuple[int, int, int] | None) -> Any:
    """A step field as its bucket: ``max_points`` equal buckets from ``lo`` (``index``), or
    each step alone (None)."""
    if index is None:
        return F(field)
    lo, max_points, span = index
    return ExpressionWrapper((F(field) - lo) * max_points / span, output_field=IntegerField())


def _range_buckets(
    points: QuerySet[MetricPoint], index: tuple[int, int, int] | None, series: tuple[str, ...]
) -> list[Bucket]:
    aggregates: dict[str, Any] = {"points": Count("id"), "last": Max("step")}
    for name in series:
        aggregates[f"sum_{name}"] = Sum(name)
        aggregates[f"n_{name}"] = Count(name)
    rows = points.annotate(bucket=_bucket_of("step", index)).values("bucket").annotate(**aggregates)
    return [
        [
            row["bucket"],
            row["points"],
            row["last"],
            [
                float(row[f"sum_{name}"]) if row[f"sum_{name}"] is not None else 0.0
                for name in series
            ],
            [row[f"n_{name}"] for name in series],
        ]
        for row in rows.order_by("bucket")
    ]
