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

from typing import Any

from django.db.models import Count, F, Max, Min, Sum

from core import cache
from jobs.models import Job, MetricPoint

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
    """The job's points from ``from_step`` on, in buckets of ``width`` steps (one query)."""
    aggregates: dict[str, Any] = {"points": Count("id"), "last": Max("step")}
    for name in series:
        aggregates[f"sum_{name}"] = Sum(name)
        aggregates[f"n_{name}"] = Count(name)
    rows = (
        MetricPoint.objects.filter(job=job, step__gte=from_step)
        .annotate(bucket=F("step") / width)
        .values("bucket")
        .annotate(**aggregates)
        .order_by("bucket")
    )
    return [
        [
            row["bucket"],
            row["points"],
            row["last"],
            [float(row[f"sum_{name}"] or 0.0) for name in series],
            [row[f"n_{name}"] for name in series],
        ]
        for row in rows
    ]


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
