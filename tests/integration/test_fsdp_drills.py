"""FSDP on the dev cluster, end to end: a job sharded over 2 nodes writes truly sharded
checkpoints (Gantry's panel shows which rank holds which rows), a drill of one onto a single
node reshards it and passes, and a drill of a checkpoint with one rank's shard removed
fails naming that shard."""

from __future__ import annotations

from typing import Any

import pytest
from drill_damage import SHARDED_KINDS
from drill_support import checkpoint_dir, start_drill, wait_finished, wait_verdict
from rest_framework.test import APIClient

import lanes
from devcluster_support import DevCluster
from jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def run_fsdp_job(api: APIClient, *, steps: int, every: int, name: str, nodes: int = 2) -> Job:
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
                "checkpoint_keep": 20,
                "strategy": "fsdp",
            },
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    return Job.objects.get(id=response.json()["id"])


@pytest.mark.nodes(2)
def test_fsdp_job_on_two_nodes_drills_onto_one_and_a_missing_shard_is_named(
    dev_cluster_registered: Any,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
) -> None:
    worker = celery_stack["worker"]
    job = wait_finished(run_fsdp_job(researcher_api, steps=12, every=4, name="fsdp"), worker)
    assert job.acceptance["strategy"] == "fsdp" and job.acceptance["world_size"] == 2
    assert len(set(job.acceptance["nodes"])) == 2  # one rank per node
    checkpoints = {c.step: c for c in job.checkpoints.all()}
    assert sorted(checkpoints) == [4, 8, 12]
    manifest = checkpoints[4].manifest
    assert manifest["strategy"] == "fsdp" and manifest["world_size"] == 2
    sliced = [v for v in manifest["sharding"].values() if v["placement"] == "shard0"]
    assert sliced and all(sorted(s["rank"] for s in v["shards"]) == [0, 1] for v in sliced)
    panel = researcher_api.get(f"/api/v1/checkpoints/{checkpoints[4].pk}/").json()
    assert panel["strategy"] == "fsdp"
    per_rank = {r["rank"]: r for r in panel["shards_per_rank"]}
    assert per_rank[0]["slices"] == per_rank[1]["slices"] == len(sliced)
    # each rank holds about half of the model and optimizer state
    assert 0.8 < per_rank[0]["tensor_bytes"] / per_rank[1]["tensor_bytes"] < 1.25

    # One rank's shard removed from the checkpoint at step 8 (its next one, 12, intact).
    missing = next(k for k in SHARDED_KINDS if k.name == "one rank's shard missing")
    missing.apply(
        checkpoint_dir(devcluster, checkpoints[8]), checkpoint_dir(devcluster, checkpoints[12])
    )
    onto_one = start_drill(researcher_api, checkpoints[4], nodes=1)
    damaged = start_drill(researcher_api, checkpoints[8], nodes=1)

    passed = wait_verdict(onto_one, worker, timeout=300)
    assert passed.verdict == "passed", passed.reason
    evidence = passed.evidence
    assert evidence["mode"] == "tolerance" and evidence["allocation"]["world_size"] == 1
    assert evidence["checkpoint"]["strategy"] == "fsdp"
    assert evidence["allocation"]["strategy"] == "fsdp"
    # the loaded global state equals Gantry's fingerprint bit for bit, after resharding
    assert evidence["state"]["at_load"]["compared"] and evidence["state"]["at_load"]["exact"]
    assert evidence["state"]["at_end"]["step"] == 8
    # the one rank read both ranks' shards, every slice checked against Gantry's record
    (rank,) = evidence["ranks"]
    assert rank["slices_checked"] >= 2 * len(sliced)
    read = set(rank["files"]) | {part["name"] for part in rank["ranges"]}
    assert {"rank-00000-0000.bin", "rank-00001-0000.bin"} <= read

    failed = wait_verdict(damaged, worker, timeout=300)
    assert failed.verdict == "failed", failed.reason
    assert failed.reason_code == "missing_file", failed.reason
    assert "rank-00001-0000.bin" in failed.reason and "rank 1's shard" in failed.reason
    failed.checkpoint.refresh_from_db()
    assert failed.checkpoint.integrity == "failed"
