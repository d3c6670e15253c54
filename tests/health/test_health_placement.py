"""Placement avoids a node whose GPU health is critical, prefers ok over warning, and treats
never-probed nodes as neutral (a cluster that never probed still gets advice)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from factories import GpuFactory, NodeFactory, SwitchFactory
from health.services import probe_record
from nodes.placement import NodeInfo, PlacementRequest, propose_placement
from nodes.placement_service import placement_advice

NOW = datetime(2030, 5, 6, 12, 0, tzinfo=UTC)


def info(name: str, health: str = "unknown") -> NodeInfo:
    return NodeInfo(
        name, "idle", ("batch",), "leaf1", "a100", 2, 2, 16, 16, 64_000, 64_000, health=health
    )


def test_critical_is_never_proposed_and_says_why() -> None:
    placement = propose_placement(
        [info("n1", "critical"), info("n2")], [], PlacementRequest(nodes=1, gpus_per_node=2)
    )
    assert placement.nodes == ("n2",)
    assert "n1: GPU health critical" in placement.reasons
    nothing = propose_placement(
        [info("n1", "critical")], [], PlacementRequest(nodes=1, gpus_per_node=2)
    )
    assert not nothing.feasible and "GPU-unhealthy" in nothing.explanation


def test_warning_is_used_only_when_nothing_healthier_does() -> None:
    request = PlacementRequest(nodes=1, gpus_per_node=2)
    assert propose_placement([info("n1", "warning"), info("n2", "ok")], [], request).nodes == (
        "n2",
    )
    assert propose_placement([info("n1", "warning")], [], request).nodes == ("n1",)
    # Never probed is neutral: the name order decides between ok and unknown.
    assert propose_placement([info("n1"), info("n2", "ok")], [], request).nodes == ("n1",)


@pytest.mark.django_db
def test_advice_from_the_inventory_avoids_the_node_a_probe_found_critical(
    document: Callable[..., dict[str, Any]],
) -> None:
    switch = SwitchFactory(name="leaf1")
    n1 = NodeFactory(cluster=switch.cluster, name="n1", leaf_switch=switch)
    n2 = NodeFactory(cluster=switch.cluster, name="n2", leaf_switch=switch)
    for node in (n1, n2):
        GpuFactory(node=node, index=0)
        GpuFactory(node=node, index=1)
    ask = {"cluster": switch.cluster, "partition": "batch", "nodes": 1, "gpus_per_node": 2}
    # Never probed: both neutral, n1 first by name.
    assert placement_advice(**ask).nodes == ("n1",)
    probe_record(node=n1, document=document("derived/a100-ecc-uncorrectable.xml"), now=NOW)
    advice = placement_advice(**ask)
    assert advice.nodes == ("n2",)
    assert "n1: GPU health critical" in advice.reasons
