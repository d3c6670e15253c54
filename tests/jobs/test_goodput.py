"""Goodput: the ledger of a job and its lineage (``jobs.goodput.ledger``, ``job_goodput``) and
Young/Daly checkpoint-interval advice, as pure functions, through the API and on the page."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from factories import CheckpointFactory, ClusterFactory, JobFactory
from jobs.goodput import ledger as goodput
from jobs.goodput.ledger import (
    BUCKETS,
    FailureHistory,
    JobTimes,
    LineageLink,
    StepPoint,
    StepTotals,
)
from jobs.models import Job, MetricPoint

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def assert_sums_to_wall(ledger: goodput.Ledger) -> None:
    total = sum(ledger.buckets.values())
    assert set(ledger.buckets) == set(BUCKETS)
    assert all(seconds >= 0 for seconds in ledger.buckets.values()), ledger.buckets
    assert total == pytest.approx(ledger.wall_s, rel=0.01)
    assert total == pytest.approx(ledger.wall_s, abs=1e-6)


# Pure functions ---------------------------------------------------------------------


def test_one_job_buckets_sum_to_wall_and_ratio_matches() -> None:
    # 100 steps of 2 s: 0.5 s data wait each, one checkpoint blocking 4 s.
    points = [StepPoint(step, 2.0, 0.5, 4.0 if step == 50 else 0.0) for step in range(1, 101)]
    job = JobTimes(
        job_id="a",
        submitted_at=at(0),
        started_at=at(60),
        loop_started_at=at(90),
        ended_at=at(90 + 200 + 15),
        preserved=goodput.step_totals(points, after=0),
    )
    ledger = goodput.job_ledger(job, now=at(10_000))
    assert ledger.wall_s == 305
    assert ledger.buckets["queued"] == 60
    assert ledger.buckets["startup"] == 30
    assert ledger.buckets["data_wait"] == pytest.approx(50)
    assert ledger.buckets["checkpoint_blocking"] == pytest.approx(4)
    assert ledger.buckets["productive"] == pytest.approx(200 - 50 - 4)
    assert ledger.buckets["other"] == pytest.approx(15)
    assert ledger.buckets["lost_progress"] == 0
    assert_sums_to_wall(ledger)
    assert ledger.ratio == pytest.approx(ledger.buckets["productive"] / ledger.wall_s)


def test_lost_progress_is_the_time_of_steps_after_the_resumed_checkpoint() -> None:
    """B resumed from A's checkpoint at step 100 while A reached step 150: A's steps
    101-150 were computed twice, and their time is lost progress."""
    a_points = [StepPoint(step, 1.0 + step / 100) for step in range(1, 151)]
    b_points = [StepPoint(step, 1.5) for step in range(101, 201)]
    links = [
        LineageLink(job_id="a", created_at=at(0)),
        LineageLink(job_id="b", created_at=at(500), source_id="a", resume_step=100),
    ]
    ranges = goodput.lineage_step_ranges(links)
    assert ranges["a"] == goodput.StepRanges(start=0, cutoff=100)
    assert ranges["b"] == goodput.StepRanges(start=100, cutoff=None)
    a_lost = goodput.step_totals(a_points, after=100)
    a_time_101_150 = sum(p.step_time_s or 0 for p in a_points if 101 <= p.step <= 150)
    assert a_lost.time_s == pytest.approx(a_time_101_150)

    a_total = sum(p.step_time_s or 0 for p in a_points)
    jobs = [
        JobTimes(
            job_id="a",
            submitted_at=at(0),
            started_at=at(10),
            loop_started_at=at(20),
            ended_at=at(20 + a_total + 5),
            preserved=goodput.step_totals(a_points, after=0, upto=100),
            lost=a_lost,
        ),
        JobTimes(
            job_id="b",
            submitted_at=at(20 + a_total + 5 + 40),
            started_at=at(20 + a_total + 5 + 50),
            loop_started_at=at(20 + a_total + 5 + 62),
            ended_at=at(20 + a_total + 5 + 62 + 150),
            resumed=True,
            preserved=goodput.step_totals(b_points, after=100),
            source_id="a",
        ),
    ]
    lineage, per_job = goodput.lineage_ledgers(jobs, now=at(100_000))
    assert lineage.buckets["lost_progress"] == pytest.approx(a_time_101_150)
    assert lineage.buckets["idle"] == pytest.approx(40)
    assert lineage.buckets["restore"] == pytest.approx(12)
    assert lineage.buckets["queued"] == pytest.approx(10 + 10)
    assert lineage.buckets["productive"] == pytest.approx(a_total - a_time_101_150 + 150)
    # A plain chain: the wall is the calendar time from the root's submission to the end.
    assert lineage.wall_s == pytest.approx(20 + a_total + 5 + 62 + 150)
    assert_sums_to_wall(lineage)
    for ledger in per_job.values():
        assert_sums_to_wall(ledger)
    assert per_job["b"].buckets["idle"] == pytest.approx(40)
    assert lineage.ratio == pytest.approx(lineage.buckets["productive"] / lineage.wall_s)


def test_a_job_off_the_final_timeline_loses_all_its_steps() -> None:
    """B resumed from A@100 and failed; C resumed from A@100 again: B's steps were redone."""
    links = [
        LineageLink(job_id="a", created_at=at(0)),
        LineageLink(job_id="b", created_at=at(100), source_id="a", resume_step=100),
        LineageLink(job_id="c", created_at=at(200), source_id="a", resume_step=100),
    ]
    ranges = goodput.lineage_step_ranges(links)
    assert ranges["a"].cutoff == 100
    assert ranges["b"] == goodput.StepRanges(start=100, cutoff=100)
    assert ranges["c"].cutoff is None


def test_a_span_reaches_the_last_logged_step_past_slurms_whole_second_end() -> None:
    """Slurm's end time is whole seconds; the trainer logged a step 0.9 s later. The span
    ends at that step, so the steps fit the loop's window unscaled, and the idle gap of the
    job resumed from it starts there too."""
    points = [StepPoint(step, 0.5) for step in range(1, 5)]
    a = JobTimes(
        job_id="a",
        submitted_at=at(0),
        started_at=at(1),
        loop_started_at=at(1.2),
        ended_at=at(3),
        last_step_at=at(3.9),
        preserved=goodput.step_totals(points, after=0, upto=2),
        lost=goodput.step_totals(points, after=2),
    )
    b = JobTimes(
        job_id="b",
        submitted_at=at(10),
        started_at=at(11),
        ended_at=at(20),
        resumed=True,
        source_id="a",
    )
    lineage, per_job = goodput.lineage_ledgers([a, b], now=at(100))
    assert per_job["a"].wall_s == pytest.approx(3.9)
    assert per_job["a"].buckets["lost_progress"] == pytest.approx(1.0)
    assert per_job["a"].buckets["productive"] == pytest.approx(1.0)
    assert per_job["b"].buckets["idle"] == pytest.approx(10 - 3.9)
    assert lineage.wall_s == pytest.approx(20)
    assert_sums_to_wall(lineage)


def test_slurms_whole_second_start_before_the_submit_time_does_not_cut_the_window() -> None:
    """sacct says the job started at 12:00:00; Gantry recorded the submit at 12:00:00.9.
    Running time begins at the later one: 0.9 s must not come out of the loop's window."""
    points = [StepPoint(step, 0.5) for step in range(1, 5)]
    job = JobTimes(
        job_id="a",
        submitted_at=at(0.9),
        started_at=at(0),
        loop_started_at=at(2.0),
        ended_at=at(4.0),
        preserved=goodput.step_totals(points, after=0),
    )
    ledger = goodput.job_ledger(job, now=at(100))
    assert ledger.wall_s == pytest.approx(3.1)
    assert ledger.buckets["queued"] == 0
    assert ledger.buckets["startup"] == pytest.approx(1.1)
    # Four steps of 0.5 s in the 2 s window: unscaled.
    assert ledger.buckets["productive"] == pytest.approx(2.0)
    assert_sums_to_wall(ledger)


def test_sparse_logging_scales_step_sums() -> None:
    # log_every = 10: 10 points stand for 100 steps.
    points = [StepPoint(step, 1.0, 0.1) for step in range(10, 101, 10)]
    totals = goodput.step_totals(points, after=0)
    assert totals.points == 10 and totals.steps == 100
    assert totals.time_s == pytest.approx(100) and totals.data_s == pytest.approx(10)


def test_step_time_over_the_window_is_scaled_to_fit() -> None:
    # The node's clock says the steps took longer than the job ran: never negative other.
    job = JobTimes(
        job_id="a",
        submitted_at=at(0),
        started_at=at(0),
        loop_started_at=at(10),
        ended_at=at(50),
        preserved=StepTotals(points=10, steps=10, step_time_s=80.0),
    )
    ledger = goodput.job_ledger(job, now=at(1000))
    assert ledger.buckets["productive"] == pytest.approx(40)
    assert ledger.buckets["other"] == pytest.approx(0, abs=1e-9)
    assert_sums_to_wall(ledger)


def test_a_queued_and_a_running_job() -> None:
    queued = JobTimes(job_id="q", submitted_at=at(0), started_at=None, ended_at=None)
    ledger = goodput.job_ledger(queued, now=at(300))
    assert ledger.buckets["queued"] == 300 and ledger.wall_s == 300
    assert ledger.ratio == 0
    running = JobTimes(job_id="r", submitted_at=at(0), started_at=at(5), ended_at=None)
    ledger = goodput.job_ledger(running, now=at(65))
    assert ledger.buckets["startup"] == 60
    assert_sums_to_wall(ledger)
    never = JobTimes(job_id="d", submitted_at=None, started_at=None, ended_at=None)
    assert goodput.job_ledger(never, now=at(65)).ratio is None


def test_young_daly_values_for_known_inputs() -> None:
    assert goodput.young_daly_interval(checkpoint_cost_s=10, mtti_s=86_400) == pytest.approx(
        math.sqrt(2 * 10 * 86_400)
    )
    assert goodput.young_daly_interval(checkpoint_cost_s=18, mtti_s=3600) == pytest.approx(360)
    # C = 18 s, M = 1 h, R = 36 s: at τ = 360 s, 1 − 0.05 − 0.05 − 0.01.
    assert goodput.expected_goodput(
        interval_s=360, checkpoint_cost_s=18, mtti_s=3600, restore_s=36
    ) == pytest.approx(0.89)
    # Every 60 s instead: 1 − 0.3 − 60/7200 − 0.01.
    assert goodput.expected_goodput(
        interval_s=60, checkpoint_cost_s=18, mtti_s=3600, restore_s=36
    ) == pytest.approx(1 - 0.3 - 60 / 7200 - 0.01)

    advice = goodput.checkpoint_advice(
        checkpoint_cost_s=18,
        history=FailureHistory(),
        gpus=4,
        step_time_s=0.5,
        interval_steps=120,
        restore_s=36,
        restore_source="drills",
    )
    # No history: M is the 24 h prior.
    assert advice.mtti_s == pytest.approx(86_400) and advice.prior_used
    assert advice.current_interval_s == pytest.approx(60)
    assert advice.optimal_interval_s == pytest.approx(math.sqrt(2 * 18 * 86_400))
    assert advice.expected_ratio_optimal > advice.expected_ratio_now  # type: ignore[operator]
    optimal = advice.optimal_interval_s
    assert advice.expected_ratio_optimal == pytest.approx(
        1 - 18 / optimal - optimal / (2 * 86_400) - 36 / 86_400  # type: ignore[operator]
    )


def test_prior_when_history_is_empty_and_history_when_it_is_long() -> None:
    assert goodput.mean_time_to_interruption(FailureHistory(), gpus=8) == (86_400, True)
    # 100 interruptions in 10 000 GPU-hours, for an 8-GPU job:
    # λ = (1 + 100) / (1·24·8 + 10 000) per GPU-hour, M = 1 / (8λ).
    mtti, prior_used = goodput.mean_time_to_interruption(
        FailureHistory(interruptions=100, gpu_hours=10_000), gpus=8
    )
    assert mtti == pytest.approx(3600 * (24 * 8 + 10_000) / (101 * 8))
    assert not prior_used
    # A clean history pushes M above the prior.
    clean, _ = goodput.mean_time_to_interruption(
        FailureHistory(interruptions=0, gpu_hours=1000), gpus=1
    )
    assert clean == pytest.approx(3600 * 1024)


def test_checkpoint_interval_from_steps() -> None:
    # Every 100 steps; the final step (250) is saved too.
    assert goodput.checkpoint_interval_steps([100, 200, 250]) == 100
    assert goodput.checkpoint_interval_steps([150, 250, 350], start_step=50) == 100
    assert goodput.checkpoint_interval_steps([], configured=40) == 40
    assert goodput.checkpoint_interval_steps([], configured=0) is None


# Through the database, the API and the page ----------------------------------------


def add_points(job: Job, steps: range, *, step_time: float = 2.0, blocking_at: int = 100) -> None:
    """Points as the trainer logs them: the loop started at ``started_at + 5 s``."""
    assert job.started_at is not None
    loop_start = job.started_at + timedelta(seconds=5)
    first = steps.start
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(
                job=job,
                step=step,
                elapsed_s=(step - first + 1) * step_time,
                wall_time=loop_start + timedelta(seconds=(step - first + 1) * step_time),
                step_time_s=step_time,
                data_time_s=0.25,
                checkpoint_blocking_s=1.5 if step % blocking_at == 0 else 0.0,
                loss=2.0,
            )
            for step in steps
        ]
    )


@pytest.fixture
def lineage(researcher: Any) -> dict[str, Any]:
    """A reached step 150 (checkpoints at 100 and 150), ended in a node failure (Slurm's
    own word: an interruption for the advice); B resumed from A@100."""
    cluster = ClusterFactory()
    a_end = at(60 + 5 + 300 + 10)
    a = JobFactory(
        owner=researcher,
        cluster=cluster,
        state=Job.State.NODE_FAIL,
        nodes=2,
        gpus_per_node=4,
        submitted_at=at(0),
        started_at=at(60),
        ended_at=a_end,
        config={"preset": "tiny", "checkpoint_every": 50},
    )
    add_points(a, range(1, 151))
    a_100 = CheckpointFactory(job=a, step=100)
    CheckpointFactory(job=a, step=50)
    CheckpointFactory(job=a, step=150)
    b_submitted = a_end + timedelta(seconds=30)
    b = JobFactory(
        owner=researcher,
        cluster=cluster,
        state=Job.State.RUNNING,
        nodes=2,
        gpus_per_node=4,
        parent=a,
        resume_from=a_100,
        submitted_at=b_submitted,
        started_at=b_submitted + timedelta(seconds=20),
        ended_at=None,
    )
    add_points(b, range(101, 161))
    return {"a": a, "b": b, "now": b_submitted + timedelta(seconds=20 + 5 + 120 + 1)}


@pytest.mark.django_db
def test_api_detail_has_the_lineage_ledger(
    researcher_api: Any, lineage: dict[str, Any], monkeypatch: Any
) -> None:
    a, b = lineage["a"], lineage["b"]
    monkeypatch.setattr("jobs.goodput.selectors.timezone.now", lambda: lineage["now"])
    body = researcher_api.get(f"/api/v1/jobs/{b.id}/").json()
    ledger = body["goodput"]
    assert ledger["lineage"] == [str(a.id), str(b.id)]
    buckets = ledger["buckets"]
    # A's steps 101-150, 2 s each, were redone by B.
    assert buckets["lost_progress"] == pytest.approx(50 * 2.0)
    assert buckets["idle"] == pytest.approx(30)
    assert buckets["queued"] == pytest.approx(60 + 20)
    assert buckets["startup"] == pytest.approx(5)
    assert buckets["restore"] == pytest.approx(5)
    # Preserved: A's 100 steps and B's 60, each 0.25 s of data; blocking at step 100 only.
    assert buckets["data_wait"] == pytest.approx(160 * 0.25)
    assert buckets["checkpoint_blocking"] == pytest.approx(1.5)
    assert buckets["productive"] == pytest.approx(160 * 2.0 - 160 * 0.25 - 1.5)
    assert ledger["wall_s"] == pytest.approx((lineage["now"] - T0).total_seconds())
    assert sum(buckets.values()) == pytest.approx(ledger["wall_s"], abs=1e-6)
    assert ledger["ratio"] == pytest.approx(buckets["productive"] / ledger["wall_s"])
    # This job's share: B alone, with the idle gap before it.
    assert ledger["job"]["buckets"]["idle"] == pytest.approx(30)
    assert ledger["job"]["buckets"]["lost_progress"] == 0

    advice = ledger["advice"]
    # A node failure on an otherwise empty cluster: 1 interruption, the prior still weighs.
    assert advice["inputs"]["interruptions"] == 1
    assert advice["inputs"]["prior_used"] is True
    a_gpu_hours = 8 * (a.ended_at - a.started_at).total_seconds() / 3600
    assert advice["inputs"]["gpu_hours"] == pytest.approx(a_gpu_hours)
    mtti = 3600 / ((1 + 1) / (24 * 8 + a_gpu_hours) * 8)
    assert advice["inputs"]["mtti_s"] == pytest.approx(mtti)
    # B has no checkpoint blocking of its own yet: the lineage's (A's step 100).
    assert advice["inputs"]["checkpoint_cost_s"] == pytest.approx(1.5)
    assert advice["optimal_interval_s"] == pytest.approx(math.sqrt(2 * 1.5 * mtti))
    # No drills: R is B's resume startup.
    assert advice["inputs"]["restore_s"] == pytest.approx(5)
    assert advice["inputs"]["restore_source"] == "resume"
    # B saved nothing yet: its configured interval (the trainer default, 100 steps).
    assert advice["current_interval_s"] == pytest.approx(100 * 2.0)

    a_body = researcher_api.get(f"/api/v1/jobs/{a.id}/").json()["goodput"]
    assert a_body["lineage"] == [str(a.id), str(b.id)]
    assert a_body["buckets"] == pytest.approx(buckets)
    assert a_body["job"]["buckets"]["lost_progress"] == pytest.approx(100)
    # A checkpointed every 50 steps of 2 s.
    assert a_body["advice"]["current_interval_s"] == pytest.approx(100)


@pytest.mark.django_db
def test_restore_time_from_drills(researcher_api: Any, lineage: dict[str, Any]) -> None:
    from drills.models import RestoreDrill

    checkpoint = lineage["a"].checkpoints.get(step=100)
    RestoreDrill.objects.create(checkpoint=checkpoint, load_s=7.0, cluster=lineage["a"].cluster)
    ledger = researcher_api.get(f"/api/v1/jobs/{lineage['b'].id}/").json()["goodput"]
    assert ledger["advice"]["inputs"]["restore_s"] == pytest.approx(7.0)
    assert ledger["advice"]["inputs"]["restore_source"] == "drills"


@pytest.mark.django_db
def test_query_count_does_not_grow_with_metric_points(researcher: Any, researcher_api: Any) -> None:
    def detail_queries(points: int) -> int:
        job = JobFactory(
            owner=researcher,
            state=Job.State.COMPLETED,
            submitted_at=at(0),
            started_at=at(10),
            ended_at=at(10 + 5 + 2 * points + 1),
        )
        add_points(job, range(1, points + 1), blocking_at=10)
        CheckpointFactory(job=job, step=10)
        with CaptureQueriesContext(connection) as queries:
            body = researcher_api.get(f"/api/v1/jobs/{job.id}/").json()
        assert body["goodput"]["buckets"]["productive"] > 0
        return len(queries)

    # The first request also reads what the session caches (the user's roles).
    detail_queries(5)
    assert detail_queries(20) == detail_queries(2000)


@pytest.mark.django_db
def test_job_page_shows_the_bar_and_the_advice(researcher: Any, lineage: dict[str, Any]) -> None:
    page = Client()
    page.force_login(researcher)
    html = page.get(f"/jobs/{lineage['a'].id}/").content.decode()
    assert 'data-testid="goodput-bar"' in html
    assert 'data-bucket="lost_progress"' in html
    assert "You checkpoint every 1.7 min; ≈" in html
    assert "would maximise goodput (expected" in html
    assert "Mean time to interruption M" in html


@pytest.mark.django_db
def test_job_page_empty_state_before_the_job_starts(researcher: Any) -> None:
    job = JobFactory(owner=researcher, state=Job.State.PENDING, submitted_at=at(0))
    page = Client()
    page.force_login(researcher)
    html = page.get(f"/jobs/{job.id}/").content.decode()
    assert 'data-testid="goodput-empty"' in html
    assert 'data-testid="goodput-bar"' not in html


@pytest.mark.django_db
def test_lineage_is_found_from_any_of_its_jobs(
    researcher_api: Any, lineage: dict[str, Any]
) -> None:
    a, b = lineage["a"], lineage["b"]
    b_checkpoint = CheckpointFactory(job=b, step=150)
    c = JobFactory(owner=a.owner, cluster=a.cluster, parent=b, resume_from=b_checkpoint)
    unrelated = JobFactory(owner=a.owner, cluster=a.cluster)
    expected = [str(a.id), str(b.id), str(c.id)]
    for job in (a, b, c):
        body = researcher_api.get(f"/api/v1/jobs/{job.id}/").json()["goodput"]
        assert body["lineage"] == expected
    alone = researcher_api.get(f"/api/v1/jobs/{unrelated.id}/").json()["goodput"]
    assert alone["lineage"] == [str(unrelated.id)]
    assert alone["started"] is False and alone["wall_s"] == 0 and alone["ratio"] is None


# Many jobs at once: per cluster and week (the overview), per cluster (/metrics) ------


def test_lineages_group_jobs_through_their_sources() -> None:
    links = [
        LineageLink(job_id="a", created_at=at(0)),
        LineageLink(job_id="b", created_at=at(10), source_id="a", resume_step=5),
        LineageLink(job_id="c", created_at=at(20), source_id="b", resume_step=9),
        LineageLink(job_id="x", created_at=at(5)),
        # Resumed from a job outside the list: a lineage of its own here.
        LineageLink(job_id="y", created_at=at(30), source_id="gone", resume_step=3),
    ]
    groups = sorted(sorted(link.job_id for link in group) for group in goodput.lineages(links))
    assert groups == [["a", "b", "c"], ["x"], ["y"]]


def test_iso_week_and_sum_of_ledgers() -> None:
    assert goodput.iso_week(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-W01"
    assert goodput.iso_week(datetime(2024, 12, 30, tzinfo=UTC)) == "2025-W01"
    assert goodput.iso_week(datetime(2026, 3, 1, 23, 59, tzinfo=UTC)) == "2026-W09"
    one = goodput.Ledger(wall_s=100, buckets={**dict.fromkeys(BUCKETS, 0.0), "productive": 80})
    two = goodput.Ledger(wall_s=300, buckets={**dict.fromkeys(BUCKETS, 0.0), "productive": 60})
    total = goodput.sum_ledgers([one, two])
    assert total.wall_s == 400 and total.ratio == pytest.approx(140 / 400)
    assert goodput.sum_ledgers([]).ratio is None


def test_idle_before_a_resumed_job() -> None:
    job = JobTimes(job_id="b", submitted_at=at(100), started_at=at(110), ended_at=None)
    assert goodput.idle_before(job, source_ended_at=at(40), now=at(500)) == 60
    assert goodput.idle_before(job, source_ended_at=None, now=at(500)) == 0
    # Submitted before the source ended (resumed from a checkpoint while it ran): no gap.
    assert goodput.idle_before(job, source_ended_at=at(120), now=at(500)) == 0


@pytest.mark.django_db
def test_cluster_weeks_match_the_jobs_own_ledgers(
    researcher: Any, lineage: dict[str, Any], monkeypatch: Any
) -> None:
    from jobs.goodput.fleet import goodput_by_cluster_week
    from jobs.goodput.selectors import job_goodput

    now = lineage["now"]
    monkeypatch.setattr("jobs.goodput.selectors.timezone.now", lambda: now)
    other = ClusterFactory(name="zeta")
    # A week earlier on another cluster: a plain job, all productive but its queue.
    early = JobFactory(
        owner=researcher,
        cluster=other,
        state=Job.State.COMPLETED,
        submitted_at=at(-7 * 86400),
        started_at=at(-7 * 86400 + 100),
        ended_at=at(-7 * 86400 + 100 + 5 + 40 + 1),
    )
    add_points(early, range(1, 21), blocking_at=1000)
    table = goodput_by_cluster_week(jobs=Job.objects.all(), weeks=3, now=now)
    # T0 is Sunday 2026-03-01, the last day of 2026-W09.
    assert table["weeks"] == ["2026-W07", "2026-W08", "2026-W09"]
    rows = {row["cluster"]: {cell["week"]: cell for cell in row["cells"]} for row in table["rows"]}
    lineage_cluster = lineage["a"].cluster.name
    # A ended on 2026-03-01 (W09) and B runs now (W09 too): the lineage's ledger.
    week = rows[lineage_cluster]["2026-W09"]
    ledger = job_goodput(job=lineage["b"], now=now)
    assert week["jobs"] == 2
    assert week["wall_s"] == pytest.approx(ledger["wall_s"])
    assert week["productive_s"] == pytest.approx(ledger["buckets"]["productive"])
    assert week["lost_s"] == pytest.approx(50 * 2.0)
    assert week["ratio"] == pytest.approx(ledger["ratio"])
    assert rows[lineage_cluster]["2026-W08"]["ratio"] is None
    assert rows[lineage_cluster]["2026-W08"]["jobs"] == 0
    early_week = rows["zeta"]["2026-W08"]
    assert early_week["wall_s"] == pytest.approx(146)
    assert early_week["productive_s"] == pytest.approx(20 * 2.0 - 20 * 0.25)


@pytest.mark.django_db
def test_cluster_weeks_in_a_fixed_number_of_queries(researcher: Any) -> None:
    from jobs.goodput.fleet import goodput_by_cluster_week

    now = at(3600)
    clusters = [ClusterFactory(), ClusterFactory()]

    def add_jobs(count: int) -> None:
        for number in range(count):
            parent = JobFactory(
                owner=researcher,
                cluster=clusters[number % 2],
                state=Job.State.FAILED,
                submitted_at=at(0),
                started_at=at(10),
                ended_at=at(10 + 5 + 2 * 30 + 1),
            )
            add_points(parent, range(1, 31))
            checkpoint = CheckpointFactory(job=parent, step=20)
            child = JobFactory(
                owner=researcher,
                cluster=parent.cluster,
                state=Job.State.RUNNING,
                parent=parent,
                resume_from=checkpoint,
                submitted_at=at(100),
                started_at=at(110),
            )
            add_points(child, range(21, 41))

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            table = goodput_by_cluster_week(jobs=Job.objects.all(), weeks=2, now=now)
        assert all(cell["lost_s"] > 0 for row in table["rows"] for cell in row["cells"][-1:])
        return len(captured)

    add_jobs(2)
    small = queries()
    add_jobs(10)
    assert queries() == small == 2


@pytest.mark.django_db
def test_overview_shows_goodput_per_cluster_and_week(
    researcher: Any, other_researcher: Any, lineage: dict[str, Any]
) -> None:
    JobFactory(
        owner=other_researcher,
        cluster=ClusterFactory(name="robs-cluster"),
        state=Job.State.COMPLETED,
        submitted_at=timezone.now() - timedelta(hours=2),
        started_at=timezone.now() - timedelta(hours=1),
        ended_at=timezone.now(),
    )
    # Move the lineage into this week so that the default window shows it.
    shift = timezone.now() - lineage["now"]
    for job in (lineage["a"], lineage["b"]):
        Job.objects.filter(pk=job.pk).update(
            submitted_at=F("submitted_at") + shift,
            started_at=F("started_at") + shift,
            ended_at=F("ended_at") + shift,
        )
        MetricPoint.objects.filter(job=job).update(wall_time=F("wall_time") + shift)
    page = Client()
    page.force_login(researcher)
    html = page.get("/").content.decode()
    assert 'data-testid="goodput-weeks"' in html
    assert f'<tr data-cluster="{lineage["a"].cluster.name}">' in html
    this_week = goodput.iso_week(timezone.localtime(timezone.now()))
    assert f'data-week="{this_week}" data-ratio="0.' in html
    # Another researcher's cluster of jobs is not in this researcher's table.
    assert "robs-cluster" not in html.split('data-testid="goodput-weeks"')[1]


def test_an_incident_puts_its_quiet_and_the_gap_to_the_resume_in_recovery() -> None:
    # Job a: 100 steps of 1 s from t=10, then hung from its last step (t=110) until the
    # watcher cancelled it at t=400; its resume b was submitted at t=460.
    points = [StepPoint(step, 1.0, 0.0, 0.0) for step in range(1, 101)]
    a = JobTimes(
        job_id="a",
        submitted_at=at(0),
        started_at=at(5),
        loop_started_at=at(10),
        ended_at=at(400),
        preserved=goodput.step_totals(points, after=0),
        last_step_at=at(110),
        incident=True,
    )
    b = JobTimes(
        job_id="b",
        submitted_at=at(460),
        started_at=at(470),
        loop_started_at=at(480),
        ended_at=at(500),
        resumed=True,
        source_id="a",
        last_step_at=at(500),
    )
    lineage, per_job = goodput.lineage_ledgers([a, b], now=at(10_000))
    assert per_job["a"].buckets["recovery"] == pytest.approx(290)  # 110 → 400
    assert per_job["b"].buckets["recovery"] == pytest.approx(60)  # 400 → 460
    assert per_job["b"].buckets["idle"] == 0
    assert lineage.buckets["recovery"] == pytest.approx(350)
    for ledger in (lineage, *per_job.values()):
        assert_sums_to_wall(ledger)
    # Without the incident the same gap is idle, and the quiet stays unexplained.
    plain, _ = goodput.lineage_ledgers(
        [a.__class__(**{**a.__dict__, "incident": False}), b], now=at(10_000)
    )
    assert plain.buckets["recovery"] == 0 and plain.buckets["idle"] == pytest.approx(60)
