"""Placement advice from Gantry's rows: inventory → ``nodes.placement`` inputs, and back.

``nodes.placement`` is pure; this module is the one place that reads Node, Gpu, Switch
and Link rows to build its ``NodeInfo``/``SwitchInfo`` and asks it for advice. When busy
nodes free up is the caller's knowledge (``jobs.placement`` passes it from the running
jobs). Reads only: nothing here writes or talks to the cluster.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from nodes.models import Cluster, Gpu, Link, Node, Switch
from nodes.placement import (
    NodeInfo,
    Placement,
    PlacementRequest,
    SwitchInfo,
    propose_placement,
)

DEFAULT_MAX_WAIT_MINUTES = 10


def _intra_node_links(cluster: Cluster) -> dict[int, str]:
    """Per node id: "nvlink" when every known GPU↔GPU link is NVLink, "pcie" when any is PCIe."""
    kinds: dict[int, set[str]] = {}
    rows = Link.objects.filter(cluster=cluster, scope=Link.Scope.INTRA_NODE).values_list(
        "node_id", "kind"
    )
    for node_id, kind in rows:
        if node_id is not None:
            kinds.setdefault(node_id, set()).add(kind)
    result: dict[int, str] = {}
    for node_id, seen in kinds.items():
        if Link.Kind.PCIE in seen:
            result[node_id] = "pcie"
        elif seen == {Link.Kind.NVLINK}:
            result[node_id] = "nvlink"
    return result


def placement_inputs(
    cluster: Cluster, *, free_at: dict[str, datetime] | None = None
) -> tuple[list[NodeInfo], list[SwitchInfo]]:
    """The cluster's nodes and switches as the placement function wants them.

    ``free_at``: when each busy node is expected to be free (from the jobs running on it,
    which the caller knows); nodes absent from it are not expected to free up.
    """
    switches = list(Switch.objects.filter(cluster=cluster, gone=False).select_related("parent"))
    switch_infos = [
        SwitchInfo(
            name=switch.name,
            parent=switch.parent.name if switch.parent and not switch.parent.gone else None,
            level=switch.level,
        )
        for switch in switches
    ]
    links = _intra_node_links(cluster)
    free_at = free_at or {}
    nodes = (
        Node.objects.filter(cluster=cluster)
        .exclude(state=Node.State.GONE)
        .select_related("leaf_switch")
        .prefetch_related("gpus")
    )
    infos = []
    for node in nodes:
        gpus = list(node.gpus.all())
        types = sorted({gpu.gpu_type for gpu in gpus if gpu.gpu_type})
        leaf = node.leaf_switch
        infos.append(
            NodeInfo(
                name=node.name,
                state=node.state,
                partitions=tuple(node.partitions or ()),
                leaf_switch=leaf.name if leaf is not None and not leaf.gone else None,
                # A node with mixed GPU types is described by its first type; Slurm's
                # --gpus-per-node=type:N would refuse the other ones anyway.
                gpu_type=types[0] if types else None,
                gpus_total=len(gpus),
                gpus_free=sum(1 for gpu in gpus if gpu.state == Gpu.State.FREE),
                cpus_total=node.cpus_total,
                cpus_free=max(0, node.cpus_total - node.cpus_alloc),
                memory_mb=node.memory_mb,
                memory_free_mb=max(0, node.memory_mb - node.memory_alloc_mb),
                intra_node_link=links.get(node.id, "unknown"),
                free_at=free_at.get(node.name),
                health=node.health_state,
                acceptance=node.acceptance_state,
            )
        )
    return infos, switch_infos


def placement_request(
    *,
    partition: str,
    nodes: int,
    gpus_per_node: int,
    gpu_type: str = "",
    tasks_per_node: int = 1,
    cpus_per_task: int = 1,
    memory_mb: int | None = None,
    max_wait_minutes: int = DEFAULT_MAX_WAIT_MINUTES,
) -> PlacementRequest:
    return PlacementRequest(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        partition=partition or None,
        gpu_type=gpu_type or None,
        cpus_per_node=tasks_per_node * cpus_per_task,
        memory_mb_per_node=memory_mb,
        max_wait_minutes=max_wait_minutes,
    )


def placement_advice(
    *,
    cluster: Cluster,
    partition: str,
    nodes: int,
    gpus_per_node: int,
    gpu_type: str = "",
    tasks_per_node: int = 1,
    cpus_per_task: int = 1,
    memory_mb: int | None = None,
    max_wait_minutes: int = DEFAULT_MAX_WAIT_MINUTES,
    free_at: dict[str, datetime] | None = None,
) -> Placement:
    """Where an N-node × G-GPU job should run now, from the last synced inventory."""
    node_infos, switch_infos = placement_inputs(cluster, free_at=free_at)
    return propose_placement(
        node_infos,
        switch_infos,
        placement_request(
            partition=partition,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            gpu_type=gpu_type,
            tasks_per_node=tasks_per_node,
            cpus_per_task=cpus_per_task,
            memory_mb=memory_mb,
            max_wait_minutes=max_wait_minutes,
        ),
    )


def placement_as_dict(placement: Placement) -> dict[str, Any]:
    return {
        "feasible": placement.feasible,
        "nodes": list(placement.nodes),
        "nodelist": placement.nodelist,
        "switches_spanned": list(placement.switches_spanned),
        "switch_count": len(placement.switches_spanned),
        "leaves": list(placement.leaves),
        "lowest_common_switch": placement.lowest_common_switch,
        "optimal_switch_count": placement.optimal_switch_count,
        "waits_for": list(placement.waits_for),
        "starts_at": placement.starts_at.isoformat() if placement.starts_at else None,
        "explanation": placement.explanation,
        "reasons": list(placement.reasons),
        "slurm_options": dict(placement.slurm_options),
        "sbatch_args": placement.to_sbatch_args(),
        "topology_known": placement.topology_known,
    }
