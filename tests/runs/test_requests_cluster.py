"""A person's cancel on the dev cluster: the API answers from the database, the Celery
worker sends the real ``scancel`` as the job's account, the watcher records the end."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

import lanes
from celery_support import wait_until
from jobs.models import Job, JobEvent
from runs.models import SlurmRequest

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.nodes(1)
def test_the_worker_sends_scancel_for_a_requested_cancel(
    dev_cluster_registered: Any, celery_stack: Any, researcher_api: APIClient
) -> None:
    body = {
        "name": "to-cancel",
        "partition": lanes.assigned_partition(),
        "nodes": 1,
        "gpus_per_node": 1,
        "tasks_per_node": 1,
        "time_limit_minutes": 5,
        "config": {"preset": "tiny", "steps": 100000},
    }
    submitted = researcher_api.post("/api/v1/jobs/submit/", body, format="json")
    assert submitted.status_code == 202, submitted.json()
    job_id = str(submitted.json()["id"])
    worker = celery_stack["worker"]
    wait_until(
        lambda: Job.objects.get(id=job_id).state == "running",
        timeout=90,
        what=lambda: f"running; worker log:\n{worker.log()[-3000:]}",
    )
    answer = researcher_api.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert answer.status_code == 202 and answer.json()["request"] == "cancel requested"
    wait_until(
        lambda: SlurmRequest.objects.get(object_id=job_id).status == "done",
        timeout=60,
        what=lambda: f"scancel sent; worker log:\n{worker.log()[-3000:]}",
    )
    wait_until(lambda: Job.objects.get(id=job_id).state == "cancelled", timeout=60, what="end")
    job = Job.objects.get(id=job_id)
    assert JobEvent.objects.filter(job=job, message__startswith=f"scancel {job.slurm_job_id}")
    assert not JobEvent.objects.filter(job=job, message__startswith="could not cancel")
