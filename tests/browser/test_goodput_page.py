"""The job page's goodput bar, its advice and the work at risk, in a real browser, with a
screenshot; and the overview's goodput table and breaches."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from factories import CheckpointFactory, ClusterFactory, JobFactory
from jobs.models import Job, MetricPoint

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(page: Any, live_server: Any, username: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_selector("nav.mainnav")


def points(job: Job, steps: range, *, step_time: float, blocking_every: int) -> None:
    assert job.started_at is not None
    loop_start = job.started_at + timedelta(seconds=20)
    MetricPoint.objects.bulk_create(
        MetricPoint(
            job=job,
            step=step,
            elapsed_s=(step - steps.start + 1) * step_time,
            wall_time=loop_start + timedelta(seconds=(step - steps.start + 1) * step_time),
            step_time_s=step_time,
            data_time_s=0.3,
            checkpoint_blocking_s=4.0 if step % blocking_every == 0 else 0.0,
            loss=3.0 - step / 1000,
        )
        for step in steps
    )


@pytest.fixture
def resumed_lineage(researcher: Any) -> dict[str, Any]:
    """A job failed after 300 steps (checkpoints every 100); its resume from step 200 runs
    now, on a cluster that allows a proven checkpoint of at most 30 minutes."""
    now = timezone.now()
    cluster = ClusterFactory(name="browser-cluster", proven_checkpoint_max_age_minutes=30)
    start = now - timedelta(hours=2)
    first = JobFactory(
        owner=researcher,
        cluster=cluster,
        name="llm-pretrain",
        state=Job.State.FAILED,
        nodes=2,
        gpus_per_node=4,
        submitted_at=start,
        started_at=start + timedelta(minutes=3),
        ended_at=start + timedelta(minutes=3, seconds=20 + 300 * 6 + 5),
        config={"preset": "tiny", "checkpoint_every": 100},
    )
    points(first, range(1, 301), step_time=6.0, blocking_every=100)
    for step in (100, 200, 300):
        CheckpointFactory(
            job=first,
            step=step,
            saved_at=first.started_at + timedelta(seconds=20 + step * 6),
            last_proven_at=now if step == 200 else None,
        )
    resumed_at = first.ended_at + timedelta(minutes=4)
    second = JobFactory(
        owner=researcher,
        cluster=cluster,
        name="llm-pretrain (resumed @200)",
        state=Job.State.RUNNING,
        nodes=2,
        gpus_per_node=4,
        parent=first,
        resume_from=first.checkpoints.get(step=200),
        submitted_at=resumed_at,
        started_at=resumed_at + timedelta(seconds=40),
        config={"preset": "tiny", "checkpoint_every": 100},
    )
    points(second, range(201, 451), step_time=6.0, blocking_every=100)
    for step in (300, 400):
        CheckpointFactory(
            job=second,
            step=step,
            saved_at=second.started_at + timedelta(seconds=20 + (step - 200) * 6),
        )
    return {"first": first, "second": second}


def test_goodput_bar_advice_and_work_at_risk(
    page: Any, live_server: Any, researcher: Any, resumed_lineage: dict[str, Any], artifacts: Path
) -> None:
    log_in(page, live_server, researcher.username)
    job = resumed_lineage["second"]
    page.goto(f"{live_server.url}/jobs/{job.id}/")
    section = page.locator("[data-testid=goodput]")
    section.scroll_into_view_if_needed()
    bar = page.locator("[data-testid=goodput-bar]")
    assert bar.is_visible()
    # One segment per non-empty bucket, their widths filling the bar.
    widths = bar.evaluate(
        "bar => Array.from(bar.children).map(segment => segment.getBoundingClientRect().width)"
    )
    assert len(widths) >= 5
    assert sum(widths) == pytest.approx(bar.evaluate("bar => bar.clientWidth"), rel=0.02)
    lost = page.locator("tr[data-bucket=lost_progress]").inner_text()
    assert "lost progress" in lost and "10.0 min" in lost  # A's steps 201-300, 6 s each
    advice = page.locator("[data-testid=goodput-advice]").inner_text()
    assert advice.startswith("You checkpoint every 10.0 min; ≈")
    assert "would maximise goodput (expected" in advice
    risk = page.locator("[data-testid=work-at-risk]")
    assert risk.get_attribute("data-breached") == "1"
    assert "since its newest proven checkpoint (none proven yet" in risk.inner_text()
    assert "resumed from step 200, a proven checkpoint" in risk.inner_text().lower()
    section.screenshot(path=str(artifacts / "job-goodput.png"))
    page.screenshot(path=str(artifacts / "job-goodput-page.png"), full_page=True)

    page.goto(f"{live_server.url}/")
    breaches = page.locator("[data-testid=proven-age-breaches]")
    assert "llm-pretrain (resumed @200)" in breaches.inner_text()
    table = page.locator("[data-testid=goodput-weeks]")
    assert "browser-cluster" in table.inner_text()
    assert "%" in table.locator("tr[data-cluster=browser-cluster]").inner_text()
    table.screenshot(path=str(artifacts / "overview-goodput-weeks.png"))
