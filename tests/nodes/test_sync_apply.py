"""Applying an inventory to the database, from real recorded Slurm 22.05 outputs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from factories import ClusterFactory
from nodes.models import Cluster, Gpu, Node, NodeEvent, Switch
from nodes.sync import apply_inventory, sync_backoff_seconds
from slurm.parsers import (
    Inventory,
    parse_partitions,
    parse_sinfo_json,
    parse_topology,
)

DATA = Path(__file__).resolve().parents[1] / "slurm" / "data" / "slurm-22.05.8"

pytestmark = pytest.mark.django_db


def recorded_inventory(sinfo: str = "sinfo.json") -> Inventory:
    return Inventory(
        nodes=tuple(parse_sinfo_json((DATA / sinfo).read_text())),
        partitions=tuple(
            parse_partitions((DATA / "scontrol_show_partition_oneliner.txt").read_text())
        ),
        switches=tuple(parse_topology((DATA / "scontrol_show_topology.txt").read_text())),
    )


@pytest.fixture
def cluster() -> Cluster:
    return ClusterFactory(name="devcluster")


def test_idle_cluster_becomes_rows(cluster: Cluster) -> None:
    result = apply_inventory(cluster, recorded_inventory())
    assert result.ok and result.nodes_seen == 4
    assert sorted(Node.objects.values_list("name", "state")) == [
        ("n1", "idle"),
        ("n2", "idle"),
        ("n3", "idle"),
        ("n4", "idle"),
    ]
    assert Gpu.objects.filter(gpu_type="a100").count() == 4
    assert Gpu.objects.filter(gpu_type="h100").count() == 4
    assert not Gpu.objects.exclude(state="free").exists()
    assert Switch.objects.get(name="leaf1").parent.name == "spine"
    assert NodeEvent.objects.filter(kind="appeared").count() == 4


def test_busy_cluster_marks_allocated_gpus(cluster: Cluster) -> None:
    apply_inventory(cluster, recorded_inventory())
    apply_inventory(cluster, recorded_inventory("sinfo_busy.json"))
    busy_nodes = Node.objects.filter(state__in=["mixed", "allocated"])
    assert busy_nodes.exists()
    allocated = Gpu.objects.filter(state="allocated")
    assert allocated.exists()
    assert set(allocated.values_list("node__name", flat=True)) <= set(
        busy_nodes.values_list("name", flat=True)
    )
    # Each change is one state event.
    assert NodeEvent.objects.filter(kind="state").count() == busy_nodes.count()


def test_drained_node_and_its_reason(cluster: Cluster) -> None:
    apply_inventory(cluster, recorded_inventory())
    apply_inventory(cluster, recorded_inventory("sinfo_drained.json"))
    drained = Node.objects.get(state="drained")
    assert drained.reason
    event = NodeEvent.objects.get(node=drained, kind="state")
    assert (event.from_state, event.to_state) == ("idle", "drained")


def test_disappearing_node_is_marked_gone_never_deleted(cluster: Cluster) -> None:
    inventory = recorded_inventory()
    apply_inventory(cluster, inventory)
    without_n4 = dataclasses.replace(
        inventory, nodes=tuple(node for node in inventory.nodes if node.name != "n4")
    )
    result = apply_inventory(cluster, without_n4)
    n4 = Node.objects.get(name="n4")
    assert n4.state == "gone"
    assert result.state_changes == 1
    assert n4.gpus.count() == 2  # kept, for history
    # It comes back when Slurm reports it again.
    apply_inventory(cluster, inventory)
    assert Node.objects.get(name="n4").state == "idle"


def test_a_repeated_sync_writes_no_events(cluster: Cluster) -> None:
    apply_inventory(cluster, recorded_inventory())
    before = NodeEvent.objects.count()
    result = apply_inventory(cluster, recorded_inventory())
    assert result.state_changes == 0
    assert NodeEvent.objects.count() == before


def test_backoff_grows_and_is_capped() -> None:
    assert [sync_backoff_seconds(n, 30) for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert sync_backoff_seconds(20, 30) == 600
