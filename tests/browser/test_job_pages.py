"""Submit a job from the form and watch its page follow it to the end, in a real browser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def log_in(page: Any, live_server: Any, username: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_selector("nav.mainnav")


@pytest.mark.nodes(2, "batch")
def test_submit_from_the_form_and_watch_it_complete(
    page: Any,
    live_server: Any,
    dev_cluster_registered: Any,
    celery_stack: Any,
    researcher: Any,
    artifacts: Path,
) -> None:
    from nodes.models import Cluster

    # Drills that prove run as the dev cluster's verifier account (drills.attestation).
    Cluster.objects.filter(pk=dev_cluster_registered.pk).update(verifier_account="gantry-verify")
    log_in(page, live_server, researcher.username)
    page.click("nav.mainnav >> text=Jobs")
    assert "No jobs here yet" in page.inner_text("main")
    page.click("#new-job")

    # An impossible request is refused on the page, next to the field.
    page.fill("#id_name", "browser-ddp")
    page.fill("#id_steps", "30")
    page.fill("#id_checkpoint_every", "10")
    page.fill("#id_nodes", "2")
    page.fill("#id_gpus_per_node", "4")
    page.click("#submit-button")
    error = page.locator("[data-field=gpus_per_node] .field-error")
    assert "no node in partition batch has more than 2" in error.inner_text()

    page.fill("#id_gpus_per_node", "1")
    page.fill("#id_tasks_per_node", "1")
    page.click("#preview-button")
    preview = page.locator("#sbatch-preview").inner_text()
    assert "#SBATCH --nodes=2" in preview and "#SBATCH --gpus-per-node=1" in preview
    page.click("#submit-button")

    page.wait_for_selector("[data-testid=job-state]")
    page.wait_for_function(
        "document.querySelector('#job-status').dataset.final === '1'", timeout=180_000
    )
    assert page.locator("[data-testid=job-state]").inner_text() == "Completed"
    assert "step 30 / 30" in page.inner_text("#job-status")
    assert page.locator("#checkpoint-table tbody tr").count() == 3
    # The loss chart is drawn: a line with one point per logged step.
    page.wait_for_function(
        "document.querySelector('#chart-loss polyline[data-series=loss]')"
        " && Number(document.querySelector('#chart-loss polyline').dataset.points) === 30"
    )
    page.click("#load-logs")
    page.wait_for_function("document.querySelector('#logs').textContent.includes('trainer')")
    # The whole output with a range request, and each rank's own file, from the cluster.
    job_url = page.url.rstrip("/")
    job_id = job_url.rsplit("/", 1)[1]
    ranged = page.request.get(
        f"{live_server.url}/api/v1/jobs/{job_id}/output/", headers={"Range": "bytes=0-6"}
    )
    assert ranged.status == 206 and ranged.text() == "gantry:", ranged.text()
    assert ranged.headers["content-range"].startswith("bytes 0-6/")
    page.wait_for_selector("#rank-outputs a.rank-output[data-rank='1']")
    rank0 = page.request.get(f"{live_server.url}/api/v1/jobs/{job_id}/output/ranks/0/")
    assert rank0.status == 200 and "trainer: rank 0/2" in rank0.text()
    page.screenshot(path=str(artifacts / "job-detail.png"), full_page=True)

    # Prove a checkpoint: open step 10, run a restore drill, watch the verdict arrive.
    page.click("#checkpoint-table tr[data-step='10'] a >> text=10")
    assert "never proven" in page.inner_text("h1")
    assert page.locator("#file-table tbody tr").count() >= 2
    page.fill("#drill-steps", "3")
    page.click("#run-drill")
    page.wait_for_selector("[data-testid=verdict]", timeout=120_000)
    assert page.locator("[data-testid=verdict]").inner_text().lower() == "passed"
    assert page.locator("#step-table tbody tr").count() == 3
    assert page.locator("#rank-table tbody tr").count() == 2
    assert float(page.locator("[data-testid=load-s]").inner_text()) >= 0
    page.wait_for_function("document.querySelectorAll('#chart-drill polyline').length === 2")
    page.screenshot(path=str(artifacts / "drill-detail.png"), full_page=True)
    page.click(".crumbs a >> text=step 10")
    assert "proven restorable" in page.inner_text("h1")
