"""The live chart's downsampled series (``jobs.metric_series``): extended with each chunk's
new steps, it is what averaging every stored point again gives; a chunk that rewrites stored
steps builds it again; the width doubles as the run grows; at most ``max_points`` points."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from django.core.cache import cache

from factories import JobFactory
from jobs import metric_series
from jobs.ingest import metrics_ingest
from jobs.models import Job, MetricPoint
from jobs.selectors import METRIC_SERIES, job_metrics

pytestmark = pytest.mark.django_db


def lines(steps: Any, seed: int = 0, missing_every: int = 0) -> bytes:
    rng = random.Random(seed)
    out = []
    for step in steps:
        row: dict[str, Any] = {
            "step": step,
            "time": 1_800_000_000 + step,
            "elapsed": float(step),
            "loss": rng.uniform(1.0, 3.0),
            "samples_per_s": rng.uniform(50.0, 150.0),
            "tokens_per_s": 6400.0,
            "step_time": rng.uniform(0.05, 0.2),
            "data_time": 0.01,
            "checkpoint_blocking_time": 0.0,
        }
        if missing_every and step % missing_every == 0:
            del row["loss"]  # a step that logged no loss: the mean skips it
        out.append(json.dumps(row))
    return ("\n".join(out) + "\n").encode()


def ingest(job: Job, data: bytes) -> None:
    stored, _ = metrics_ingest(job=job, data=data, start_offset=job.metrics_offset)
    assert stored
    job.refresh_from_db()


def expected(job: Job, max_points: int) -> dict[str, Any]:
    """Averaging every stored point in Python, in the aligned buckets of ``width_for``."""
    points = list(MetricPoint.objects.filter(job=job).order_by("step").values())
    width = metric_series.width_for(points[0]["step"], points[-1]["step"], max_points)
    buckets: dict[int, list[dict[str, Any]]] = {}
    for point in points:
        buckets.setdefault(point["step"] // width, []).append(point)
    out: dict[str, Any] = {"step": [], "series": {name: [] for name in METRIC_SERIES}}
    for index in sorted(buckets):
        rows = buckets[index]
        out["step"].append(max(row["step"] for row in rows))
        for name in METRIC_SERIES:
            values = [row[name] for row in rows if row[name] is not None]
            out["series"][name].append(sum(values) / len(values) if values else None)
    out["count"] = len(points)
    return out


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["count"] == want["count"]
    assert got["step"] == want["step"]
    for name in METRIC_SERIES:
        assert got["series"][name] == pytest.approx(want["series"][name], rel=1e-9), name


@pytest.fixture(autouse=True)
def _empty_cache() -> Any:
    cache.clear()
    yield
    cache.clear()


def test_each_chunk_extends_the_series_to_what_a_full_average_gives(monkeypatch: Any) -> None:
    job = JobFactory(state=Job.State.RUNNING)
    reads: list[int] = []
    real = metric_series._buckets

    def recording(job: Job, width: int, series: Any, from_step: int) -> Any:
        reads.append(from_step)
        return real(job, width, series, from_step)

    monkeypatch.setattr(metric_series, "_buckets", recording)
    ingest(job, lines(range(0, 3000), seed=1, missing_every=7))
    first = job_metrics(job=job, max_points=500)
    assert first["downsampled"] and len(first["step"]) <= 500
    assert_same(first, expected(job, 500))
    assert reads == [0]  # built once from every point
    start = 3000
    for chunk in range(12):  # a running job: a watcher cycle's steps at a time
        size = 37 + chunk * 50
        newest, width = start - 1, metric_series.width_for(0, start - 1, 500)
        ingest(job, lines(range(start, start + size), seed=chunk + 2, missing_every=5))
        start += size
        got = job_metrics(job=job, max_points=500)
        assert len(got["step"]) <= 500 and got["step"][-1] == start - 1
        assert_same(got, expected(job, 500))
        # Read from the first step of the bucket that held the newest step on, no earlier.
        assert reads[-1] == newest // width * width and len(reads) == chunk + 2
    # The run outgrew 500 buckets of the first width: the width doubled on the way.
    assert metric_series.width_for(0, start - 1, 500) > metric_series.width_for(0, 2999, 500)


def test_a_chunk_that_rewrites_stored_steps_builds_the_series_again() -> None:
    job = JobFactory(state=Job.State.RUNNING)
    ingest(job, lines(range(0, 2000), seed=1))
    before = job_metrics(job=job, max_points=100)
    assert_same(before, expected(job, 100))
    # A resumed run logs steps 1000.. again with other values.
    ingest(job, lines(range(1000, 2500), seed=9))
    assert job.points_rebuilt_offset == job.metrics_offset
    after = job_metrics(job=job, max_points=100)
    assert_same(after, expected(job, 100))
    assert after["series"]["loss"] != before["series"]["loss"]


def test_a_lost_state_and_a_job_without_kept_sums_give_the_same_series() -> None:
    job = JobFactory(state=Job.State.RUNNING)
    ingest(job, lines(range(5, 4005), seed=3))
    kept = job_metrics(job=job, max_points=300)
    cache.clear()
    assert job_metrics(job=job, max_points=300) == kept
    # Sums not kept (points stored some other way): every point averaged, no state reused.
    Job.objects.filter(pk=job.pk).update(points_totals_offset=None)
    job.refresh_from_db()
    cache.clear()
    whole = job_metrics(job=job, max_points=300)
    assert whole["count"] == kept["count"] == 4000
    assert whole["downsampled"] and len(whole["step"]) <= 300 and whole["step"][-1] == 4004


def test_merging_pairs_of_buckets_adds_their_sums_and_counts() -> None:
    buckets = [
        [4, 2, 9, [3.0, 1.0], [2, 1]],
        [5, 1, 10, [2.0, 0.0], [1, 0]],
        [6, 3, 13, [6.0, 0.0], [3, 0]],
    ]
    assert metric_series._merge_pairs(buckets) == [
        [2, 3, 10, [5.0, 1.0], [3, 1]],
        [3, 3, 13, [6.0, 0.0], [3, 0]],
    ]
    assert metric_series.width_for(0, 999, 1000) == 1
    assert metric_series.width_for(0, 1000, 1000) == 2
    assert metric_series.width_for(1000, 2999, 1000) == 2
