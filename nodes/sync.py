"""Syncing a cluster's inventory from Slurm: partitions, switches, nodes, GPUs, links.

Safe to re-run at any time: every write compares first, and state changes are
conditional updates, so two syncs racing apply each change once. Nothing is deleted:
what Slurm stops reporting is marked gone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from nodes.access.cluster import slurm_client_for
from nodes.models import Cluster, Gpu, Link, Node, NodeEvent, Partition, Switch
from slurm import errors as slurm_errors
from slurm.errors import describe_cluster_error
from slurm.parsers import Inventory, SlurmNode

logger = logging.getLogger(__name__)

MAX_SYNC_BACKOFF_SECONDS = 600


@dataclass
class SyncResult:
    ok: bool
    error: str = ""
    nodes_seen: int = 0
    state_changes: int = 0
    events: list[str] = field(default_factory=list)


def sync_backoff_seconds(failures: int, interval: int) -> int:
    """Wait longer after each consecutive failure, up to ten minutes."""
    return int(min(MAX_SYNC_BACKOFF_SECONDS, interval * (2 ** max(0, failures - 1))))


def cluster_sync(*, cluster_id: int) -> SyncResult:
    """Read the inventory (three remote commands) and apply it.

    Safe to re-run at any time: every write compares first and state changes are
    conditional updates, so two syncs racing apply each change once. On failure the
    cluster shows the error and backs off; nothing already known is deleted.
    """
    cluster = Cluster.objects.get(pk=cluster_id)
    try:
        inventory = slurm_client_for(cluster).inventory()
    except slurm_errors.SlurmError as error:
        message = describe_cluster_error(error)
        cluster_sync_failed(cluster=cluster, message=message)
        return SyncResult(ok=False, error=message)
    return apply_inventory(cluster, inventory)


def cluster_sync_failed(*, cluster: Cluster, message: str) -> None:
    now = timezone.now()
    failures = cluster.sync_failures + 1
    Cluster.objects.filter(pk=cluster.pk).update(
        sync_status=Cluster.SyncStatus.ERROR,
        last_sync_at=now,
        last_sync_error=message[:2000],
        sync_failures=F("sync_failures") + 1,
        next_sync_at=now
        + timedelta(seconds=sync_backoff_seconds(failures, settings.SYNC_INTERVAL_SECONDS)),
    )
    logger.warning("sync of cluster %s failed: %s", cluster.name, message)


def apply_partitions(cluster: Cluster, partitions: list[Any]) -> None:
    existing = {partition.name: partition for partition in cluster.partitions.all()}
    seen = set()
    for data in partitions:
        seen.add(data.name)
        values = {
            "nodes_expression": (data.node_list_expr or ",".join(data.nodes))[:1024],
            "is_default": bool(data.default),
            "state": (data.state or "")[:32],
            "max_time_minutes": data.max_time_minutes,
            "total_cpus": data.total_cpus or 0,
            "total_nodes": data.total_nodes or len(data.nodes),
            "open_to_all": data.open_to_all,
            "gone": False,
        }
        current = existing.get(data.name)
        if current is None:
            Partition.objects.create(cluster=cluster, name=data.name, **values)
        elif any(getattr(current, key) != value for key, value in values.items()):
            for key, value in values.items():
                setattr(current, key, value)
            current.save(update_fields=[*values.keys(), "updated_at"])
    Partition.objects.filter(cluster=cluster, gone=False).exclude(name__in=seen).update(gone=True)


def _apply_switches(cluster: Cluster, inventory: Inventory) -> dict[str, Switch]:
    existing = {switch.name: switch for switch in cluster.switches.all()}
    for data in inventory.switches:
        current = existing.get(data.name)
        if current is None:
            current = Switch.objects.create(
                cluster=cluster, name=data.name, level=data.level, link_speed=data.link_speed
            )
            existing[data.name] = current
        elif (current.level, current.link_speed, current.gone) != (
            data.level,
            data.link_speed,
            False,
        ):
            current.level, current.link_speed, current.gone = data.level, data.link_speed, False
            current.save(update_fields=["level", "link_speed", "gone", "updated_at"])
    seen = {data.name for data in inventory.switches}
    for data in inventory.switches:
        switch = existing[data.name]
        parent = existing.get(data.parent) if data.parent else None
        if switch.parent_id != (parent.pk if parent else None):
            switch.parent = parent
            switch.save(update_fields=["parent", "updated_at"])
        if parent is not None:
            Link.objects.get_or_create(
                cluster=cluster,
                scope=Link.Scope.SWITCH_SWITCH,
                switch=switch,
                upper_switch=parent,
                defaults={"kind": Link.Kind.UNKNOWN},
            )
    Switch.objects.filter(cluster=cluster, gone=False).exclude(name__in=seen).update(gone=True)
    return {name: switch for name, switch in existing.items() if name in seen}


def _leaf_of(inventory: Inventory) -> dict[str, str]:
    """Node name -> the lowest-level switch that lists it."""
    leaf: dict[str, tuple[int, str]] = {}
    for switch in inventory.switches:
        for node_name in switch.nodes:
            if node_name not in leaf or switch.level < leaf[node_name][0]:
                leaf[node_name] = (switch.level, switch.name)
    return {name: switch_name for name, (_, switch_name) in leaf.items()}


def _gpu_rows(data: SlurmNode) -> list[tuple[int, str, bool]]:
    """(index, type, allocated) for each GPU Slurm reports on the node."""
    rows: list[tuple[int, str, bool]] = []
    used_indexes: set[int] = set()
    used_count_by_type: dict[str, int] = {}
    for entry in data.gres_used:
        if entry.is_gpu:
            used_indexes.update(entry.indexes)
            key = entry.type or ""
            used_count_by_type[key] = used_count_by_type.get(key, 0) + entry.count
    next_index = 0
    for entry in data.gpus:
        indexes = list(entry.indexes) or list(range(next_index, next_index + entry.count))
        for index in indexes:
            rows.append((index, entry.type or "", False))
        next_index = max(indexes, default=next_index - 1) + 1
    if used_indexes:
        rows = [(index, gpu_type, index in used_indexes) for index, gpu_type, _ in rows]
    else:
        # No indexes reported: mark the first N of each type allocated.
        remaining = dict(used_count_by_type)
        if not remaining and data.gpus_used:
            remaining = {"": data.gpus_used}
        marked: list[tuple[int, str, bool]] = []
        for index, gpu_type, _ in rows:
            key = gpu_type if gpu_type in remaining else ""
            if remaining.get(key, 0) > 0:
                remaining[key] -= 1
                marked.append((index, gpu_type, True))
            else:
                marked.append((index, gpu_type, False))
        rows = marked
    return rows


def node_state(value: str) -> str:
    valid = {choice for choice, _ in Node.State.choices}
    return value if value in valid else Node.State.UNKNOWN


def _node_values(data: SlurmNode, leaf: Switch | None) -> dict[str, Any]:
    return {
        "address": (data.address or "")[:255],
        "state_flags": list(data.state_flags),
        "reason": (data.reason or "")[:512],
        "cpus_total": data.cpus_total or 0,
        "cpus_alloc": min(data.cpus_alloc or 0, data.cpus_total or 0),
        "memory_mb": data.memory_mb or 0,
        "memory_alloc_mb": data.memory_alloc_mb or 0,
        "features": list(data.features),
        "partitions": list(data.partitions),
        "partitions_text": Node.partitions_as_text(list(data.partitions)),
        "leaf_switch_id": leaf.pk if leaf else None,
    }


def _apply_node(
    cluster: Cluster,
    data: SlurmNode,
    node: Node | None,
    leaf: Switch | None,
    events: list[NodeEvent],
    now: datetime,
) -> tuple[Node, int]:
    """Create or update one node from Slurm's view; returns (node, state changes)."""
    values = _node_values(data, leaf)
    new_state = node_state(data.state)
    if node is None:
        node = Node.objects.create(
            cluster=cluster,
            name=data.name,
            state=new_state,
            state_changed_at=now,
            last_seen_at=now,
            **values,
        )
        events.append(
            NodeEvent(node=node, kind="appeared", to_state=new_state, message=values["reason"])
        )
        return node, 0
    changed = [key for key, value in values.items() if getattr(node, key) != value]
    if changed:
        Node.objects.filter(pk=node.pk).update(
            last_seen_at=now, updated_at=now, **{key: values[key] for key in changed}
        )
    else:
        Node.objects.filter(pk=node.pk).update(last_seen_at=now)
    if "reason" in changed and node.state == new_state:
        events.append(
            NodeEvent(
                node=node,
                kind="reason",
                from_state=node.state,
                to_state=new_state,
                message=values["reason"] or "(reason cleared)",
            )
        )
    if node.state == new_state:
        return node, 0
    # Nothing got updated: another sync applied this change first.
    if not Node.objects.filter(pk=node.pk, state=node.state).update(
        state=new_state, state_changed_at=now
    ):
        return node, 0
    events.append(
        NodeEvent(
            node=node,
            kind="state",
            from_state=node.state,
            to_state=new_state,
            message=values["reason"],
        )
    )
    node.state = new_state
    return node, 1


def _mark_gone(
    existing: dict[str, Node], seen: set[str], events: list[NodeEvent], now: datetime
) -> int:
    """Nodes Slurm no longer reports are marked gone, never deleted."""
    changes = 0
    for name, node in existing.items():
        if name in seen or node.state == Node.State.GONE:
            continue
        if Node.objects.filter(pk=node.pk, state=node.state).update(
            state=Node.State.GONE, state_changed_at=now
        ):
            changes += 1
            events.append(
                NodeEvent(
                    node=node,
                    kind="gone",
                    from_state=node.state,
                    to_state=Node.State.GONE,
                    message="no longer reported by Slurm",
                )
            )
    return changes


def apply_inventory(cluster: Cluster, inventory: Inventory) -> SyncResult:
    """Apply one inventory read: partitions, switches, nodes, GPUs, links; one transaction."""
    now = timezone.now()
    result = SyncResult(ok=True, nodes_seen=len(inventory.nodes))
    with transaction.atomic():
        apply_partitions(cluster, list(inventory.partitions))
        switches = _apply_switches(cluster, inventory)
        leaf_of = _leaf_of(inventory)
        existing = {node.name: node for node in cluster.nodes.all()}
        gpus_by_node: dict[int, dict[int, Gpu]] = {}
        for gpu in Gpu.objects.filter(node__cluster=cluster):
            gpus_by_node.setdefault(gpu.node_id, {})[gpu.index] = gpu
        events: list[NodeEvent] = []
        for data in inventory.nodes:
            leaf = switches.get(leaf_of.get(data.name, ""))
            node, changes = _apply_node(cluster, data, existing.get(data.name), leaf, events, now)
            existing.setdefault(data.name, node)
            result.state_changes += changes
            _apply_gpus(node, _gpu_rows(data), gpus_by_node.get(node.pk, {}))
            if leaf is not None:
                Link.objects.get_or_create(
                    cluster=cluster,
                    scope=Link.Scope.NODE_SWITCH,
                    node=node,
                    switch=leaf,
                    defaults={"kind": Link.Kind.UNKNOWN},
                )
        result.state_changes += _mark_gone(
            existing, {data.name for data in inventory.nodes}, events, now
        )
        NodeEvent.objects.bulk_create(events)
        result.events = [f"{event.node.name}: {event.kind} {event.to_state}" for event in events]
        Cluster.objects.filter(pk=cluster.pk).update(
            sync_status=Cluster.SyncStatus.OK,
            last_sync_at=now,
            last_sync_ok_at=now,
            last_sync_error="",
            sync_failures=0,
            next_sync_at=now + timedelta(seconds=settings.SYNC_INTERVAL_SECONDS),
        )
    return result


def _apply_gpus(node: Node, rows: list[tuple[int, str, bool]], existing: dict[int, Gpu]) -> None:
    seen = set()
    for index, gpu_type, allocated in rows:
        seen.add(index)
        state = Gpu.State.ALLOCATED if allocated else Gpu.State.FREE
        if node.state in {Node.State.DOWN, Node.State.FAIL, Node.State.INVAL}:
            state = Gpu.State.UNHEALTHY
        gpu = existing.get(index)
        if gpu is None:
            Gpu.objects.create(node=node, index=index, gpu_type=gpu_type, state=state)
        elif (gpu.gpu_type, gpu.state, gpu.health) != (gpu_type, state, ""):
            gpu.gpu_type, gpu.state, gpu.health = gpu_type, state, ""
            gpu.save(update_fields=["gpu_type", "state", "health", "updated_at"])
    for index, gpu in existing.items():
        if index not in seen and gpu.state != Gpu.State.UNKNOWN:
            gpu.state, gpu.health = Gpu.State.UNKNOWN, "no longer reported by Slurm"
            gpu.save(update_fields=["state", "health", "updated_at"])
