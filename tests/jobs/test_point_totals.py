"""The sums ingest keeps on a job (``Job.points_*``): equal to the sums of its stored points
after appending chunks and after a chunk that rewrites stored steps, and the goodput ledger
the same whether it reads them or sums the points."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count, Max, Sum
from django.test.utils import CaptureQueriesContext

from factories import JobFactory
from jobs.goodput.selectors import job_goodput
from jobs.ingest import metrics_ingest, point_totals_refresh
from jobs.models import Job, MetricPoint

pytestmark = pytest.mark.django_db

T0 = 1_800_000_000


def lines(steps: range, *, step_time: float = 0.5, blocking_every: int = 10) -> bytes:
    out = [
        json.dumps(
            {
                "step": step,
                "time": T0 + step,
                "elapsed": float(step),
                "loss": 3.0,
                "samples_per_s": 100.0,
                "step_time": step_time,
                "data_time": 0.01 * step,
                "checkpoint_blocking_time": 1.0 if step % blocking_every == 0 else 0.0,
            }
        )
        for step in steps
    ]
    return ("\n".join(out) + "\n").encode()


def database_sums(job: Job) -> dict[str, Any]:
    points = MetricPoint.objects.filter(job=job)
    sums = points.aggregate(
        count=Count("id"),
        last=Max("step"),
        step_time=Sum("step_time_s"),
        data_time=Sum("data_time_s"),
        blocking=Sum("checkpoint_blocking_s"),
    )
    first = points.order_by("step").first()
    last = points.order_by("-step").first()
    return {
        "points_count": sums["count"],
        "points_last_step": sums["last"],
        # SUM over no values is NULL; the kept sums start at 0.
        "points_step_time_s": pytest.approx(sums["step_time"] or 0.0),
        "points_data_time_s": pytest.approx(sums["data_time"] or 0.0),
        "points_blocking_s": pytest.approx(sums["blocking"] or 0.0),
        "points_first_wall": first.wall_time if first else None,
        "points_first_elapsed_s": first.elapsed_s if first else None,
        "points_last_wall": last.wall_time if last else None,
    }


def kept_sums(job: Job) -> dict[str, Any]:
    job.refresh_from_db()
    assert job.points_totals_valid
    return {key: getattr(job, key) for key in database_sums(job)}


def ingest(job: Job, data: bytes) -> None:
    job.refresh_from_db()
    metrics_ingest(job=job, data=data, start_offset=job.metrics_offset)


def test_appended_chunks_add_to_the_sums_without_reading_the_points() -> None:
    job = JobFactory()
    ingest(job, lines(range(1, 51)))
    assert kept_sums(job) == database_sums(job)
    job.refresh_from_db()
    chunk = lines(range(51, 81), step_time=0.75)
    with CaptureQueriesContext(connection) as queries:
        metrics_ingest(job=job, data=chunk, start_offset=job.metrics_offset)
    # Appending reads no points: the sums move in the offset's conditional update.
    assert not [q for q in queries.captured_queries if "SUM(" in q["sql"].upper()]
    assert kept_sums(job) == database_sums(job)
    assert job.points_count == 80 and job.points_last_step == 80
    assert job.points_first_wall == datetime.fromtimestamp(T0 + 1, tz=UTC)
    assert job.points_last_wall == datetime.fromtimestamp(T0 + 80, tz=UTC)


def test_a_chunk_that_rewrites_stored_steps_sums_them_again() -> None:
    job = JobFactory()
    ingest(job, lines(range(1, 51)))
    # A requeued run logs steps 41..60 again, slower: the last line for a step wins.
    ingest(job, lines(range(41, 61), step_time=2.0))
    assert kept_sums(job) == database_sums(job)
    job.refresh_from_db()
    assert job.points_count == 60
    assert job.points_step_time_s == pytest.approx(40 * 0.5 + 20 * 2.0)


def test_points_stored_another_way_are_summed_in_the_database() -> None:
    job = JobFactory(
        state=Job.State.COMPLETED,
        started_at=datetime.fromtimestamp(T0 - 10, tz=UTC),
        ended_at=datetime.fromtimestamp(T0 + 100, tz=UTC),
    )
    # A bulk load (no ingest): the job's sums are not kept, so they are not read.
    MetricPoint.objects.bulk_create(
        MetricPoint(
            job=job, step=step, wall_time=datetime.fromtimestamp(T0 + step, tz=UTC), step_time_s=0.5
        )
        for step in range(1, 21)
    )
    job.refresh_from_db()
    assert not job.points_totals_valid
    summed = job_goodput(job=job)
    assert summed["job"]["buckets"]["productive"] == pytest.approx(20 * 0.5)
    point_totals_refresh(job_ids=[job.id])
    assert kept_sums(job) == database_sums(job)
    job.refresh_from_db()
    assert job_goodput(job=job)["job"]["buckets"] == pytest.approx(summed["job"]["buckets"])


def test_the_ledger_is_the_same_from_kept_sums_and_from_the_points() -> None:
    job = JobFactory(
        state=Job.State.COMPLETED,
        submitted_at=datetime.fromtimestamp(T0 - 100, tz=UTC),
        started_at=datetime.fromtimestamp(T0 - 10, tz=UTC),
        ended_at=datetime.fromtimestamp(T0 + 200, tz=UTC),
    )
    ingest(job, lines(range(1, 101)))
    ingest(job, lines(range(101, 151), step_time=0.9))
    job.refresh_from_db()
    assert job.points_totals_valid
    now = datetime.fromtimestamp(T0 + 300, tz=UTC)
    with CaptureQueriesContext(connection) as kept_queries:
        from_kept = job_goodput(job=job, now=now)
    Job.objects.filter(id=job.id).update(points_totals_offset=None)
    job.refresh_from_db()
    with CaptureQueriesContext(connection) as summed_queries:
        from_points = job_goodput(job=job, now=now)
    assert from_kept["buckets"] == pytest.approx(from_points["buckets"])
    assert from_kept["wall_s"] == pytest.approx(from_points["wall_s"])
    for key in ("current_interval_s", "optimal_interval_s", "expected_ratio_optimal"):
        assert from_kept["advice"][key] == pytest.approx(from_points["advice"][key])
    assert from_kept["advice"]["inputs"] == from_points["advice"]["inputs"]
    # Reading the kept sums skips the one query that sums the job's points.
    summing = [q for q in summed_queries.captured_queries if 'SUM("jobs_metricpoint"' in q["sql"]]
    assert summing
    assert not [q for q in kept_queries.captured_queries if 'SUM("jobs_metricpoint"' in q["sql"]]
