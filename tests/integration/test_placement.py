"""Placement advice on the dev cluster: 2 nodes × 1 GPU go under one leaf, and Slurm
puts the job where the advice said."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from celery_support import wait_until
from jobs.models import Job
from jobs.placement import job_placement_check

pytestmark = pytest.mark.django_db(transaction=True)

BODY: dict[str, Any] = {
    "name": "placed-2x1",
    "partition": "batch",
    "nodes": 2,
    "gpus_per_node": 1,
    "tasks_per_node": 1,
    "time_limit_minutes": 5,
    "config": {"preset": "tiny", "steps": 10, "checkpoint_every": 0},
}


@pytest.mark.nodes(2, "batch")
def test_two_by_one_is_advised_under_one_leaf_and_runs_there(
    dev_cluster_registered: Any, celery_stack: Any, researcher_api: APIClient, researcher: Any
) -> None:
    preview = researcher_api.post("/api/v1/jobs/preview/", BODY, format="json")
    assert preview.status_code == 200, preview.json()
    advice = preview.json()["placement"]
    assert advice["feasible"], advice
    assert advice["nodelist"] == "n[1-2]" and advice["leaves"] == ["leaf1"]
    assert advice["switches_spanned"] == ["leaf1"] and advice["optimal_switch_count"] == 1
    assert "under leaf1" in advice["explanation"]

    submitted = researcher_api.post(
        "/api/v1/jobs/submit/", {**BODY, "use_placement_advice": True}, format="json"
    )
    assert submitted.status_code == 202, submitted.json()
    job_id = submitted.json()["id"]
    job = Job.objects.get(id=job_id)
    assert (job.nodelist_requested, job.switches_requested) == ("n[1-2]", "1@10")
    worker = celery_stack["worker"]
    wait_until(
        lambda: Job.objects.get(id=job_id).is_final,
        timeout=180,
        what=lambda: f"the job to end; worker log:\n{worker.log()[-3000:]}",
    )
    job = Job.objects.get(id=job_id)
    assert job.state == "completed", (job.state, job.state_reason)
    assert job.allocated_node_names == ["n1", "n2"]
    check = job_placement_check(job)
    assert check is not None and check.matches_request and not check.flagged
    assert check.check.switches_spanned == ("leaf1",)

    client = Client()
    client.force_login(researcher)
    status = client.get(f"/jobs/{job_id}/status/").content.decode()
    assert "n[1-2] under leaf1 (1 switch) — matches the advice" in status
    topology = client.get(f"/topology/?job={job_id}").content.decode()
    assert topology.count(' highlight" data-node=') == 2
