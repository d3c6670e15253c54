"""Submitting through the API: refusals name the field, and nothing reaches Slurm."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from factories import ClusterFactory, GpuFactory, JobFactory, NodeFactory, PartitionFactory
from jobs.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster() -> Any:
    cluster = ClusterFactory(name="devcluster", is_default=True, default_partition="batch")
    PartitionFactory(cluster=cluster, name="batch", max_time_minutes=60, is_default=True)
    PartitionFactory(cluster=cluster, name="gpu", max_time_minutes=120)
    for name, partition, gpu_type in [
        ("n1", "batch", "a100"),
        ("n2", "batch", "a100"),
        ("n3", "gpu", "h100"),
        ("n4", "gpu", "h100"),
    ]:
        node = NodeFactory(cluster=cluster, name=name, partitions=[partition], cpus_total=2)
        GpuFactory(node=node, index=0, gpu_type=gpu_type)
        GpuFactory(node=node, index=1, gpu_type=gpu_type)
    return cluster


def body(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "test",
        "partition": "batch",
        "nodes": 2,
        "gpus_per_node": 1,
        "tasks_per_node": 1,
        "time_limit_minutes": 10,
        "config": {"preset": "tiny", "steps": 20},
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("overrides", "field", "why"),
    [
        ({"partition": "nope"}, "partition", "is not a partition of devcluster (batch, gpu)"),
        ({"gpus_per_node": 4}, "gpus_per_node", "no node in partition batch has more than 2"),
        ({"gpu_type": "h100"}, "gpu_type", "partition batch has no 'h100' GPUs (a100)"),
        ({"nodes": 3}, "nodes", "partition batch has 2 nodes; 3 requested"),
        ({"time_limit_minutes": 61}, "time_limit_minutes", "allows at most 60 minutes"),
        ({"cpus_per_task": 3}, "cpus_per_task", "nodes in batch have at most 2"),
        ({"nodelist": "n3"}, "nodelist", "not nodes of partition batch: n3"),
        ({"nodelist": "n[1-"}, "nodelist", "not a node list expression"),
        ({"config": {"preset": "tiny", "d_model": 30}}, "config.d_model", "divisible"),
        ({"config": {"preset": "tiny", "bogus": 1}}, "config.bogus", "unknown"),
        ({"config": {"steps": "ten"}}, "config.steps", ""),
        ({"name": "two\nlines"}, "name", "control characters"),
        ({"switches": "lots"}, "switches", "COUNT@MINUTES"),
    ],
)
def test_impossible_requests_are_refused_with_the_field(
    cluster: Any, researcher_api: APIClient, overrides: dict[str, Any], field: str, why: str
) -> None:
    response = researcher_api.post("/api/v1/jobs/submit/", body(**overrides), format="json")
    assert response.status_code == 400, response.json()
    payload = response.json()
    assert set(payload) == {"message", "extra"}
    assert field in payload["extra"]["fields"], payload
    assert why in payload["extra"]["fields"][field][0]
    assert not Job.objects.exists()


def test_a_valid_request_is_accepted_queued_and_audited(
    cluster: Any, researcher_api: APIClient, researcher: Any
) -> None:
    response = researcher_api.post("/api/v1/jobs/submit/", body(), format="json")
    assert response.status_code == 202
    job = Job.objects.get(id=response.json()["id"])
    assert response.json()["poll"] == f"/api/v1/jobs/{job.id}/"
    assert job.state == "queued" and job.owner == researcher
    assert job.config["d_model"] == 64 and job.total_steps == 20
    assert job.events.get().to_state == "queued"
    from core.models import AuditEvent

    assert AuditEvent.objects.filter(action="job.submit", target_id=str(job.id)).exists()


def test_preview_shows_the_exact_script(cluster: Any, researcher_api: APIClient) -> None:
    response = researcher_api.post(
        "/api/v1/jobs/preview/", body(gpu_type="a100", nodelist="n[1-2]"), format="json"
    )
    assert response.status_code == 200, response.json()
    script = response.json()["script"]
    assert "#SBATCH --partition=batch" in script
    assert "#SBATCH --nodes=2" in script
    assert "#SBATCH --gpus-per-node=a100:1" in script
    assert "#SBATCH --nodelist=n[1-2]" in script
    # Every rank's output also goes to its own file (jobs.output serves them).
    assert "srun --export=ALL --kill-on-bad-exit=1 /bin/bash --noprofile --norc -p -c " in script
    # The trainer starts isolated (runs.runtime.TRAINER_BOOTSTRAP): no user site, no PYTHON*.
    assert "/usr/bin/python3 -I -u -c " in script and " train --config" in script
    assert response.json()["world_size"] == 2
    assert not Job.objects.exists()


def test_hostile_names_never_reach_the_script_as_code(
    cluster: Any, researcher_api: APIClient
) -> None:
    response = researcher_api.post(
        "/api/v1/jobs/preview/", body(name="x; rm -rf / $(touch /tmp/p) `id`"), format="json"
    )
    script = response.json()["script"]
    # The name appears only in the comment line, never in a command.
    lines = [line for line in script.splitlines() if "rm -rf" in line]
    assert len(lines) == 1 and lines[0].startswith("# Gantry job ")


def test_outsider_cannot_submit(cluster: Any, outsider_api: APIClient) -> None:
    response = outsider_api.post("/api/v1/jobs/submit/", body(), format="json")
    assert response.status_code == 403
    assert not Job.objects.exists()


def test_researchers_see_only_their_jobs_and_cannot_touch_others(
    researcher_api: APIClient, researcher: Any, other_researcher: Any, operator_api: APIClient
) -> None:
    mine = JobFactory(owner=researcher)
    theirs = JobFactory(owner=other_researcher)
    listed = researcher_api.get("/api/v1/jobs/").json()["results"]
    assert [row["id"] for row in listed] == [str(mine.id)]
    assert researcher_api.get(f"/api/v1/jobs/{theirs.id}/").status_code == 404
    assert researcher_api.post(f"/api/v1/jobs/{theirs.id}/cancel/").status_code == 404
    assert researcher_api.get(f"/api/v1/jobs/{theirs.id}/metrics/").status_code == 404
    everyone = operator_api.get("/api/v1/jobs/").json()["results"]
    assert {row["id"] for row in everyone} == {str(mine.id), str(theirs.id)}


def test_cancel_before_slurm_is_immediate_and_idempotent(
    researcher_api: APIClient, researcher: Any
) -> None:
    job = JobFactory(owner=researcher)
    assert researcher_api.post(f"/api/v1/jobs/{job.id}/cancel/").status_code == 202
    job.refresh_from_db()
    assert job.state == "cancelled" and job.files_final
    assert researcher_api.post(f"/api/v1/jobs/{job.id}/cancel/").status_code == 202
    assert job.events.filter(to_state="cancelled").count() == 1


def test_job_list_is_cursor_paginated(researcher_api: APIClient, researcher: Any) -> None:
    for _ in range(5):
        JobFactory(owner=researcher)
    first = researcher_api.get("/api/v1/jobs/?page_size=3").json()
    assert len(first["results"]) == 3 and first["next"]
    second = researcher_api.get(first["next"]).json()
    assert len(second["results"]) == 2 and second["next"] is None


@pytest.mark.parametrize("name", ["FOO\n", "FOO\nrm -rf /", "foo", "A-B", "SLURM_X", "PATH"])
def test_environment_names_are_checked_whole(
    cluster: Any, researcher_api: APIClient, name: str
) -> None:
    response = researcher_api.post(
        "/api/v1/jobs/submit/", body(environment={name: "1"}), format="json"
    )
    assert response.status_code == 400, response.json()
    assert "environment" in response.json()["extra"]["fields"]
    assert not Job.objects.exists()


def test_the_script_refuses_an_environment_name_the_services_would_refuse() -> None:
    from runs.runtime import ScriptSpec, render_sbatch

    spec = ScriptSpec(
        job_id="x",
        job_name="n",
        run_dir="/r",
        trainer_dir="/t",
        python="/p",
        partition="batch",
        nodes=1,
        tasks_per_node=1,
        cpus_per_task=1,
        gpus_per_node=0,
        gpu_type="",
        memory_mb=None,
        time_limit_minutes=5,
        nodelist="",
        switches="",
        trainer_args=("train",),
        environment=(("FOO\n", "x"),),
    )
    with pytest.raises(ValueError, match="not allowed"):
        render_sbatch(spec)
