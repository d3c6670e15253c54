"""Helpers for the drill tests on the dev cluster: a job through the API, drills, verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rest_framework.test import APIClient

import lanes
from celery_support import wait_until
from devcluster_support import DevCluster
from drills.models import RestoreDrill
from jobs.models import Checkpoint, Job


def run_job(
    api: APIClient, *, steps: int, every: int, name: str, nodes: int = 2, keep: int = 20
) -> Job:
    response = api.post(
        "/api/v1/jobs/submit/",
        {
            "name": name,
            "partition": lanes.assigned_partition(),
            "nodes": nodes,
            "gpus_per_node": 1,
            "tasks_per_node": 1,
            "time_limit_minutes": 10,
            "config": {
                "preset": "tiny",
                "steps": steps,
                "checkpoint_every": every,
                "checkpoint_keep": keep,
            },
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    return Job.objects.get(id=response.json()["id"])


def wait_finished(job: Job, worker: Any, timeout: float = 180) -> Job:
    wait_until(
        lambda: Job.objects.get(id=job.id).files_final,
        timeout=timeout,
        what=lambda: f"job {job.name} to end; worker log:\n{worker.log()[-3000:]}",
    )
    job.refresh_from_db()
    assert job.state == "completed", (job.state, job.state_reason)
    return job


def start_drill(api: APIClient, checkpoint: Checkpoint, **body: Any) -> str:
    response = api.post(f"/api/v1/checkpoints/{checkpoint.pk}/drills/", body, format="json")
    assert response.status_code == 202, response.json()
    return str(response.json()["id"])


def wait_verdict(drill_id: str, worker: Any, timeout: float = 150) -> RestoreDrill:
    wait_until(
        lambda: not RestoreDrill.objects.get(id=drill_id).is_active,
        timeout=timeout,
        what=lambda: f"drill verdict; worker log:\n{worker.log()[-3000:]}",
    )
    return RestoreDrill.objects.get(id=drill_id)


def checkpoint_dir(devcluster: DevCluster, checkpoint: Checkpoint) -> Path:
    # The dev cluster's work directory is on this host: corrupt the files in place.
    path = Path(checkpoint.path)
    assert path.is_dir() and str(path).startswith(devcluster.workdir)
    return path
