"""Acceptance runs through the real lifecycle and state machine (steps end from exit
records, their files read back as a real step writes them): tiers in order and the early
stop, the certificate equal to the inventory, isolation steps recorded with evidence, a
convicted node avoided by placement."""

from __future__ import annotations

from typing import Any

import pytest
from acceptance_support import (
    LoginNode,
    a100_cluster,
    drive,
    finish_inventory,
)

from acceptance.models import AcceptanceRun, AcceptanceStep, BusbwThreshold, Certificate
from acceptance.services import RunRequest, acceptance_run_cancel, acceptance_run_start
from core.models import AuditEvent
from nodes.models import Cluster, Node
from nodes.placement import PlacementRequest, propose_placement
from nodes.placement_service import placement_inputs

pytestmark = pytest.mark.django_db
GB = 1e9


@pytest.fixture
def cluster() -> Cluster:
    cluster = a100_cluster()
    for level in ("node", "leaf", "spine"):
        BusbwThreshold.objects.create(cluster=cluster, level=level, busbw=5 * GB)
    return cluster


def _start(operator: Any, cluster: Cluster, tiers: list[str] | None = None) -> AcceptanceRun:
    request = RunRequest(cluster_id=cluster.pk, scope="partition", value="train")
    if tiers is not None:
        request.tiers = tiers
    return acceptance_run_start(actor=operator, request=request)


def healthy(group: tuple[str, ...]) -> float:
    return 10 * GB


def test_tiers_run_in_order_and_a_failing_stack_stops_the_run(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    run = _start(operator, cluster)
    assert run.state == "running" and run.current_tier == "inventory"
    # Only the first tier's step exists: nothing else runs before it is judged.
    assert list(run.steps.values_list("tier", "nodes")) == [("inventory", ["n1", "n2", "n3", "n4"])]
    other_torch = {"python": "3.11.7", "kernel": "6.1.0", "torch": "2.5.1", "torch_cuda": "12.4"}
    finish_inventory(run, login_node, {"n3": other_torch})
    run.refresh_from_db()
    assert (run.state, run.verdict) == ("finished", "failed")
    assert "n3: stack torch is 2.5.1 (the others: 2.4.0)" in run.reason
    assert run.convicted == ["n3"]
    assert not run.steps.filter(tier="collectives").exists()
    assert Node.objects.get(cluster=cluster, name="n3").acceptance_state == "convicted"
    # The probe also went where the health app keeps stacks.
    assert Node.objects.get(cluster=cluster, name="n3").health.stack["torch"] == "2.5.1"
    certificate = Certificate.objects.get(run=run)
    assert certificate.verdict == "failed" and certificate.convicted == ["n3"]


def _pair(operator: Any, cluster: Cluster) -> AcceptanceRun:
    request = RunRequest(cluster_id=cluster.pk, scope="nodes", value="n1,n2")
    request.tiers = ["inventory"]
    return acceptance_run_start(actor=operator, request=request)


def test_two_nodes_that_differ_name_the_one_that_changed_since_its_certificate(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    other_torch = {"python": "3.11.7", "kernel": "6.1.0", "torch": "2.5.1", "torch_cuda": "12.4"}
    # Never certified: a pair that differs fails, and neither side can claim to be the norm.
    first = _pair(operator, cluster)
    finish_inventory(first, login_node, {"n2": other_torch})
    first.refresh_from_db()
    assert (first.verdict, first.convicted) == ("failed", [])
    assert "n2: stack torch is 2.5.1 (the others: no majority)" in first.reason
    # Certified alike, then n2 changes: n2 is the odd one out, and named.
    certified = _pair(operator, cluster)
    finish_inventory(certified, login_node)
    certified.refresh_from_db()
    assert certified.verdict in ("passed", "inconclusive") and certified.convicted == []
    later = _pair(operator, cluster)
    finish_inventory(later, login_node, {"n2": other_torch})
    later.refresh_from_db()
    assert (later.verdict, later.convicted) == ("failed", ["n2"])
    assert "its last certificate: 2.4.0, the others unchanged" in later.reason
    # A failed certificate is not the norm: n2 is still the one that changed.
    again = _pair(operator, cluster)
    finish_inventory(again, login_node, {"n2": other_torch})
    again.refresh_from_db()
    assert (again.verdict, again.convicted) == ("failed", ["n2"])
    # Both changed since: no side is the norm again.
    n1_too = {**other_torch, "torch": "2.6.0"}
    both = _pair(operator, cluster)
    finish_inventory(both, login_node, {"n1": n1_too, "n2": other_torch})
    both.refresh_from_db()
    assert (both.verdict, both.convicted) == ("failed", [])


def test_a_passing_run_certifies_its_nodes_with_the_inventory_configuration(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    run = _start(operator, cluster)
    finish_inventory(run, login_node)
    run.refresh_from_db()
    assert run.current_tier == "collectives"
    # The node level first: one step per node, nothing of the next level yet.
    assert sorted(s.nodes[0] for s in run.steps.filter(tier="collectives")) == [
        "n1",
        "n2",
        "n3",
        "n4",
    ]
    assert set(run.steps.filter(tier="collectives").values_list("level", flat=True)) == {"node"}
    run = drive(run, login_node, healthy)
    assert (run.verdict, run.convicted) == ("passed", [])
    # Each tier's time, one after the other: together no more than the whole run.
    times = [run.outcomes[tier]["seconds"] for tier in ("inventory", "collectives")]
    assert all(t >= 0 for t in times)
    assert sum(times) <= (run.ended_at - run.started_at).total_seconds() + 0.1
    levels = list(run.steps.filter(tier="collectives").values_list("level", "nodes"))
    assert ("leaf", ["n1", "n2"]) in levels and ("leaf", ["n3", "n4"]) in levels
    assert ("spine", ["n1", "n2", "n3", "n4"]) in levels
    document = Certificate.objects.get(run=run).document
    for entry in document["nodes"]:
        node = Node.objects.get(cluster=cluster, name=entry["name"])
        assert entry["gpus"] == [
            {"index": g.index, "type": g.gpu_type, "memory_mb": g.memory_mb}
            for g in node.gpus.order_by("index")
        ]
        assert entry["partitions"] == node.partitions
        assert entry["leaf_switch"] == node.leaf_switch.name
        assert entry["stack"]["torch"] == "2.4.0"
    assert [e["name"] for e in document["nodes"]] == ["n1", "n2", "n3", "n4"]
    criteria = document["criteria"]
    assert all(c["threshold"] == 5 * GB and c["verdict"] == "passed" for c in criteria)
    assert {c["measured_busbw"] for c in criteria} == {10 * GB}
    assert set(Node.objects.filter(cluster=cluster).values_list("acceptance_state", flat=True)) == {
        "certified"
    }


def slow_nic_on_n2(group: tuple[str, ...]) -> float:
    """n2 alone is fine; any group that crosses its NIC runs at a fifth of the speed."""
    return 2 * GB if "n2" in group and len(group) > 1 else 10 * GB


def test_a_failing_leaf_is_isolated_to_its_bad_node_with_evidence(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    run = _start(operator, cluster, tiers=["collectives"])
    run = drive(run, login_node, slow_nic_on_n2)
    assert (run.verdict, run.convicted) == ("failed", ["n2"])
    assert "isolation: convicted n2" in run.reason
    isolation = run.steps.filter(tier="isolation")
    # Screen both leaves, then confirm each suspect of leaf1 with a healthy buddy of leaf2.
    assert {(s.purpose, tuple(s.nodes)) for s in isolation} == {
        ("screen", ("n1", "n2")),
        ("screen", ("n3", "n4")),
        ("confirm", ("n1", "n3")),
        ("confirm", ("n2", "n4")),
    }
    convicting = isolation.get(nodes=["n2", "n4"])
    assert (convicting.verdict, convicting.busbw, convicting.level) == ("failed", 2 * GB, "spine")
    assert convicting.measured["peak_busbw"]["all_reduce"] == 2 * GB
    finding = run.outcomes["isolation"]["findings"][0]
    assert finding["node"] == "n2" and finding["verdict"] == "convicted"
    assert {tuple(m["group"]) for m in finding["evidence"]} == {("n1", "n2"), ("n2", "n4")}
    assert Node.objects.get(cluster=cluster, name="n2").acceptance_state == "convicted"
    assert Node.objects.get(cluster=cluster, name="n1").acceptance_state == ""
    document = Certificate.objects.get(run=run).document
    assert document["convicted"] == ["n2"]
    assert any(c["purpose"] == "confirm" for c in document["criteria"])


def test_a_slow_node_alone_is_convicted_at_the_node_level(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    run = _start(operator, cluster, tiers=["collectives"])
    run = drive(run, login_node, lambda group: 1 * GB if group == ("n4",) else 10 * GB)
    assert (run.verdict, run.convicted) == ("failed", ["n4"])
    # Stopped at the failing level: no leaf or spine step, no isolation.
    assert set(run.steps.values_list("level", flat=True)) == {"node"}


def test_without_a_threshold_a_level_is_inconclusive_never_passed(
    operator: Any, login_node: LoginNode
) -> None:
    cluster = a100_cluster()
    run = _start(operator, cluster, tiers=["collectives"])
    run = drive(run, login_node, healthy)
    assert run.verdict == "inconclusive"
    assert run.outcomes["collectives"]["verdict"] == "inconclusive"
    assert not Node.objects.filter(cluster=cluster, acceptance_state="certified").exists()


def test_a_later_certificate_shows_regressions_against_the_previous_one(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    drive(_start(operator, cluster, tiers=["collectives"]), login_node, healthy)
    later = drive(
        _start(operator, cluster, tiers=["collectives"]),
        login_node,
        lambda group: 6 * GB if len(group) == 4 else 10 * GB,
    )
    regressions = Certificate.objects.get(run=later).document["regressions"]
    assert [(r["level"], r["before"]["busbw"], r["now"]["busbw"]) for r in regressions] == [
        ("spine", 10 * GB, 6 * GB)
    ]


def test_cancel_is_audited_and_ends_the_run(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    run = _start(operator, cluster)
    assert acceptance_run_cancel(actor=operator, run=run) == "cancelled"
    run.refresh_from_db()
    assert run.state == "cancelled" and run.cancelled_by == operator
    assert AcceptanceStep.objects.get(run=run).state == "cancelled"
    assert AuditEvent.objects.filter(action="acceptance.cancel", target_id=str(run.pk)).exists()
    assert AuditEvent.objects.filter(action="acceptance.start", target_id=str(run.pk)).exists()
    assert not Certificate.objects.filter(run=run).exists()


def test_a_convicted_node_is_never_proposed_and_a_certified_one_is_preferred(
    cluster: Cluster,
) -> None:
    Node.objects.filter(cluster=cluster, name="n1").update(acceptance_state="convicted")
    Node.objects.filter(cluster=cluster, name__in=["n3", "n4"]).update(acceptance_state="certified")
    nodes, switches = placement_inputs(cluster)
    two = propose_placement(nodes, switches, PlacementRequest(nodes=2, gpus_per_node=2))
    assert two.nodes == ("n3", "n4")
    three = propose_placement(nodes, switches, PlacementRequest(nodes=3, gpus_per_node=2))
    assert "n1" not in three.nodes and "n1" in " ".join((*three.reasons, three.explanation))
