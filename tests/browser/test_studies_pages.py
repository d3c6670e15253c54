"""Start strong and weak scaling studies from the form and watch them finish in a browser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.models import Job
from studies.models import StudyPoint

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def log_in(page: Any, live_server: Any, username: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_selector("nav.mainnav")


def start(page: Any, live_server: Any, kind: str, batch: str) -> str:
    page.goto(f"{live_server.url}/studies/new/")
    page.fill("#id_name", f"browser-{kind}")
    page.select_option("#id_kind", kind)
    page.fill("#id_scales", "1,2")
    page.fill("#id_batch_size", batch)
    page.fill("#id_warmup_steps", "5")
    page.fill("#id_measured_steps", "20")
    page.fill("#id_time_limit_minutes", "5")
    page.click("#create-study")
    page.wait_for_selector("#study-points")
    return str(page.url)


@pytest.mark.nodes(2, "batch")
def test_strong_and_weak_studies_show_tables_and_charts(
    page: Any,
    live_server: Any,
    dev_cluster_registered: Any,
    celery_stack: Any,
    researcher: Any,
    researcher_api: Any,
    artifacts: Path,
) -> None:
    log_in(page, live_server, researcher.username)
    page.click("nav.mainnav >> text=Studies")
    assert "No scaling studies yet" in page.inner_text("main")
    page.click("#new-study")

    # A global batch that 2 ranks cannot share is refused next to the field.
    page.fill("#id_name", "bad")
    page.fill("#id_batch_size", "15")
    page.click("#create-study")
    error = page.locator("[data-field=batch_size] .field-error").inner_text()
    assert "divisible" in error

    strong_url = start(page, live_server, "strong", "16")
    weak_url = start(page, live_server, "weak", "8")
    for url, kind in ((strong_url, "strong"), (weak_url, "weak")):
        page.goto(url)
        page.wait_for_function(
            "document.querySelector('#study-status').dataset.done === '1'", timeout=300_000
        )
        assert page.locator("[data-testid=study-state]").inner_text() == "completed"
        rows = page.locator("#study-points tbody tr")
        assert rows.count() == 2
        for index in range(2):
            assert rows.nth(index).get_attribute("data-status") == "completed"
            assert rows.nth(index).locator("[data-col=samples_per_s]").inner_text() != "–"
            assert rows.nth(index).locator("a.point-acceptance").count() == 1
        assert rows.nth(0).locator("[data-col=efficiency]").inner_text() == "100%"
        # Every chart is drawn with one point per scale.
        for chart in ("chart-throughput", "chart-speedup", "chart-efficiency", "chart-breakdown"):
            page.wait_for_function(
                f"document.querySelector('#{chart} polyline')"
                f" && Number(document.querySelector('#{chart} polyline').dataset.points) === 2"
            )
        svg = page.evaluate("GantryStudy.svgText('chart-throughput')")
        assert svg.startswith("<svg") and 'xmlns="http://www.w3.org/2000/svg"' in svg
        with page.expect_download() as download:
            page.click("a.svg-download[data-chart=chart-speedup]")
        assert download.value.suggested_filename.endswith("speedup.svg")
        disclaimer = page.locator("[data-testid=disclaimer]").inner_text()
        if kind == "weak":
            assert "not faster convergence" in disclaimer
        else:
            assert "global batch fixed" in disclaimer
        csv_text = page.evaluate(
            "fetch(document.querySelector('#export-csv').href).then(r => r.text())"
        )
        assert len(csv_text.strip().splitlines()) == 3
        page.screenshot(path=str(artifacts / f"study-{kind}.png"), full_page=True)
    page.click("nav.mainnav >> text=Studies")
    assert page.locator("#study-table tbody tr").count() == 2

    # The same studies through the API: the numbers behind the table.
    from studies.models import ScalingStudy

    def report(study_id: int) -> dict[str, Any]:
        return researcher_api.get(f"/api/v1/studies/{study_id}/").json()["report"]

    strong = ScalingStudy.objects.get(name="browser-strong").pk
    weak = ScalingStudy.objects.get(name="browser-weak").pk
    for study_id, kind in ((strong, "strong"), (weak, "weak")):
        result = report(study_id)
        assert result["state"] == "completed", result
        rows = result["rows"]
        assert [row["ranks"] for row in rows] == [1, 2]
        for row in rows:
            assert row["status"] == "completed"
            assert row["steps_measured"] >= 15, row
            assert row["samples_per_s"] > 0 and row["step_time_s"] > 0
        assert rows[0]["speedup"] == 1.0 and rows[1]["ideal_speedup"] == 2.0
        assert 0 < rows[1]["efficiency"] == pytest.approx(rows[1]["speedup"] / 2)
        assert result["compute_estimated"] and rows[1]["communication_s"] is not None
        # One point at a time, each under one leaf as the advice said.
        jobs = [Job.objects.get(id=row["job_id"]) for row in rows]
        assert jobs[0].ended_at <= jobs[1].started_at
        assert jobs[1].allocated_node_names == ["n1", "n2"]
        assert rows[1]["advised_nodelist"] == "n[1-2]"
        points = StudyPoint.objects.filter(study_id=study_id).order_by("ranks")
        if kind == "strong":
            assert [p.job.config["batch_size"] for p in points] == [16, 8]
            assert [j.acceptance["global_batch"] for j in jobs] == [16, 16]
        else:
            assert [p.job.config["batch_size"] for p in points] == [8, 8]
            assert [j.acceptance["global_batch"] for j in jobs] == [8, 16]
            assert "not faster convergence" in result["disclaimer"]
        assert result["comparable"], result["differences"]
