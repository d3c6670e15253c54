"""Jobs end to end on the dev cluster, with a real Celery worker and beat and Redis."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

import lanes
from celery_support import wait_until
from devcluster_support import DevCluster
from jobs.models import Job
from jobs.services import job_submit_to_slurm
from slurm import commands as slurm_commands

pytestmark = pytest.mark.django_db(transaction=True)

TINY = {"preset": "tiny", "steps": 40, "checkpoint_every": 15}


def submit(api: APIClient, **overrides: Any) -> str:
    body: dict[str, Any] = {
        "name": "ddp-2x1",
        "partition": lanes.assigned_partition(),
        "nodes": 2,
        "gpus_per_node": 1,
        "tasks_per_node": 1,
        "time_limit_minutes": 5,
        "config": TINY,
    }
    body.update(overrides)
    response = api.post("/api/v1/jobs/submit/", body, format="json")
    assert response.status_code == 202, response.json()
    return str(response.json()["id"])


def state_of(job_id: str) -> str:
    return Job.objects.get(id=job_id).state


def slurm_jobs_tagged(devcluster: DevCluster, job_id: str) -> list[str]:
    tag = slurm_commands.job_tag(job_id)
    out = devcluster.slurm(
        ["sacct", "-n", "-X", "-P", "-o", "JobID", f"--name={tag}", "-S", "now-1hour"]
    ).stdout
    queue = devcluster.slurm(["squeue", "-h", "-o", "%i", f"--name={tag}"]).stdout
    return sorted(set(out.split()) | set(queue.split()))


@pytest.mark.nodes(2, "batch")
def test_two_node_ddp_job_runs_to_completion(
    dev_cluster_registered: Any, celery_stack: Any, researcher_api: APIClient
) -> None:
    job_id = submit(researcher_api)
    worker = celery_stack["worker"]
    wait_until(
        lambda: Job.objects.get(id=job_id).slurm_job_id,
        timeout=60,
        what=lambda: f"a Slurm id; worker log:\n{worker.log()[-3000:]}",
    )
    wait_until(
        lambda: Job.objects.get(id=job_id).is_final and Job.objects.get(id=job_id).files_final,
        timeout=180,
        what=lambda: f"the job to end; worker log:\n{worker.log()[-3000:]}",
    )
    job = Job.objects.get(id=job_id)
    assert job.state == "completed", (job.state, job.state_reason)
    assert job.exit_code == 0
    assert job.allocated_nodes in ("n[1-2]", "n1,n2")
    assert job.metric_points.count() == 40
    assert job.last_step == 40
    assert job.checkpoints.count() >= 2
    assert sorted(job.checkpoints.values_list("step", flat=True))[:2] == [15, 30]
    assert all(c.world_size == 2 for c in job.checkpoints.all())
    assert job.acceptance["world_size"] == 2
    assert job.acceptance["nodes"] == ["n1", "n2"]
    states = list(job.events.filter(kind="state").values_list("to_state", flat=True))
    assert states[:3] == ["queued", "submitting", "pending"] and states[-1] == "completed"
    assert "running" in states

    # The tail as a worker read it (the web request reads nothing): asked, then polled.
    wait_until(
        lambda: (
            "trainer: rank 0/2 on n1"
            in researcher_api.get(f"/api/v1/jobs/{job_id}/logs/").json()["text"]
        ),
        timeout=30,
        what="the log tail, read by the worker",
    )
    metrics = researcher_api.get(f"/api/v1/jobs/{job_id}/metrics/").json()
    assert metrics["count"] == 40 and len(metrics["series"]["loss"]) == 40
    assert metrics["optimal_loss"] is not None
    downsampled = researcher_api.get(f"/api/v1/jobs/{job_id}/metrics/?max_points=10").json()
    assert downsampled["downsampled"] and len(downsampled["step"]) <= 10
    assert downsampled["step"][-1] == 40
    checkpoints = researcher_api.get(f"/api/v1/jobs/{job_id}/checkpoints/").json()
    assert checkpoints[0]["step"] == 40


@pytest.mark.nodes(1)
def test_cancel_while_running(
    dev_cluster_registered: Any, celery_stack: Any, researcher_api: APIClient
) -> None:
    job_id = submit(
        researcher_api, name="long", nodes=1, config={"preset": "tiny", "steps": 100000}
    )
    wait_until(lambda: state_of(job_id) == "running", timeout=90, what="running")
    response = researcher_api.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code == 202
    wait_until(lambda: state_of(job_id) == "cancelled", timeout=60, what="cancelled")
    # Idempotent: a second cancel changes nothing and is not an error.
    assert researcher_api.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 202
    assert state_of(job_id) == "cancelled"


@pytest.mark.nodes(1)
def test_submit_task_run_twice_leaves_exactly_one_slurm_job(
    dev_cluster_registered: Any, researcher_api: APIClient, devcluster: DevCluster
) -> None:
    # No worker here: the "task" is called by hand, as a redelivery would.
    job_id = submit(researcher_api, name="twice", nodes=1, config={"preset": "tiny", "steps": 5})
    first = job_submit_to_slurm(job_id=job_id)
    assert first.startswith("submitted as Slurm job")
    slurm_id = Job.objects.get(id=job_id).slurm_job_id
    # A redelivery of the same message: nothing to claim.
    assert job_submit_to_slurm(job_id=job_id).startswith("not claimable")
    # A worker that died after sbatch but before saving: the job is back in "submitting"
    # with an expired lease and no Slurm id; the next attempt must adopt, not resubmit.
    Job.objects.filter(id=job_id).update(
        state="submitting", slurm_job_id="", submit_lease_until=None
    )
    second = job_submit_to_slurm(job_id=job_id)
    assert second == f"adopted Slurm job {slurm_id}"
    assert Job.objects.get(id=job_id).slurm_job_id == slurm_id
    assert slurm_jobs_tagged(devcluster, job_id) == [slurm_id]
