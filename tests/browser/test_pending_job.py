"""A job waiting on a full partition of the real dev cluster: the page says why, when
Slurm expects it to start and where it stands in the queue; hold and release it. The
partition, its nodes and GPUs are read from Gantry's synced inventory."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_support import STACK_ENV, wait_until
from jobs.models import Job
from nodes.models import Cluster, Node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def log_in(page: Any, live_server: Any, username: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_selector("nav.mainnav")


@pytest.fixture
def fast_stack(transactional_db: Any, tmp_path: Path, request: Any) -> Any:
    """A real Celery worker and beat that ask Slurm for pending jobs' start every 5 s."""
    from django.db import connection

    from celery_support import database_url_for, flush_test_broker, start_beat, start_worker

    flush_test_broker()
    url = database_url_for(connection.settings_dict)
    env = {**STACK_ENV, "GANTRY_PENDING_REFRESH": "5"}
    worker = start_worker(database_url=url, log_path=tmp_path / "worker.log", extra_env=env)
    request.addfinalizer(worker.stop)
    beat = start_beat(database_url=url, log_path=tmp_path / "beat.log", extra_env=env)
    request.addfinalizer(beat.stop)
    return {"worker": worker, "beat": beat}


def a_partition_with_gpus(cluster: Cluster) -> tuple[str, list[Node], str, int]:
    """From the synced inventory: a partition whose nodes have GPUs, its nodes, their most
    common GPU type and how many of it every one of them has."""
    for name in [cluster.default_partition, *cluster.partitions.values_list("name", flat=True)]:
        nodes = list(
            Node.objects.filter(cluster=cluster, partitions_text__contains=f",{name},")
            .exclude(state=Node.State.GONE)
            .prefetch_related("gpus")
        )
        types = Counter(gpu.gpu_type for node in nodes for gpu in node.gpus.all() if gpu.gpu_type)
        if nodes and types:
            gpu_type = types.most_common(1)[0][0]
            per_node = min(
                sum(1 for gpu in node.gpus.all() if gpu.gpu_type == gpu_type) for node in nodes
            )
            if per_node:
                return name, nodes, gpu_type, per_node
    raise AssertionError("the synced inventory has no partition with GPUs")


@pytest.fixture
def full_partition(dev_cluster_registered: Any, devcluster: Any) -> Iterator[dict[str, Any]]:
    """One long job holding every node of the partition and all their GPUs."""
    partition, nodes, gpu_type, per_node = a_partition_with_gpus(dev_cluster_registered)
    blocker = devcluster.run_as_cluster_user(
        [
            "sbatch",
            "--parsable",
            f"--partition={partition}",
            f"--nodes={len(nodes)}",
            f"--gres=gpu:{gpu_type}:{per_node}",
            "--exclusive",
            "--time=10",
            "--job-name=gantry-test-blocker",
            "--wrap",
            "sleep 600",
        ]
    ).stdout.strip()
    try:
        wait_until(
            lambda: (
                devcluster.slurm(["squeue", "-h", "-j", blocker, "-o", "%T"]).stdout.strip()
                == "RUNNING"
            ),
            timeout=60,
            what="the blocker to run",
        )
        yield {
            "cluster": dev_cluster_registered,
            "partition": partition,
            "nodes": nodes,
            "gpu_type": gpu_type,
            "gpus_per_node": per_node,
        }
    finally:
        devcluster.slurm(["scancel", blocker], check=False)


@pytest.mark.nodes(2, "batch")
def test_a_pending_job_shows_its_reason_and_expected_start(
    page: Any,
    live_server: Any,
    full_partition: dict[str, Any],
    fast_stack: Any,
    devcluster: Any,
    researcher: Any,
    artifacts: Path,
) -> None:
    log_in(page, live_server, researcher.username)
    page.goto(f"{live_server.url}/jobs/new/")
    page.fill("#id_name", "waits-for-the-partition")
    page.select_option("#id_partition", full_partition["partition"])
    page.select_option("#id_gpu_type", full_partition["gpu_type"])
    page.fill("#id_nodes", str(len(full_partition["nodes"])))
    page.fill("#id_gpus_per_node", str(full_partition["gpus_per_node"]))
    page.fill("#id_tasks_per_node", "1")
    page.fill("#id_steps", "5")
    page.fill("#id_time_limit_minutes", "5")
    page.wait_for_function(
        "document.querySelector('#live-status').textContent.includes('can run this')"
    )
    page.click("#submit-button")
    page.wait_for_selector("[data-testid=job-state]")
    job = Job.objects.get()
    try:
        reason = page.locator("[data-testid=pending-reason]")
        reason.wait_for(timeout=90_000)
        code = page.locator("[data-testid=pending-code]").inner_text()
        assert code in {"Resources", "Priority", "None"}, code
        # Slurm's backfill plans a start time (every 30 s); the watcher asks every 5 s.
        page.wait_for_selector("[data-testid=expected-start] time", timeout=150_000)
        job.refresh_from_db()
        assert job.state == Job.State.PENDING and job.expected_start_at is not None
        assert job.expected_start_at > job.submitted_at  # type: ignore[operator]
        position = page.locator("[data-testid=queue-position]")
        assert position.get_attribute("data-source") == "slurm"
        assert "in Slurm's priority order" in position.inner_text()
        assert page.locator("[data-testid=pending-code]").inner_text() in {"Resources", "Priority"}
        page.screenshot(path=str(artifacts / "pending-job.png"), full_page=True)

        page.click("#hold-button")
        page.wait_for_selector("[data-testid=pending-reason][data-held='1']", timeout=60_000)
        # Slurm's own reason once the watcher has read it: held (by its owner's account).
        page.wait_for_function(
            "document.querySelector('[data-testid=pending-code]')"
            " && document.querySelector('[data-testid=pending-code]').textContent"
            ".startsWith('JobHeld')",
            timeout=60_000,
        )
        assert "Held in Gantry" in page.inner_text("[data-testid=pending-explanation]")
        assert "none while it is held" in page.inner_text("[data-testid=expected-start]")
        page.screenshot(path=str(artifacts / "pending-job-held.png"), full_page=True)
        page.click("#release-button")
        page.wait_for_function(
            "document.querySelector('[data-testid=pending-code]')"
            " && !document.querySelector('[data-testid=pending-code]').textContent"
            ".startsWith('JobHeld')",
            timeout=60_000,
        )
        page.wait_for_selector("[data-testid=pending-reason][data-held='0']")
        assert page.locator("#hold-button").count() == 1
    finally:
        job.refresh_from_db()
        if job.slurm_job_id:
            devcluster.slurm(["scancel", job.slurm_job_id], check=False)
