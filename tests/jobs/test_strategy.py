"""The distribution strategy (``strategy: ddp | fsdp``) on Gantry's side: the submit API and
form take it (validated by the trainer's own config validation), the job page says it, and
the checkpoint integrity panel and its API show which rank holds which slice."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from factories import (
    CheckpointFactory,
    ClusterFactory,
    GpuFactory,
    JobFactory,
    NodeFactory,
    PartitionFactory,
)
from jobs.models import Job, JobTemplate
from trainer.sharding import sharding_table

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster() -> Any:
    cluster = ClusterFactory(name="devcluster", is_default=True, default_partition="batch")
    PartitionFactory(cluster=cluster, name="batch", max_time_minutes=60, is_default=True)
    for name in ("n1", "n2"):
        node = NodeFactory(cluster=cluster, name=name, partitions=["batch"], cpus_total=2)
        GpuFactory(node=node, index=0, gpu_type="a100")
    return cluster


def _submit(api: APIClient, **config: Any) -> Any:
    body = {
        "name": "sharded",
        "partition": "batch",
        "nodes": 2,
        "gpus_per_node": 1,
        "tasks_per_node": 1,
        "time_limit_minutes": 10,
        "config": {"preset": "tiny", "steps": 20, **config},
    }
    return api.post("/api/v1/jobs/submit/", body, format="json")


def test_the_api_takes_the_strategy_and_refuses_an_unknown_one(
    cluster: Any, researcher_api: APIClient
) -> None:
    accepted = _submit(researcher_api, strategy="fsdp")
    assert accepted.status_code == 202, accepted.json()
    assert Job.objects.get(id=accepted.json()["id"]).config["strategy"] == "fsdp"
    # DDP stays the default
    default = _submit(researcher_api)
    assert Job.objects.get(id=default.json()["id"]).config["strategy"] == "ddp"
    refused = _submit(researcher_api, strategy="zero3")
    assert refused.status_code == 400
    assert "'ddp' or 'fsdp'" in refused.json()["extra"]["fields"]["config.strategy"][0]
    assert Job.objects.count() == 2


def _page(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_form_has_the_strategy_and_keeps_it(cluster: Any, researcher: Any) -> None:
    form = {
        "cluster": cluster.pk,
        "name": "from-form",
        "preset": "tiny",
        "steps": 25,
        "precision": "fp32",
        "strategy": "fsdp",
        "checkpoint_every": 5,
        "seed": 1,
        "partition": "batch",
        "nodes": 2,
        "gpus_per_node": 1,
        "gpu_type": "a100",
        "cpus_per_task": 1,
        "time_limit_minutes": 10,
        "action": "save_template",
        "save_name": "sharded",
    }
    saved = _page(researcher).post("/jobs/new/", form)
    assert saved.status_code == 302, saved.content.decode()[-2000:]
    assert JobTemplate.objects.get().settings["config"]["strategy"] == "fsdp"
    # Run again: the form comes back with FSDP chosen, not as an extra key.
    job = JobFactory(
        owner=researcher, cluster=cluster, config={"preset": "tiny", "strategy": "fsdp"}
    )
    html = _page(researcher).get(f"/jobs/new/?from_job={job.id}").content.decode()
    assert '<option value="fsdp" selected>' in html
    assert "&quot;strategy&quot;" not in html


def test_the_job_page_says_the_strategy(cluster: Any, researcher: Any) -> None:
    job = JobFactory(
        owner=researcher,
        cluster=cluster,
        nodes=2,
        tasks_per_node=1,
        config={"preset": "tiny", "strategy": "fsdp"},
        acceptance={"strategy": "fsdp"},
    )
    html = _page(researcher).get(f"/jobs/{job.id}/").content.decode()
    assert "FSDP: parameters, gradients and optimizer state sharded over the 2 ranks" in html
    ddp = JobFactory(owner=researcher, cluster=cluster, config={"preset": "tiny"})
    assert (
        "DDP: a full replica on every rank"
        in _page(researcher).get(f"/jobs/{ddp.id}/").content.decode()
    )


def _sharded_manifest() -> dict[str, Any]:
    """A 2-rank FSDP manifest as the trainer writes it: a 10-row weight in two slices, its
    AdamW step count whole on rank 0."""

    def shard(start: int, rows: int) -> dict[str, Any]:
        return {
            "placement": "shard0",
            "global_shape": [10, 4],
            "dtype": "float32",
            "start": start,
            "rows": rows,
            "nbytes": rows * 16,
        }

    step = {"placement": "whole", "global_shape": [], "dtype": "float32", "nbytes": 4}
    sidecars = [
        {"rank": 0, "shards": {"model/w": shard(0, 5), "optimizer/w/step": step}},
        {"rank": 1, "shards": {"model/w": shard(5, 5)}},
    ]
    files = [
        {"name": "rank-00000.pt", "rank": 0, "role": "index", "size": 900, "sha256": "a" * 64},
        {"name": "rank-00000-0000.bin", "rank": 0, "role": "data", "size": 84, "sha256": "b" * 64},
        {"name": "rank-00001.pt", "rank": 1, "role": "index", "size": 800, "sha256": "c" * 64},
        {"name": "rank-00001-0000.bin", "rank": 1, "role": "data", "size": 80, "sha256": "d" * 64},
    ]
    return {
        "format": "gantry-trainer-checkpoint/3",
        "strategy": "fsdp",
        "world_size": 2,
        "files": files,
        "sharding": sharding_table(sidecars),
    }


def test_the_integrity_panel_shows_which_rank_holds_which_rows(
    cluster: Any, researcher: Any, researcher_api: APIClient
) -> None:
    job = JobFactory(owner=researcher, cluster=cluster, config={"preset": "tiny"})
    checkpoint = CheckpointFactory(job=job, step=10, world_size=2, manifest=_sharded_manifest())
    html = _page(researcher).get(reverse("checkpoint", args=[job.id, 10])).content.decode()
    html = html.replace("\xa0", " ")  # filesizeformat keeps number and unit together
    assert "FSDP — each rank wrote only its own shard" in html
    assert 'id="shard-table"' in html
    # per rank: rank 0 holds one slice and the step count, rank 1 one slice
    assert '<tr data-rank="0"><td>0</td><td>2</td><td>984 bytes</td><td>1</td><td>1</td>' in html
    assert '<tr data-rank="1"><td>1</td><td>2</td><td>880 bytes</td><td>1</td><td>0</td>' in html
    assert "rank 0: rows 0–5 (80 bytes); rank 1: rows 5–10 (80 bytes)" in html
    assert "each rank reading from every rank's files only the rows it will hold" in html
    detail = researcher_api.get(f"/api/v1/checkpoints/{checkpoint.pk}/").json()
    assert detail["strategy"] == "fsdp"
    assert [
        (r["rank"], r["slices"], r["whole"], r["tensor_bytes"]) for r in detail["shards_per_rank"]
    ] == [(0, 1, 1, 84), (1, 1, 0, 80)]


def test_a_format_2_checkpoint_shows_as_ddp(
    cluster: Any, researcher: Any, researcher_api: APIClient
) -> None:
    job = JobFactory(owner=researcher, cluster=cluster, config={"preset": "tiny"})
    checkpoint = CheckpointFactory(
        job=job, step=10, manifest={"format": "gantry-trainer-checkpoint/2", "files": []}
    )
    html = _page(researcher).get(reverse("checkpoint", args=[job.id, 10])).content.decode()
    assert "DDP — rank 0 holds the model and optimizer state" in html
    assert 'id="shard-table"' not in html
    detail = researcher_api.get(f"/api/v1/checkpoints/{checkpoint.pk}/").json()
    assert detail["strategy"] == "ddp" and detail["shards_per_rank"] == []
