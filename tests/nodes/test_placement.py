"""Placement advice: examples on the dev cluster's shape, counterexamples to greedy
shortcuts, and property tests against brute force on small random trees."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodes.placement import (
    NodeInfo,
    Placement,
    PlacementRequest,
    SwitchInfo,
    placement_quality,
    propose_placement,
)
from slurm.hostlist import expand, natural_key

NOON = datetime(2030, 5, 6, 12, 0, tzinfo=UTC)


def node(
    name: str,
    leaf: str | None,
    *,
    state: str = "idle",
    partitions: tuple[str, ...] = ("batch",),
    gpu_type: str | None = "a100",
    gpus: int = 2,
    gpus_free: int | None = None,
    cpus: int = 16,
    cpus_free: int | None = None,
    memory_mb: int = 64_000,
    memory_free_mb: int | None = None,
    link: str = "unknown",
    free_at: datetime | None = None,
) -> NodeInfo:
    return NodeInfo(
        name=name,
        state=state,
        partitions=partitions,
        leaf_switch=leaf,
        gpu_type=gpu_type,
        gpus_total=gpus,
        gpus_free=gpus if gpus_free is None else gpus_free,
        cpus_total=cpus,
        cpus_free=cpus if cpus_free is None else cpus_free,
        memory_mb=memory_mb,
        memory_free_mb=memory_mb if memory_free_mb is None else memory_free_mb,
        intra_node_link=link,
        free_at=free_at,
    )


DEV_SWITCHES = (
    SwitchInfo("spine", None, 1),
    SwitchInfo("leaf1", "spine", 0),
    SwitchInfo("leaf2", "spine", 0),
)


def dev_nodes(**changes: dict[str, object]) -> list[NodeInfo]:
    """The devcluster: leaf1 = n1,n2 (a100×2, batch); leaf2 = n3,n4 (h100×2, gpu)."""
    nodes = [
        node("n1", "leaf1"),
        node("n2", "leaf1"),
        node("n3", "leaf2", partitions=("gpu",), gpu_type="h100"),
        node("n4", "leaf2", partitions=("gpu",), gpu_type="h100"),
    ]
    return [dataclasses.replace(n, **changes.get(n.name, {})) for n in nodes]  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# The dev cluster


def test_two_nodes_in_batch_share_leaf1_and_become_slurm_options() -> None:
    placement = propose_placement(dev_nodes(), DEV_SWITCHES, PlacementRequest(2, 1, "batch"))

    assert placement.feasible
    assert placement.nodes == ("n1", "n2")
    assert placement.nodelist == "n[1-2]"
    assert placement.switches_spanned == ("leaf1",)
    assert placement.leaves == ("leaf1",)
    assert placement.lowest_common_switch == "leaf1"
    assert placement.optimal_switch_count == 1
    assert placement.slurm_options == {"nodelist": "n[1-2]", "switches": "1@10"}
    assert placement.to_sbatch_args() == ["--nodelist=n[1-2]", "--switches=1@10"]
    assert placement.explanation.startswith("2 idle nodes under leaf1 (n[1-2]), 1 × a100 each")
    assert "one leaf switch, so all-reduce traffic stays off spine" in placement.explanation
    assert placement.reasons == ("n[3-4]: partition gpu, not batch",)


def test_two_h100_nodes_in_gpu_partition() -> None:
    request = PlacementRequest(2, 2, partition="gpu", gpu_type="h100", max_wait_minutes=30)
    placement = propose_placement(dev_nodes(), DEV_SWITCHES, request)

    assert placement.nodes == ("n3", "n4")
    assert placement.to_sbatch_args() == ["--nodelist=n[3-4]", "--switches=1@30"]
    assert "2 × h100 each" in placement.explanation


def test_one_node_when_n1_is_drained_is_n2() -> None:
    nodes = dev_nodes(n1={"state": "drained"})
    placement = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(1, 2, "batch"))

    assert placement.nodes == ("n2",)
    assert "n1: drained" in placement.reasons


def test_drained_node_is_never_waited_for() -> None:
    nodes = dev_nodes(n2={"state": "drained", "free_at": NOON})
    placement = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(2, 1, "batch"))

    assert not placement.feasible
    assert placement.nodes == () and placement.nodelist == ""
    assert placement.slurm_options == {} and placement.to_sbatch_args() == []
    assert "n2: drained" in placement.reasons
    assert "only 1 node in partition batch" in placement.explanation
    assert "that can hold 1 GPU is up" in placement.explanation


def test_three_nodes_across_partitions_cross_the_spine() -> None:
    placement = propose_placement(dev_nodes(), DEV_SWITCHES, PlacementRequest(3, 1))

    assert placement.feasible
    assert placement.nodes == ("n1", "n2", "n3")
    assert placement.switches_spanned == ("leaf1", "leaf2", "spine")
    assert placement.leaves == ("leaf1", "leaf2")
    assert placement.lowest_common_switch == "spine"
    assert placement.optimal_switch_count == 3
    assert placement.slurm_options["switches"] == "2@10"
    assert "no single leaf has 3 usable nodes" in placement.explanation
    assert "crosses spine" in placement.explanation


def test_nvlink_node_is_preferred_over_pcie_within_a_leaf() -> None:
    nodes = dev_nodes(n1={"intra_node_link": "pcie"}, n2={"intra_node_link": "nvlink"})
    placement = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(1, 2, "batch"))

    assert placement.nodes == ("n2",)
    assert "NVLink inside each node" in placement.explanation


def test_nvlink_is_preferred_across_leaves_too() -> None:
    switches = [*DEV_SWITCHES, SwitchInfo("leaf3", "spine", 0)]
    nodes = [
        node("n1", "leaf1", link="pcie"),
        node("n2", "leaf2", link="nvlink"),
        node("n3", "leaf3", link="nvlink"),
    ]
    placement = propose_placement(nodes, switches, PlacementRequest(2, 1))

    # Every pair spans 3 switches; only n2 + n3 avoids PCIe.
    assert placement.nodes == ("n2", "n3")
    assert placement.switches_spanned == ("leaf2", "leaf3", "spine")


def test_fewer_switches_come_before_an_earlier_start() -> None:
    later = NOON + timedelta(hours=2)
    nodes = [
        node("n1", "leaf1"),
        node("n2", "leaf1", state="allocated", gpus_free=0, free_at=later),
        node("n3", "leaf2", state="completing", gpus_free=0, free_at=NOON),
    ]
    placement = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(2, 1))

    assert placement.nodes == ("n1", "n2")
    assert placement.waits_for == ("n2",)
    assert placement.starts_at == later


def test_among_waits_the_earliest_free_node_is_taken() -> None:
    nodes = [
        node("n1", "leaf1"),
        node("n2", "leaf1", state="allocated", gpus_free=0, free_at=NOON + timedelta(hours=1)),
        node("n3", "leaf1", state="mixed", gpus_free=0, free_at=NOON),
    ]
    placement = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(2, 1))

    assert placement.nodes == ("n1", "n3")
    assert placement.starts_at == NOON


def test_busy_node_is_waited_for_only_when_needed() -> None:
    busy = {"state": "allocated", "gpus_free": 0, "cpus_free": 0, "free_at": NOON}
    nodes = dev_nodes(n4=busy)
    one = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(1, 2, "gpu"))
    two = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(2, 2, "gpu"))

    assert one.nodes == ("n3",) and one.waits_for == () and one.starts_at is None
    assert "n4: busy (allocated); not waited for, enough nodes are free now" in one.reasons
    assert two.nodes == ("n3", "n4")
    assert two.waits_for == ("n4",)
    assert two.starts_at == NOON
    assert two.explanation.startswith("2 nodes under leaf2 (n[3-4])")
    assert "n4 is busy and expected free at 2030-05-06 12:00 UTC" in two.explanation
    assert "waits for it" in two.explanation


def test_busy_node_without_free_time_or_when_waiting_is_not_allowed() -> None:
    busy = {"state": "allocated", "gpus_free": 0}
    no_time = propose_placement(dev_nodes(n4=busy), DEV_SWITCHES, PlacementRequest(2, 2, "gpu"))
    not_allowed = propose_placement(
        dev_nodes(n4={**busy, "free_at": NOON}),
        DEV_SWITCHES,
        PlacementRequest(2, 2, "gpu", allow_wait=False),
    )

    assert not no_time.feasible
    assert "n4: allocated, no expected free time" in no_time.reasons
    assert not not_allowed.feasible
    assert any(r.startswith("n4:") and "waiting not allowed" in r for r in not_allowed.reasons)


def test_mixed_node_with_too_few_free_gpus_is_excluded_with_the_count() -> None:
    nodes = dev_nodes(n2={"state": "mixed", "gpus_free": 1})
    placement = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(2, 2, "batch"))

    assert not placement.feasible
    assert "n2: only 1 free GPU of type a100 (needs 2)" in placement.reasons
    assert "only 1 node in partition batch has 2 GPUs free" in placement.explanation


def test_cpus_per_gpu_excludes_thin_nodes_even_when_free() -> None:
    nodes = dev_nodes(n1={"cpus_total": 4, "cpus_free": 4})
    placement = propose_placement(
        nodes, DEV_SWITCHES, PlacementRequest(1, 1, "batch", cpus_per_gpu=4)
    )

    # n1 has 4 free CPUs — enough for 1 GPU × 4 — but 2 CPUs per GPU overall.
    assert placement.nodes == ("n2",)
    assert "n1: 2 CPUs per GPU (needs 4)" in placement.reasons


def test_free_cpus_and_memory_per_node_must_cover_the_request() -> None:
    nodes = dev_nodes(
        n1={"state": "mixed", "cpus_free": 2},
        n3={"memory_free_mb": 1_000},
    )
    cpus = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(1, 1, "batch", cpus_per_gpu=4))
    memory = propose_placement(
        nodes, DEV_SWITCHES, PlacementRequest(1, 1, "gpu", memory_mb_per_node=2_000)
    )

    assert cpus.nodes == ("n2",)
    assert "n1: only 2 free CPUs (needs 4)" in cpus.reasons
    assert memory.nodes == ("n4",)
    assert "n3: only 1000 MB free memory (needs 2000)" in memory.reasons


def test_exact_fit_is_preferred_to_leave_bigger_nodes_whole() -> None:
    nodes = [node("n1", "leaf1", gpus=8), node("n2", "leaf1", gpus=4), node("n3", "leaf1")]
    placement = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(1, 2))

    assert placement.nodes == ("n3",)


def test_explanation_names_the_gpu_type_when_nothing_has_it() -> None:
    placement = propose_placement(
        dev_nodes(), DEV_SWITCHES, PlacementRequest(4, 2, partition="gpu", gpu_type="h100")
    )

    assert not placement.feasible
    assert placement.explanation == (
        "No placement: only 2 nodes in partition gpu have h100 GPUs; 4 requested."
    )


def test_no_topology_picks_by_other_criteria_and_omits_switches() -> None:
    nodes = [
        node("n10", None, link="nvlink"),
        node("n2", None, link="pcie"),
        node("n3", None, link="nvlink"),
    ]
    placement = propose_placement(nodes, [], PlacementRequest(2, 1))

    assert placement.nodes == ("n3", "n10")
    assert placement.slurm_options == {"nodelist": "n[3,10]"}
    assert placement.switches_spanned == () and not placement.topology_known
    assert "no topology known" in placement.explanation


def test_nodes_without_a_leaf_switch_are_a_last_resort_when_topology_exists() -> None:
    nodes = [node("n1", None), node("n2", "leaf1"), node("n3", "leaf1")]
    placement = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(2, 1))
    three = propose_placement(nodes, DEV_SWITCHES, PlacementRequest(3, 1))

    assert placement.nodes == ("n2", "n3")
    assert three.feasible and three.optimal_switch_count == len(three.switches_spanned)
    assert "(no switch: n1)" in three.switches_spanned


def test_leaf_switch_names_alone_are_a_topology() -> None:
    nodes = [node("n1", "a"), node("n2", "b"), node("n3", "b")]
    placement = propose_placement(nodes, [], PlacementRequest(2, 1))

    assert placement.nodes == ("n2", "n3")
    assert placement.slurm_options == {"nodelist": "n[2-3]", "switches": "1@10"}


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        propose_placement([node("n1", "leaf1"), node("n1", "leaf1")], [], PlacementRequest(1, 1))
    with pytest.raises(ValueError, match="cycle"):
        propose_placement(
            [node("n1", "a")],
            [SwitchInfo("a", "b", 0), SwitchInfo("b", "a", 1)],
            PlacementRequest(1, 1),
        )
    with pytest.raises(ValueError, match="nodes must be at least 1"):
        PlacementRequest(0, 1)


# ---------------------------------------------------------------------------
# Where simple rules go wrong


def tree(
    spec: dict[str, dict[str, int]], *, root: str = "spine"
) -> tuple[list[NodeInfo], list[SwitchInfo]]:
    """``{"agg1": {"l1": 3, ...}}`` -> idle nodes on leaves under aggregation switches."""
    switches = [SwitchInfo(root, None, 2)]
    nodes: list[NodeInfo] = []
    for aggregation, leaves in spec.items():
        switches.append(SwitchInfo(aggregation, root, 1))
        for leaf, count in leaves.items():
            switches.append(SwitchInfo(leaf, aggregation, 0))
            nodes += [node(f"{leaf}n{i}", leaf) for i in range(count)]
    return nodes, switches


def test_fewest_leaves_is_not_fewest_switches() -> None:
    # 20 nodes: four 5-node leaves (4 leaves + 4 aggregation switches + spine = 9)
    # lose to four 4-node leaves under a1 and a fifth 4-node leaf under a2 (5 + 2 + 1 = 8).
    nodes, switches = tree(
        {
            "a1": {"c1": 4, "c2": 4, "c3": 4, "c4": 4},
            "a2": {"c5": 4},
            "b1": {"d1": 5},
            "b2": {"d2": 5},
            "b3": {"d3": 5},
            "b4": {"d4": 5},
        }
    )
    placement = propose_placement(nodes, switches, PlacementRequest(20, 1))

    assert placement.optimal_switch_count == 8
    assert len(placement.switches_spanned) == 8
    # All of a1's leaves plus one more leaf (c5, or a d leaf: also 8 switches).
    assert len(placement.leaves) == 5
    assert {"c1", "c2", "c3", "c4"} <= set(placement.leaves)


def test_lowest_switch_with_enough_nodes_is_not_fewest_switches() -> None:
    # a1's subtree alone holds 6 nodes on 6 leaves (7 switches); two 3-node leaves
    # under different aggregation switches span only 5.
    nodes, switches = tree({"a1": {f"l{i}": 1 for i in range(6)}, "b1": {"m1": 3}, "b2": {"m2": 3}})
    placement = propose_placement(nodes, switches, PlacementRequest(6, 1))

    assert placement.leaves == ("m1", "m2")
    assert placement.switches_spanned == ("m1", "m2", "b1", "b2", "spine")


# ---------------------------------------------------------------------------
# placement_quality


def test_quality_flags_two_leaves_when_one_would_do() -> None:
    check = placement_quality(["n1", "n3"], dev_nodes(), DEV_SWITCHES, PlacementRequest(2, 1))

    assert check.switches_spanned == ("leaf1", "leaf2", "spine")
    assert check.leaves == ("leaf1", "leaf2")
    assert check.optimal_switch_count == 1
    assert check.more_switches_than_necessary
    assert "1 would have done" in check.explanation


def test_quality_does_not_flag_one_leaf_or_a_forced_spread() -> None:
    busy_now = dev_nodes(n2={"state": "allocated", "gpus_free": 0})
    one_leaf = placement_quality(["n2", "n1"], busy_now, DEV_SWITCHES, None)
    # Partition batch only has leaf1's nodes; 3 nodes of any partition need both leaves.
    spread = placement_quality(["n1", "n2", "n3"], dev_nodes(), DEV_SWITCHES, None)

    assert one_leaf.nodes == ("n1", "n2")
    assert one_leaf.switches_spanned == ("leaf1",)
    assert not one_leaf.more_switches_than_necessary
    assert one_leaf.optimal_switch_count == 1
    assert not spread.more_switches_than_necessary
    assert spread.optimal_switch_count == 3


def test_quality_respects_partition_and_ignores_drained_nodes() -> None:
    nodes = dev_nodes(n2={"state": "drained"}, n4={"partitions": ("batch",)})
    # In batch, leaf1 holds only n1 now that n2 is drained: n1 + n4 is the best there is.
    check = placement_quality(["n1", "n4"], nodes, DEV_SWITCHES, PlacementRequest(2, 1, "batch"))

    assert check.optimal_switch_count == 3
    assert not check.more_switches_than_necessary


def test_quality_without_topology() -> None:
    check = placement_quality(["n1", "n2"], [node("n1", None), node("n2", None)], [], None)

    assert check.optimal_switch_count is None
    assert not check.more_switches_than_necessary
    assert "no topology known" in check.explanation


# ---------------------------------------------------------------------------
# A big cluster: the result, not the time (bench/placement_bench.py times it)


def big_cluster(idle: dict[str, int], default_idle: int) -> tuple[list[NodeInfo], list[SwitchInfo]]:
    """10,000 nodes, 20 per leaf, 500 leaves, 25 aggregation switches of 20 leaves, a spine."""
    switches = [SwitchInfo("spine", None, 2)]
    nodes: list[NodeInfo] = []
    for a in range(25):
        switches.append(SwitchInfo(f"agg{a:02d}", "spine", 1))
        for l in range(20):  # noqa: E741
            leaf = f"leaf{a * 20 + l:03d}"
            switches.append(SwitchInfo(leaf, f"agg{a:02d}", 0))
            free = idle.get(leaf, default_idle)
            for i in range(20):
                name = f"gpu{(a * 20 + l) * 20 + i:05d}"
                state = "idle" if i < free else "allocated"
                nodes.append(node(name, leaf, state=state, gpus=8, gpus_free=8 if i < free else 0))
    return nodes, switches


def test_ten_thousand_nodes_one_leaf_when_one_leaf_has_room() -> None:
    nodes, switches = big_cluster({"leaf317": 16}, default_idle=10)
    placement = propose_placement(nodes, switches, PlacementRequest(16, 8))

    assert placement.leaves == ("leaf317",)
    assert placement.nodelist == "gpu[06340-06355]"
    assert placement.optimal_switch_count == 1


def test_ten_thousand_nodes_two_leaves_under_one_aggregation_switch() -> None:
    # leaf140 (16) + leaf141 (14) under agg07 is the only pair of leaves with 30.
    nodes, switches = big_cluster({"leaf140": 16, "leaf141": 14}, default_idle=10)
    placement = propose_placement(nodes, switches, PlacementRequest(30, 8))

    assert placement.switches_spanned == ("leaf140", "leaf141", "agg07")
    assert placement.optimal_switch_count == 3


def test_ten_thousand_nodes_a_thousand_node_job() -> None:
    nodes, switches = big_cluster({}, default_idle=20)
    placement = propose_placement(nodes, switches, PlacementRequest(1000, 8))

    # 400 nodes per aggregation switch: 3 of them, 50 full leaves, and the spine.
    assert placement.optimal_switch_count == 54
    assert len(placement.switches_spanned) == 54
    assert len(placement.leaves) == 50
    assert len(expand(placement.nodelist)) == 1000


# ---------------------------------------------------------------------------
# Properties against brute force

HEALTHY_NOW = {"idle", "mixed"}
WAITABLE = {"allocated", "mixed", "completing"}
STATES = ["idle", "idle", "idle", "mixed", "allocated", "completing", "drained", "draining",
          "down", "fail", "reserved", "future", "unknown", "gone"]  # fmt: skip
LINK_RANK = {"nvlink": 0, "pcie": 1, "unknown": 2}


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeInfo], list[SwitchInfo], PlacementRequest]:
    levels = draw(st.integers(0, 3))
    switches: list[SwitchInfo] = []
    if levels == 1:
        switches = [SwitchInfo("s", None, 0)]
    elif levels == 2:
        switches = [SwitchInfo("spine", None, 1)]
        switches += [SwitchInfo(f"l{i}", "spine", 0) for i in range(draw(st.integers(1, 4)))]
    elif levels == 3:
        switches = [SwitchInfo("spine", None, 2)]
        for a in range(draw(st.integers(1, 3))):
            switches.append(SwitchInfo(f"a{a}", "spine", 1))
            for i in range(draw(st.integers(1, 3))):
                switches.append(SwitchInfo(f"a{a}l{i}", f"a{a}", 0))
    attach_to = [s.name for s in switches if s.level == 0] or [None]
    anywhere = [s.name for s in switches]
    nodes = []
    for i in range(draw(st.integers(1, 9))):
        if switches and draw(st.integers(0, 9)) == 0:
            # Now and then a node without a leaf, or hanging off a higher switch.
            leaf = draw(st.sampled_from([None, *anywhere]))
        else:
            leaf = draw(st.sampled_from(attach_to))
        gpus = draw(st.integers(0, 4))
        cpus = draw(st.sampled_from([4, 8, 16]))
        state = draw(st.sampled_from(STATES))
        free_at = draw(st.none() | st.integers(0, 3).map(lambda h: NOON + timedelta(hours=h)))
        nodes.append(
            node(
                f"n{i + 1}",
                leaf,
                state=state,
                partitions=draw(st.sampled_from([("a",), ("b",), ("a", "b")])),
                gpu_type=draw(st.sampled_from(["x", "y"])),
                gpus=gpus,
                gpus_free=draw(st.integers(0, gpus)),
                cpus=cpus,
                cpus_free=draw(st.integers(0, cpus)),
                link=draw(st.sampled_from(["nvlink", "pcie", "unknown"])),
                free_at=free_at,
            )
        )
    request = PlacementRequest(
        nodes=draw(st.integers(1, 4)),
        gpus_per_node=draw(st.integers(0, 3)),
        partition=draw(st.sampled_from([None, "a", "b"])),
        gpu_type=draw(st.sampled_from([None, "x"])),
        cpus_per_gpu=draw(st.sampled_from([None, 2.0, 4.0])),
        allow_wait=draw(st.booleans()),
    )
    return nodes, switches, request


def pools(
    nodes: Sequence[NodeInfo], request: PlacementRequest
) -> tuple[list[NodeInfo], list[NodeInfo]]:
    """(usable now, could be waited for), written out independently of the module."""
    gpus, cpus = request.gpus_per_node, (request.cpus_per_gpu or 0) * request.gpus_per_node
    now, later = [], []
    for n in nodes:
        if request.partition and request.partition not in n.partitions:
            continue
        if request.gpu_type and n.gpu_type != request.gpu_type:
            continue
        if n.gpus_total < gpus or n.cpus_total < cpus:
            continue
        if (
            request.cpus_per_gpu
            and n.gpus_total
            and n.cpus_total < request.cpus_per_gpu * n.gpus_total
        ):
            continue
        if n.state in HEALTHY_NOW and n.gpus_free >= gpus and n.cpus_free >= cpus:
            now.append(n)
        elif n.state in WAITABLE and n.free_at is not None and request.allow_wait:
            later.append(n)
    return now, later


def switch_count(chosen: Sequence[NodeInfo], switches: Sequence[SwitchInfo]) -> int:
    """Switches on the paths from each used leaf to their lowest common ancestor."""
    parent = {s.name: s.parent for s in switches}

    def path(n: NodeInfo) -> list[str]:
        if n.leaf_switch is None:
            return [f"?{n.name}", "<root>"]
        steps = [n.leaf_switch]
        while parent.get(steps[-1]):
            steps.append(parent[steps[-1]])  # type: ignore[arg-type]
        return [*steps, "<root>"]

    paths = {tuple(path(n)) for n in chosen}
    if len(paths) == 1:
        return 1
    common = set.intersection(*(set(p) for p in paths))
    used: set[str] = set()
    for p in paths:
        for switch in p:
            used.add(switch)
            if switch in common:
                break
    return len(used)


def rank(n: NodeInfo, waits: bool, request: PlacementRequest) -> tuple[int, float, int, int]:
    free = n.gpus_total if waits else n.gpus_free
    moment = n.free_at.timestamp() if waits and n.free_at else 0.0
    return (int(waits), moment, LINK_RANK[n.intra_node_link], free - request.gpus_per_node)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_properties_against_brute_force(
    case: tuple[list[NodeInfo], list[SwitchInfo], PlacementRequest],
) -> None:
    nodes, switches, request = case
    placement = propose_placement(nodes, switches, request)
    now, later = pools(nodes, request)
    need = request.nodes

    # Feasible iff enough nodes qualify; waiting only when the idle ones are too few.
    pool = now if len(now) >= need else now + later
    assert placement.feasible == (len(pool) >= need)
    if not placement.feasible:
        assert placement.nodes == () and placement.to_sbatch_args() == []
        return
    by_name = {n.name: n for n in nodes}
    chosen = [by_name[name] for name in placement.nodes]
    assert len(set(placement.nodes)) == need
    assert {n.name for n in chosen} <= {n.name for n in pool}
    assert set(placement.waits_for) == {n.name for n in chosen if n in later}
    assert not placement.waits_for or len(now) < need
    assert all(by_name[name].state in WAITABLE for name in placement.waits_for)
    assert sorted(expand(placement.nodelist), key=natural_key) == list(placement.nodes)
    assert list(placement.nodes) == sorted(placement.nodes, key=natural_key)

    topology = bool(switches) or any(n.leaf_switch for n in nodes)
    combos = list(itertools.combinations(pool, need))
    if topology:
        best = min(switch_count(combo, switches) for combo in combos)
        assert switch_count(chosen, switches) == best
        assert len(placement.switches_spanned) == best == placement.optimal_switch_count
        assert placement.slurm_options["switches"] == f"{len(placement.leaves)}@10"
        optimal = [c for c in combos if switch_count(c, switches) == best]
    else:
        assert placement.switches_spanned == () and "switches" not in placement.slurm_options
        optimal = combos
    # Among optimal placements, the worst node is the best possible one: nobody waits
    # when an optimal placement avoids it, the start is earliest, then the link, then fit.
    worst = max(rank(n, n in later, request) for n in chosen)
    assert worst == min(max(rank(n, n in later, request) for n in c) for c in optimal)
    if placement.waits_for:
        assert placement.starts_at == max(by_name[w].free_at for w in placement.waits_for)  # type: ignore[type-var]


@settings(max_examples=200, deadline=None)
@given(clusters(), st.randoms(use_true_random=False))
def test_same_answer_for_any_input_order(
    case: tuple[list[NodeInfo], list[SwitchInfo], PlacementRequest], shuffler: random.Random
) -> None:
    nodes, switches, request = case
    expected = propose_placement(nodes, switches, request)
    shuffled_nodes, shuffled_switches = list(nodes), list(switches)
    shuffler.shuffle(shuffled_nodes)
    shuffler.shuffle(shuffled_switches)

    assert propose_placement(shuffled_nodes, shuffled_switches, request) == expected
    actual = list(expected.nodes) or [n.name for n in nodes[: request.nodes]]
    assert placement_quality(actual, shuffled_nodes, shuffled_switches, request) == (
        placement_quality(actual, nodes, switches, request)
    )


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_quality_never_flags_a_proposal_built_from_all_healthy_nodes(
    case: tuple[list[NodeInfo], list[SwitchInfo], PlacementRequest],
) -> None:
    nodes, switches, request = case
    # With every healthy node idle, the proposal is the optimum placement_quality measures.
    idle = [
        dataclasses.replace(n, state="idle", gpus_free=n.gpus_total, cpus_free=n.cpus_total)
        if n.state in HEALTHY_NOW | WAITABLE
        else n
        for n in nodes
    ]
    placement = propose_placement(idle, switches, request)
    if not placement.feasible:
        return
    check = placement_quality(placement.nodes, nodes, switches, request)

    assert not check.more_switches_than_necessary
    if placement.topology_known:
        assert check.optimal_switch_count == placement.optimal_switch_count
        assert check.switches_spanned == placement.switches_spanned


def test_placement_is_a_value() -> None:
    placement = propose_placement(dev_nodes(), DEV_SWITCHES, PlacementRequest(1, 1))

    assert isinstance(placement, Placement)
    with pytest.raises(dataclasses.FrozenInstanceError):
        placement.nodes = ("n9",)  # type: ignore[misc]
