"""The submit form built from the inventory, templates and readable charts, in headless
Chromium against a live server (the inventory is in the database; no cluster is needed:
nothing here reaches Slurm)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from factories import ClusterFactory, GpuFactory, JobFactory, NodeFactory, PartitionFactory
from jobs.models import Job, JobTemplate, MetricPoint
from nodes.models import Gpu, Node, Partition

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(page: Any, live_server: Any, username: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_selector("nav.mainnav")


@pytest.fixture
def inventory(researcher: Any) -> Any:
    """Two partitions with different GPU types (made before any page is opened)."""
    cluster = ClusterFactory(name="formcluster", is_default=True, default_partition="batch")
    PartitionFactory(cluster=cluster, name="batch", max_time_minutes=60, is_default=True)
    PartitionFactory(cluster=cluster, name="gpu", max_time_minutes=120)
    for name, partition, gpu_type, count in [
        ("n1", "batch", "a100", 2),
        ("n2", "batch", "a100", 2),
        ("n3", "gpu", "h100", 4),
        ("n4", "gpu", "h100", 4),
        ("n5", "gpu", "h100", 4),
    ]:
        node = NodeFactory(cluster=cluster, name=name, partitions=[partition], cpus_total=8)
        for index in range(count):
            GpuFactory(node=node, index=index, gpu_type=gpu_type)
    return cluster


def gpu_types_of(partition: str) -> set[str]:
    """The GPU types the inventory has in a partition, read from the database."""
    return set(
        Gpu.objects.filter(node__partitions_text__contains=f",{partition},")
        .values_list("gpu_type", flat=True)
        .distinct()
    )


def options(page: Any, select: str) -> list[str]:
    return page.eval_on_selector_all(f"{select} option", "els => els.map(e => e.value)")


def test_choosing_a_partition_changes_the_gpu_type_options(
    page: Any, live_server: Any, researcher: Any, inventory: Any, artifacts: Path
) -> None:
    log_in(page, live_server, researcher.username)
    page.goto(f"{live_server.url}/jobs/new/")
    partitions = set(Partition.objects.filter(cluster=inventory).values_list("name", flat=True))
    assert set(options(page, "#id_partition")) == partitions
    batch_label = page.locator("#id_partition option[value=batch]").inner_text()
    assert "2 nodes, 2 idle" in batch_label and "a100 ×2/node" in batch_label
    assert set(options(page, "#id_gpu_type")) - {""} == gpu_types_of("batch")
    assert page.get_attribute("#id_nodes", "max") == "2"

    page.select_option("#id_partition", "gpu")
    page.wait_for_function(
        "Array.from(document.querySelectorAll('#id_gpu_type option')).some(o => o.value === 'h100')"
    )
    assert set(options(page, "#id_gpu_type")) - {""} == gpu_types_of("gpu")
    assert "a100" not in options(page, "#id_gpu_type")
    assert "4 per node on 3 nodes" in page.locator("#id_gpu_type option[value=h100]").inner_text()
    nodes = Node.objects.filter(cluster=inventory, partitions_text__contains=",gpu,").count()
    assert page.get_attribute("#id_nodes", "max") == str(nodes)
    assert page.get_attribute("#id_gpus_per_node", "max") == "4"
    assert page.get_attribute("#id_time_limit_minutes", "max") == "120"
    assert f"{nodes} nodes" in page.inner_text("#partition-summary")
    page.screenshot(path=str(artifacts / "submit-form-partition.png"), full_page=True)


def test_an_impossible_request_shows_the_field_error_before_submitting(
    page: Any, live_server: Any, researcher: Any, inventory: Any, artifacts: Path
) -> None:
    log_in(page, live_server, researcher.username)
    page.goto(f"{live_server.url}/jobs/new/")
    page.fill("#id_name", "too-big")
    page.select_option("#id_partition", "gpu")
    page.select_option("#id_gpu_type", "h100")
    page.fill("#id_nodes", "2")
    page.fill("#id_tasks_per_node", "1")
    page.fill("#id_gpus_per_node", "5")
    error = page.locator("[data-field=gpus_per_node] .field-error")
    error.wait_for()
    # The API's words, next to the field, and nothing was submitted.
    assert "no node in partition gpu has more than 4 h100 GPUs; 5 requested" in error.inner_text()
    assert page.url.endswith("/jobs/new/")
    assert "problem" in page.inner_text("#live-status")
    assert not Job.objects.exists()
    page.screenshot(path=str(artifacts / "submit-form-field-error.png"), full_page=True)

    page.fill("#id_gpus_per_node", "4")
    page.wait_for_function("!document.querySelector('[data-field=gpus_per_node] .field-error')")
    page.wait_for_function(
        "document.querySelector('#sbatch-preview').textContent.includes('--gpus-per-node=h100:4')"
    )
    assert "The cluster can run this." in page.inner_text("#live-status")
    assert page.locator("#placement-advice [data-testid=advice-nodes]").inner_text()
    # Presets with their size and, with no past job on the partition, step time unknown.
    assert "parameters" in page.inner_text("#preset-table")
    assert "unknown" in page.inner_text("#preset-table tr[data-preset=tiny]")
    assert "No history on this cluster yet" in page.inner_text("#checkpoint-advice")
    page.screenshot(path=str(artifacts / "submit-form-live.png"), full_page=True)


def test_a_template_submits_a_job(
    page: Any, live_server: Any, researcher: Any, inventory: Any, artifacts: Path
) -> None:
    log_in(page, live_server, researcher.username)
    page.goto(f"{live_server.url}/jobs/new/")
    page.fill("#id_name", "from-a-template")
    page.select_option("#id_partition", "gpu")
    page.select_option("#id_gpu_type", "h100")
    page.fill("#id_nodes", "3")
    page.fill("#id_gpus_per_node", "2")
    page.fill("#id_steps", "60")
    page.click("#save-template summary")
    page.fill("#id_save_name", "h100 sweep")
    page.check("#id_save_shared")
    page.click("#save-template-button")
    page.wait_for_url("**/jobs/templates/")
    row = page.locator("#template-table tr", has_text="h100 sweep")
    assert "shared with everyone" in row.inner_text()
    template = JobTemplate.objects.get()
    assert template.owner == researcher and template.shared
    assert not Job.objects.exists()
    page.screenshot(path=str(artifacts / "job-templates.png"), full_page=True)

    row.locator("button.submit-template").click()
    page.wait_for_selector("[data-testid=job-state]")
    job = Job.objects.get()
    assert page.url.endswith(f"/jobs/{job.id}/")
    assert "from template “h100 sweep”" in page.inner_text(".messages")
    assert (job.name, job.partition, job.nodes, job.gpus_per_node, job.gpu_type) == (
        "from-a-template",
        "gpu",
        3,
        2,
        "h100",
    )
    assert job.owner == researcher and job.total_steps == 60

    # Run again: the form, prefilled with the job's settings.
    page.click("#run-again")
    page.wait_for_url("**/jobs/new/?from_job=*")
    assert page.input_value("#id_name") == "from-a-template"
    assert page.input_value("#id_partition") == "gpu"
    assert page.input_value("#id_gpu_type") == "h100"
    assert page.input_value("#id_nodes") == "3"
    page.screenshot(path=str(artifacts / "run-again.png"), full_page=True)


def test_charts_have_step_axes_hover_values_and_zoom(
    page: Any, live_server: Any, researcher: Any, inventory: Any, artifacts: Path
) -> None:
    job = JobFactory(
        owner=researcher,
        cluster=inventory,
        name="charted",
        state=Job.State.COMPLETED,
        files_final=True,
        total_steps=5000,
        last_step=5000,
    )
    start = timezone.now() - timedelta(hours=1)
    MetricPoint.objects.bulk_create(
        MetricPoint(
            job=job,
            step=step,
            wall_time=start + timedelta(seconds=step),
            elapsed_s=float(step),
            loss=3.0 / (1 + step / 500),
            samples_per_s=100.0,
            tokens_per_s=6400.0,
            step_time_s=0.1,
            data_time_s=0.01,
            checkpoint_blocking_s=0.0,
        )
        for step in range(1, 5001)
    )
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    log_in(page, live_server, researcher.username)
    page.goto(f"{live_server.url}/jobs/{job.id}/")
    page.wait_for_selector("#chart-loss polyline[data-series=loss]")
    width = page.evaluate("GantryChart.plotWidth(document.getElementById('chart-loss'))")
    points = int(page.get_attribute("#chart-loss polyline[data-series=loss]", "data-points") or 0)
    # At most one point per pixel, not 5000.
    assert 10 <= points <= width
    ticks = page.eval_on_selector_all(
        "#chart-loss .chart-x-tick", "els => els.map(e => e.textContent)"
    )
    assert ticks and all(tick.replace(",", "").isdigit() for tick in ticks), ticks

    box = page.locator("#chart-loss svg").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    tip = page.locator("#chart-loss .chart-tip")
    tip.wait_for()
    assert tip.inner_text().startswith("step ")
    assert "loss:" in tip.inner_text()
    page.screenshot(path=str(artifacts / "chart-hover.png"), full_page=False)

    # Drag across a fifth of the plot: that step range is fetched again.
    y = box["y"] + box["height"] * 0.5
    page.mouse.move(box["x"] + box["width"] * 0.4, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=8)
    page.mouse.up()
    page.wait_for_selector("#chart-loss .chart-reset")
    zoomed = [url for url in requests if "step_min=" in url and "step_max=" in url]
    assert zoomed, requests
    low = float(page.get_attribute("#chart-loss svg", "data-x-min") or 0)
    high = float(page.get_attribute("#chart-loss svg", "data-x-max") or 0)
    assert 1000 < low < high < 4000
    assert "in steps" in page.inner_text("#chart-note")
    # The other step charts follow the same range.
    assert float(page.get_attribute("#chart-throughput svg", "data-x-min") or 0) == low
    page.screenshot(path=str(artifacts / "chart-zoomed.png"), full_page=False)
    page.click("#chart-loss .chart-reset")
    page.wait_for_function(
        "Number(document.querySelector('#chart-loss svg').dataset.xMax) === 5000"
    )


class GrowingLog:
    """The cluster's side of a running job's output, over a stand-in SFTP: the test
    appends to it while the page follows."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def stat(self, path: str) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(size=len(self.files[path])) if path in self.files else None

    def read_from(self, path: str, offset: int, max_bytes: int) -> bytes:
        return self.files[path][offset : offset + max_bytes]

    def listdir(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return [name[len(prefix) :] for name in self.files if name.startswith(prefix)]


def test_the_log_tail_follows_a_running_job(
    page: Any,
    live_server: Any,
    researcher: Any,
    inventory: Any,
    artifacts: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import jobs.services
    from jobs.lifecycle import JOBS

    job = JobFactory(
        owner=researcher,
        cluster=inventory,
        name="talkative",
        state=Job.State.RUNNING,
        slurm_job_id="777",
        nodes=1,
        tasks_per_node=2,
        total_steps=100,
        last_step=1,
    )
    directory = JOBS.run_directory(job)
    log = f"{directory}/slurm-777.out"
    fake = GrowingLog(
        {
            log: b"gantry: job 777 on n1\nstep 1 loss 3.2\n",
            f"{directory}/rank-777-0.out": b"step 1 loss 3.2\n",
            f"{directory}/rank-777-1.out": b"",
        }
    )
    # The live server runs in this process: the output stream reads the cluster, and the
    # tail's worker read (jobs.services.job_log_tail_read) runs here as the broker's.
    monkeypatch.setattr(JOBS, "transport_of", lambda obj: fake)
    monkeypatch.setattr(
        jobs.services,
        "task_send",
        lambda name, job_id: bool(jobs.services.job_log_tail_read(job_id=job_id)),
    )
    log_in(page, live_server, researcher.username)
    page.goto(f"{live_server.url}/jobs/{job.id}/")
    page.click("#load-logs")
    page.wait_for_function("document.querySelector('#logs').textContent.includes('step 1 loss')")
    assert "following the output" in page.inner_text("#logs-follow")
    # When the shown tail was read, in words.
    assert " s ago)" in page.inner_text("#logs-read-at")
    page.wait_for_selector("#rank-outputs a.rank-output[data-rank='1']")
    assert page.locator("#rank-outputs a.rank-output").count() == 2
    assert page.get_attribute("#download-output", "href") == f"/jobs/{job.id}/output/"

    fake.files[log] += b"step 2 loss 2.9\nstep 3 loss 2.7\n"
    page.wait_for_function(
        "document.querySelector('#logs').textContent.includes('step 3 loss 2.7')", timeout=20_000
    )
    text = page.inner_text("#logs")
    # Appended once, in order, after what was shown.
    assert text.count("step 1 loss") == 1 and text.index("step 2") < text.index("step 3")
    page.screenshot(path=str(artifacts / "log-follow.png"), full_page=False)
