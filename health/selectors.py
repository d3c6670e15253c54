"""Reads for the pages and the API: a node's health with its GPUs, events and stack drift;
GPU capacity per partition by health; the drain offer for a critical node; the fleet's
health for /metrics; the job page's notice of nodes that turned unhealthy during the run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from health.evaluate import ACTION_WORDS, State
from health.models import GpuHealth, HealthEvent, NodeHealth
from health.stack import Difference, stack_drift
from nodes.models import Cluster, Gpu, Node

RECENT_EVENTS = 20


@dataclass
class NodeHealthView:
    node: Node
    health: NodeHealth | None
    gpus: list[GpuHealth]
    events: list[HealthEvent]
    # Partition → this node's differences from the partition's majority stack.
    drift: dict[str, list[Difference]]
    drain_reason: str = ""

    @property
    def state(self) -> str:
        return self.health.state if self.health is not None else State.UNKNOWN

    @property
    def action_words(self) -> str:
        return ACTION_WORDS.get(self.health.action, "") if self.health is not None else ""

    @property
    def offered_for_draining(self) -> bool:
        return bool(self.drain_reason)

    @property
    def stack_items(self) -> list[tuple[str, str]]:
        """The stack without its package list (that is counted instead)."""
        stack = self.health.stack if self.health is not None else {}
        items = [(key, str(value)) for key, value in stack.items() if key != "packages"]
        packages = stack.get("packages")
        if isinstance(packages, dict):
            items.append(("packages", f"{len(packages)} installed"))
        return sorted(items)


def _stacks_in_partition(cluster: Cluster, partition: str) -> dict[str, dict[str, Any]]:
    rows = NodeHealth.objects.filter(
        node__cluster=cluster, node__partitions_text__contains=f",{partition},"
    ).exclude(node__state=Node.State.GONE)
    return {row.node.name: row.stack for row in rows.select_related("node") if row.stack}


def partition_drift(*, cluster: Cluster, partition: str) -> list[Difference]:
    """Who differs from the partition's majority stack, and in what."""
    return stack_drift(_stacks_in_partition(cluster, partition))


def drain_reason_for(node: Node, health: NodeHealth | None) -> str:
    """The reason a one-click drain of a critical node records (shown in Slurm); "" when
    the node is not critical or is already out of service."""
    if health is None or health.state != State.CRITICAL:
        return ""
    if node.state in {Node.State.DRAINED, Node.State.DRAINING, Node.State.DOWN, Node.State.GONE}:
        return ""
    evidence = "; ".join(str(reason) for reason in health.reasons[:3])
    return f"GPU health critical: {evidence}"[:255].replace("\n", " ")


def node_health_view(*, node: Node) -> NodeHealthView:
    health = NodeHealth.objects.filter(node=node).first()
    drift = {}
    for partition in node.partitions or []:
        mine = [
            d
            for d in partition_drift(cluster=node.cluster, partition=partition)
            if d.node == node.name
        ]
        if mine:
            drift[partition] = mine
    return NodeHealthView(
        node=node,
        health=health,
        gpus=list(GpuHealth.objects.filter(node=node).order_by("index")),
        events=list(HealthEvent.objects.filter(node=node)[:RECENT_EVENTS]),
        drift=drift,
        drain_reason=drain_reason_for(node, health),
    )


@dataclass
class PartitionCapacity:
    cluster: str
    partition: str
    # GPUs by health: ok, warning, critical, unknown.
    gpus: Counter[str] = field(default_factory=Counter)
    drifted_nodes: int = 0

    @property
    def total(self) -> int:
        return sum(self.gpus.values())

    @property
    def healthy(self) -> int:
        return self.gpus[State.OK]

    @property
    def degraded(self) -> int:
        return self.gpus[State.WARNING]

    @property
    def unhealthy(self) -> int:
        return self.gpus[State.CRITICAL]

    @property
    def unknown(self) -> int:
        return self.gpus[State.UNKNOWN]


def gpu_capacity_by_partition() -> list[PartitionCapacity]:
    """Per cluster and partition: its GPUs (from the inventory) by health. A GPU counts
    with its own verdict, except on a critical node (placement avoids the whole node) and
    where it was never judged (unknown). A node in two partitions counts in both.

    Rows are read as values, not model objects (10k nodes and 80k GPUs: about 1 s as
    objects). Drift is worked out only for partitions whose nodes do not all have one
    stack fingerprint: the same stack items give the same fingerprint, so a partition with
    one fingerprint has no drift, and its stacks are never read."""
    nodes = list(
        Node.objects.exclude(state=Node.State.GONE)
        .order_by("cluster__name", "name")
        .values_list("id", "cluster__name", "name", "partitions", "health_state")
    )
    verdicts = {
        (node_id, index): state
        for node_id, index, state in GpuHealth.objects.values_list("node_id", "index", "state")
    }
    inventory: dict[int, list[int]] = {}
    for node_id, index in Gpu.objects.values_list("node_id", "index"):
        inventory.setdefault(node_id, []).append(index)
    fingerprints = dict(
        NodeHealth.objects.exclude(stack_fingerprint="").values_list("node_id", "stack_fingerprint")
    )
    capacity: dict[tuple[str, str], PartitionCapacity] = {}
    members: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for node_id, cluster_name, name, partitions, health_state in nodes:
        for partition in partitions or []:
            key = (cluster_name, partition)
            row = capacity.setdefault(key, PartitionCapacity(cluster=key[0], partition=partition))
            for index in inventory.get(node_id, []):
                state = verdicts.get((node_id, index), State.UNKNOWN)
                if health_state == State.CRITICAL:
                    state = State.CRITICAL
                row.gpus[state] += 1
            if node_id in fingerprints:
                members.setdefault(key, []).append((node_id, name))
    for key, stacked in members.items():
        if len({fingerprints[node_id] for node_id, _ in stacked}) < 2:
            continue
        names = dict(stacked)
        by_node = {
            names[node_id]: stack or {}
            for node_id, stack in NodeHealth.objects.filter(node_id__in=list(names)).values_list(
                "node_id", "stack"
            )
        }
        capacity[key].drifted_nodes = len({d.node for d in stack_drift(by_node)})
    return [capacity[key] for key in sorted(capacity)]


@dataclass
class FleetHealth:
    """For /metrics: each node's state, and GPUs per cluster and state."""

    # (cluster id, node name, state)
    nodes: list[tuple[int, str, str]] = field(default_factory=list)
    # (cluster id, state) -> GPUs
    gpus: Counter[tuple[int, str]] = field(default_factory=Counter)


def fleet_health() -> FleetHealth:
    """Every node's health and its cluster's GPUs by health (the inventory's GPUs, as
    ``gpu_capacity_by_partition`` counts them, once per cluster): three queries."""
    found = FleetHealth()
    nodes = list(
        Node.objects.exclude(state=Node.State.GONE)
        .order_by("cluster_id", "name")
        .values_list("id", "cluster_id", "name", "health_state")
    )
    verdicts = {
        (node_id, index): state
        for node_id, index, state in GpuHealth.objects.values_list("node_id", "index", "state")
    }
    inventory: dict[int, list[int]] = {}
    for node_id, index in Gpu.objects.values_list("node_id", "index"):
        inventory.setdefault(node_id, []).append(index)
    for node_id, cluster_id, name, node_state in nodes:
        found.nodes.append((cluster_id, name, node_state))
        for index in inventory.get(node_id, []):
            state = verdicts.get((node_id, index), State.UNKNOWN)
            if node_state == State.CRITICAL:
                state = State.CRITICAL
            found.gpus[(cluster_id, state)] += 1
    return found


@dataclass(frozen=True)
class HealthNotice:
    """A node a job ran on turned unhealthy while the job ran."""

    node: str
    node_id: int
    state: str
    at: datetime
    reason: str


def job_health_notices(
    *, cluster_id: int, node_names: list[str], start: datetime | None, end: datetime
) -> list[HealthNotice]:
    """The nodes of ``node_names`` (on that cluster) whose health turned warning, critical
    or unknown between ``start`` and ``end`` (the job's run), the first such change of
    each node (one query). Nothing without a start."""
    if start is None or not node_names:
        return []
    rows = (
        HealthEvent.objects.filter(
            node__cluster_id=cluster_id,
            node__name__in=node_names[:1024],
            gpu_index__isnull=True,
            at__gte=start,
            at__lte=end,
            to_state__in=[State.WARNING, State.CRITICAL, State.UNKNOWN],
        )
        .select_related("node")
        .order_by("at", "id")
    )
    notices: dict[str, HealthNotice] = {}
    for row in rows[:200]:
        notices.setdefault(
            row.node.name,
            HealthNotice(
                node=row.node.name,
                node_id=row.node_id,
                state=row.to_state,
                at=row.at,
                reason=row.reason,
            ),
        )
    return list(notices.values())
