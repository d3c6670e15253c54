"""Metric retention (``jobs.metric_retention``): which steps stay raw, what a roll-up holds,
re-running, small jobs, and the readers (chart, metrics API, goodput, drills, recovery)
before and after a roll-up."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from drills.reference import drill_reference, losses_logged
from factories import CheckpointFactory, JobFactory
from jobs import metric_retention
from jobs.goodput import ledger
from jobs.goodput.selectors import job_goodput, step_totals_by_job
from jobs.ingest import metrics_ingest
from jobs.metric_retention import metrics_rollup_due, metrics_rollup_job
from jobs.models import Job, MetricPoint, MetricRollup
from jobs.selectors import METRIC_SERIES, job_metrics
from recovery.resume import divergence_bound

pytestmark = pytest.mark.django_db

KEEP, WIDTH, REPLAY = 1000, 16, 40
STEPS = 5000
INF = float("inf")


@pytest.fixture(autouse=True)
def retention_settings(settings: Any) -> None:
    settings.METRICS_FULL_RESOLUTION_STEPS = KEEP
    settings.METRICS_ROLLUP_BUCKET = WIDTH
    settings.DRILL_MAX_REPLAY_STEPS = REPLAY
    cache.clear()


def lines(steps: range, *, bad: dict[int, float] | None = None, shift: float = 0.0) -> bytes:
    bad = bad or {}
    out = []
    for step in steps:
        row = {
            "step": step,
            "time": 1_800_000_000 + step * 0.5,
            "elapsed": step * 0.5,
            "loss": bad.get(step, 3.0 / (1 + step * 1e-3) + (step % 7) * 1e-3 + shift),
            "samples_per_s": 100.0 + step % 13,
            "tokens_per_s": 6400.0 + step % 5,
            "step_time": 0.5 + (step % 3) * 0.01,
            "data_time": 0.01 * (step % 4),
            "checkpoint_blocking_time": 1.5 if step % 1000 == 0 and step else 0.0,
        }
        out.append(json.dumps(row))
    return ("\n".join(out) + "\n").encode()


def ingest(job: Job, data: bytes) -> None:
    stored, _ = metrics_ingest(job=job, data=data, start_offset=job.metrics_offset)
    assert stored
    job.refresh_from_db()


@pytest.fixture
def long_job() -> dict[str, Any]:
    """5,000 steps; checkpoints at 1000 (on the cluster), 2000 (deleted) and 3000 (deleted,
    but a job resumed from it); the first non-finite loss at 500, another at 1500."""
    started = timezone.now() - timedelta(hours=2)
    job = JobFactory(state=Job.State.RUNNING, started_at=started, submitted_at=started)
    # SQLite stores NaN as NULL: there, an infinite loss is the non-finite one.
    nan = math.nan if connection.vendor == "postgresql" else INF
    ingest(job, lines(range(STEPS), bad={500: INF, 1500: nan}))
    on_cluster = CheckpointFactory(job=job, step=1000)
    CheckpointFactory(job=job, step=2000, deleted_at=timezone.now())
    resumed = CheckpointFactory(job=job, step=3000, deleted_at=timezone.now())
    child = JobFactory(
        owner=job.owner, cluster=job.cluster, parent=job, resume_from=resumed,
        started_at=started + timedelta(hours=1), submitted_at=started + timedelta(hours=1),
    )  # fmt: skip
    ingest(child, lines(range(3001, 3200)))
    return {"job": job, "child": child, "on_cluster": on_cluster}


def expected_raw(steps: range) -> set[int]:
    """The steps that stay raw, worked out from the rules by hand."""
    kept_from = STEPS - KEEP  # the 1,000th newest logged step
    ranges = [(244, 500), (1000, 1000 + REPLAY), (3000, 3000 + REPLAY)]
    raw = set()
    for step in steps:
        bucket = step // WIDTH
        in_kept = any(low // WIDTH <= bucket <= high // WIDTH for low, high in ranges)
        if step >= (kept_from // WIDTH) * WIDTH or in_kept or step in (1000, 2000, 3000):
            raw.add(step)
    return raw


def test_keeps_exact_steps_raw_and_rolls_up_the_rest(long_job: dict[str, Any]) -> None:
    job = long_job["job"]
    before = {row["step"]: row for row in MetricPoint.objects.filter(job=job).values()}
    result = metrics_rollup_due()
    assert result.jobs == 1
    raw = set(MetricPoint.objects.filter(job=job).values_list("step", flat=True))
    assert raw == expected_raw(range(STEPS))
    assert result.points == STEPS - len(raw)
    rollups = list(MetricRollup.objects.filter(job=job).order_by("first_step").values())
    assert result.buckets == len(rollups)
    # Each roll-up equals an independent computation over the raw points it replaced.
    for rollup in rollups:
        bucket = rollup["first_step"] // WIDTH
        rows = [row for step, row in before.items() if step // WIDTH == bucket and step not in raw]
        assert rollup["count"] == len(rows)
        assert rollup["last_step"] == max(row["step"] for row in rows)
        finite = [row["loss"] for row in rows if math.isfinite(row["loss"])]
        assert rollup["loss_nonfinite"] == len(rows) - len(finite)
        assert rollup["loss_min"] == min(finite) and rollup["loss_max"] == max(finite)
        assert rollup["loss_mean"] == pytest.approx(sum(finite) / len(finite))
        assert rollup["step_time_sum"] == pytest.approx(sum(row["step_time_s"] for row in rows))
        assert rollup["data_time_sum"] == pytest.approx(sum(row["data_time_s"] for row in rows))
        assert rollup["samples_per_s_mean"] == pytest.approx(
            sum(row["samples_per_s"] for row in rows) / len(rows)
        )
        assert rollup["last_wall_time"] == max(row["wall_time"] for row in rows)
    # The non-finite loss at 1500 stays visible in its bucket.
    (nan_bucket,) = [r for r in rollups if r["first_step"] <= 1500 <= r["last_step"]]
    assert nan_bucket["loss_nonfinite"] == 1
    job.refresh_from_db()
    assert job.metrics_rolled_up_to == (STEPS - KEEP) // WIDTH * WIDTH - 1


def test_re_running_changes_nothing_and_small_jobs_are_untouched(
    long_job: dict[str, Any],
) -> None:
    small = JobFactory(state=Job.State.RUNNING)
    ingest(small, lines(range(KEEP)))
    metrics_rollup_due()
    state = sorted(MetricRollup.objects.values_list("job_id", "first_step", "count", "loss_sum"))
    raw = MetricPoint.objects.count()
    again = metrics_rollup_due()
    assert (again.points, again.buckets) == (0, 0)
    assert (
        sorted(MetricRollup.objects.values_list("job_id", "first_step", "count", "loss_sum"))
        == state
    )
    assert MetricPoint.objects.count() == raw
    assert MetricPoint.objects.filter(job=small).count() == KEEP
    assert not MetricRollup.objects.filter(job=small).exists()
    small.refresh_from_db()
    assert small.metrics_rolled_up_to is None


def test_a_racing_run_that_moved_the_watermark_first_leaves_everything(
    long_job: dict[str, Any], monkeypatch: Any
) -> None:
    job = long_job["job"]
    real = metric_retention._full_resolution_from

    def other_worker_first(job_id: Any, keep: int) -> int | None:
        Job.objects.filter(id=job_id).update(metrics_rolled_up_to=7)
        return real(job_id, keep)

    monkeypatch.setattr(metric_retention, "_full_resolution_from", other_worker_first)
    result = metrics_rollup_job(job_id=job.id)
    assert result.points == 0
    assert MetricPoint.objects.filter(job=job).count() == STEPS
    assert not MetricRollup.objects.exists()


def test_a_checkpoint_deleted_later_gets_its_window_rolled_up(long_job: dict[str, Any]) -> None:
    job, checkpoint = long_job["job"], long_job["on_cluster"]
    metrics_rollup_due()
    assert MetricPoint.objects.filter(job=job, step=1001).exists()
    checkpoint.deleted_at = timezone.now()
    checkpoint.save(update_fields=["deleted_at"])
    metrics_rollup_due()
    assert not MetricPoint.objects.filter(job=job, step=1001).exists()
    # The step that saved it stays raw (the median save cost reads it).
    assert MetricPoint.objects.filter(job=job, step=1000).exists()
    assert MetricRollup.objects.filter(job=job, first_step=1001 // WIDTH * WIDTH).count() == 1


def test_drills_and_recovery_still_have_their_steps(long_job: dict[str, Any]) -> None:
    job, checkpoint = long_job["job"], long_job["on_cluster"]
    reference = drill_reference(checkpoint, REPLAY)
    logged = losses_logged(checkpoint, REPLAY)
    bound = divergence_bound(job, job.nonfinite_loss_step)
    newest = list(MetricPoint.objects.filter(job=job).order_by("-step").values()[:80])
    metrics_rollup_due()
    assert MetricRollup.objects.exists()
    assert drill_reference(checkpoint, REPLAY) == reference
    assert losses_logged(checkpoint, REPLAY) == logged == REPLAY
    assert divergence_bound(job, job.nonfinite_loss_step) == bound == 499
    assert list(MetricPoint.objects.filter(job=job).order_by("-step").values()[:80]) == newest


def test_goodput_is_unchanged_by_a_roll_up(long_job: dict[str, Any]) -> None:
    job, child = long_job["job"], long_job["child"]
    now = timezone.now()
    before = job_goodput(job=job, now=now)
    # Summed in the database (not from the kept sums): the lineage's redone steps.
    metrics_rollup_due()
    cache.clear()
    after = job_goodput(job=job, now=now)
    assert after["buckets"] == pytest.approx(before["buckets"])
    assert before["buckets"]["lost_progress"] > 0
    assert after["job"]["buckets"] == pytest.approx(before["job"]["buckets"])
    assert job_goodput(job=child, now=now)["buckets"] == pytest.approx(before["buckets"])
    # Directly: the step sums of the job split at the child's resumed step.
    ranges = {str(job.id): ledger.StepRanges(start=0, cutoff=3000)}
    split = step_totals_by_job(ranges, rolled_up=[str(job.id)])[str(job.id)]
    expected = {False: 0.0, True: 0.0}
    for step in range(STEPS):
        expected[step > 3000] += 0.5 + (step % 3) * 0.01
    assert split[False].step_time_s == pytest.approx(expected[False])
    assert split[True].step_time_s == pytest.approx(expected[True])
    assert split[False].points + split[True].points == STEPS


def test_readers_switch_to_roll_ups_and_give_the_same_figures(long_job: dict[str, Any]) -> None:
    job = long_job["job"]
    whole = job_metrics(job=job, max_points=100)
    ranged = job_metrics(job=job, step_min=0, step_max=STEPS, max_points=100)
    metrics_rollup_due()
    cache.clear()
    job.refresh_from_db()
    with CaptureQueriesContext(connection) as queries:
        whole_after = job_metrics(job=job, max_points=100)
    assert any("metricrollup" in query["sql"] for query in queries.captured_queries)
    assert whole_after["count"] == whole["count"] == STEPS
    assert whole_after["step"] == whole["step"]
    for name in METRIC_SERIES:
        for a, b in zip(whole_after["series"][name], whole["series"][name], strict=True):
            assert (a == pytest.approx(b)) or (not math.isfinite(b) and not math.isfinite(a))
    # A requested range: the raw points' count, at most max_points points, from roll-ups.
    cache.clear()
    with CaptureQueriesContext(connection) as queries:
        ranged_after = job_metrics(job=job, step_min=0, step_max=STEPS, max_points=100)
    assert any("metricrollup" in query["sql"] for query in queries.captured_queries)
    assert ranged_after["count"] == ranged["count"] == STEPS
    assert len(ranged_after["step"]) <= 100 and ranged_after["downsampled"]
    finite = [v for v in ranged_after["series"]["step_time_s"] if v is not None]
    assert min(finite) >= 0.5 and max(finite) <= 0.52
    # Few enough points: each roll-up is one point at its last step, with its means.
    few = job_metrics(job=job, step_min=2048, step_max=2111, max_points=2000)
    assert few["step"] == [2063, 2079, 2095, 2111]
    means = [
        sum(0.5 + (s % 3) * 0.01 for s in range(b, b + 16)) / 16 for b in range(2048, 2112, 16)
    ]
    assert few["series"]["step_time_s"] == pytest.approx(means)


def test_ingest_replaying_rolled_up_steps_drops_their_roll_ups(long_job: dict[str, Any]) -> None:
    job = long_job["job"]
    metrics_rollup_due()
    job.refresh_from_db()
    # The run resumed in place from its checkpoint at 3000 and logs steps 3001... again.
    ingest(job, lines(range(3001, 3300), shift=1.0))
    raw_steps = set(MetricPoint.objects.filter(job=job).values_list("step", flat=True))
    for first, last in MetricRollup.objects.filter(job=job).values_list("first_step", "last_step"):
        assert last < 3001
        assert not any(first <= step <= last for step in raw_steps if step not in (1000, 2000))
    rolled = sum(MetricRollup.objects.filter(job=job).values_list("count", flat=True))
    assert job.points_count == len(raw_steps) + rolled
    assert job.metrics_rolled_up_to is not None and job.metrics_rolled_up_to < 3001
