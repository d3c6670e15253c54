"""Placement from database rows: inputs, advice, and the job page's placement check."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from factories import ClusterFactory, GpuFactory, JobFactory, NodeFactory, SwitchFactory
from jobs.placement import busy_nodes_free_at, job_placement_check
from nodes.models import Link
from nodes.placement_service import placement_advice, placement_inputs

pytestmark = pytest.mark.django_db


@pytest.fixture
def dev_shape() -> Any:
    """The dev cluster's shape: spine → leaf1 (n1, n2: batch, a100), leaf2 (n3, n4: gpu, h100)."""
    cluster = ClusterFactory(name="shape", is_default=True)
    spine = SwitchFactory(cluster=cluster, name="spine", level=1)
    leaves = {
        name: SwitchFactory(cluster=cluster, name=name, parent=spine) for name in ("leaf1", "leaf2")
    }
    nodes = {}
    for name, leaf, partition, kind in [
        ("n1", "leaf1", "batch", "a100"),
        ("n2", "leaf1", "batch", "a100"),
        ("n3", "leaf2", "gpu", "h100"),
        ("n4", "leaf2", "gpu", "h100"),
    ]:
        node = NodeFactory(
            cluster=cluster, name=name, leaf_switch=leaves[leaf], partitions=[partition]
        )
        for index in range(2):
            GpuFactory(node=node, index=index, gpu_type=kind)
        nodes[name] = node
    return cluster, nodes


def test_inputs_reflect_rows(dev_shape: Any) -> None:
    cluster, nodes = dev_shape
    n1 = nodes["n1"]
    n1.cpus_alloc, n1.memory_alloc_mb, n1.state = 1, 1500, "mixed"
    n1.save()
    gpu = n1.gpus.get(index=0)
    gpu.state = "allocated"
    gpu.save()
    gpus = list(nodes["n3"].gpus.all())
    Link.objects.create(
        cluster=cluster,
        scope="intra_node",
        kind="nvlink",
        node=nodes["n3"],
        gpu_a=gpus[0],
        gpu_b=gpus[1],
    )
    started = timezone.now() - timedelta(minutes=5)
    JobFactory(
        cluster=cluster,
        state="running",
        allocated_nodes="n1",
        started_at=started,
        time_limit_minutes=30,
    )
    infos, switches = placement_inputs(cluster, free_at=busy_nodes_free_at(cluster))
    by_name = {info.name: info for info in infos}
    assert (by_name["n1"].gpus_free, by_name["n1"].cpus_free, by_name["n1"].memory_free_mb) == (
        1,
        1,
        2500,
    )
    assert by_name["n1"].free_at == started + timedelta(minutes=30)
    assert by_name["n2"].free_at is None
    assert by_name["n3"].intra_node_link == "nvlink" and by_name["n2"].intra_node_link == "unknown"
    assert by_name["n3"].leaf_switch == "leaf2" and by_name["n3"].gpu_type == "h100"
    assert {(s.name, s.parent) for s in switches} == {
        ("spine", None),
        ("leaf1", "spine"),
        ("leaf2", "spine"),
    }


def test_advice_for_two_by_one_is_one_leaf(dev_shape: Any) -> None:
    cluster, _nodes = dev_shape
    advice = placement_advice(cluster=cluster, partition="batch", nodes=2, gpus_per_node=1)
    assert advice.feasible and advice.nodelist == "n[1-2]"
    assert advice.switches_spanned == ("leaf1",)
    assert advice.to_sbatch_args() == ["--nodelist=n[1-2]", "--switches=1@10"]
    assert "under leaf1" in advice.explanation


def test_advice_never_proposes_drained_nodes(dev_shape: Any) -> None:
    cluster, nodes = dev_shape
    nodes["n1"].state = "drained"
    nodes["n1"].save()
    advice = placement_advice(cluster=cluster, partition="batch", nodes=1, gpus_per_node=1)
    assert advice.nodes == ("n2",)
    refused = placement_advice(cluster=cluster, partition="batch", nodes=2, gpus_per_node=1)
    assert not refused.feasible and refused.explanation.startswith("No placement")


def test_job_check_matches_and_flags(dev_shape: Any, client: Client, researcher: Any) -> None:
    cluster, _nodes = dev_shape
    matched = JobFactory(
        owner=researcher,
        cluster=cluster,
        nodes=2,
        gpus_per_node=1,
        partition="batch",
        nodelist_requested="n[1-2]",
        switches_requested="1@10",
        allocated_nodes="n[1-2]",
        state="running",
    )
    check = job_placement_check(matched)
    assert check is not None and check.matches_request and not check.flagged
    assert check.summary == "n[1-2] under leaf1 (1 switch) — matches the advice"
    # Two h100 nodes of partition gpu could have shared leaf2; n2 + n3 cross the spine.
    spread = JobFactory(
        owner=researcher,
        cluster=cluster,
        nodes=2,
        partition="",
        allocated_nodes="n2,n3",
        state="running",
    )
    flagged = job_placement_check(spread)
    assert flagged is not None and flagged.flagged
    assert "spans 3 switches; 1 was possible" in flagged.summary
    assert job_placement_check(JobFactory(cluster=cluster)) is None

    client.force_login(researcher)
    page = client.get(f"/jobs/{matched.id}/status/").content.decode()
    assert "matches the advice" in page and "placement-flag" not in page
    page = client.get(f"/jobs/{spread.id}/status/").content.decode()
    assert "placement-flag" in page and "1 was possible" in page
    topology = client.get(f"/topology/?job={matched.id}").content.decode()
    assert topology.count("topo-node node state-border-idle highlight") == 2
    assert 'data-highlight="1"' in topology


def test_preview_api_returns_placement_and_submit_applies_it(
    dev_shape: Any, researcher_api: Any
) -> None:
    from factories import PartitionFactory

    cluster, _nodes = dev_shape
    PartitionFactory(cluster=cluster, name="batch")
    body = {
        "name": "p",
        "partition": "batch",
        "nodes": 2,
        "gpus_per_node": 1,
        "config": {"preset": "tiny", "steps": 5},
    }
    preview = researcher_api.post("/api/v1/jobs/preview/", body, format="json")
    assert preview.status_code == 200, preview.json()
    placement = preview.json()["placement"]
    assert placement["nodelist"] == "n[1-2]" and placement["switches_spanned"] == ["leaf1"]
    assert not placement["applied"] and "--nodelist" not in preview.json()["script"]
    applied = researcher_api.post(
        "/api/v1/jobs/preview/", {**body, "use_placement_advice": True}, format="json"
    ).json()
    assert applied["placement"]["applied"]
    assert "--nodelist=n[1-2]" in applied["script"] and "--switches=1@10" in applied["script"]
    # No worker here: on_commit never runs in this (rolled back) test transaction.
    submitted = researcher_api.post(
        "/api/v1/jobs/submit/", {**body, "use_placement_advice": True}, format="json"
    )
    assert submitted.status_code == 202
    from jobs.models import Job

    job = Job.objects.get(id=submitted.json()["id"])
    assert (job.nodelist_requested, job.switches_requested) == ("n[1-2]", "1@10")
