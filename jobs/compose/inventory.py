"""What the submit form shows while a job is composed: the clusters' partitions with their
nodes and GPU types (from Gantry's synced inventory), and the checkpoint-interval advice
(``jobs.goodput.ledger``, Young/Daly) for the interval being chosen. Reads only."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from jobs.compose.presets import StepTime, measured_step_time, past_job_ids
from jobs.goodput import ledger as goodput
from jobs.goodput.selectors import _failure_history, _median_checkpoint_blocking
from jobs.models import MetricPoint
from nodes.models import Cluster, Node, Partition


def _partition_summary(partition: Partition, members: list[Node]) -> dict[str, Any]:
    per_type: dict[str, Counter[int]] = defaultdict(Counter)
    for node in members:
        counts = Counter(gpu.gpu_type or "" for gpu in node.gpus.all())
        for gpu_type, count in counts.items():
            per_type[gpu_type][count] += 1
    gpu_types = [
        {
            "name": gpu_type,
            "max_per_node": max(counts),
            # e.g. {2: 3}: three nodes with two GPUs of this type.
            "per_node": [
                {"gpus": gpus, "nodes": nodes}
                for gpus, nodes in sorted(counts.items(), reverse=True)
            ],
            "nodes": sum(counts.values()),
        }
        for gpu_type, counts in sorted(per_type.items())
        if gpu_type
    ]
    gpus_per_node = [node.gpu_count for node in members]
    return {
        "name": partition.name,
        "is_default": partition.is_default,
        "state": partition.state,
        "max_time_minutes": partition.max_time_minutes,
        "nodes": len(members),
        "idle_nodes": sum(1 for node in members if node.state == Node.State.IDLE),
        "usable_nodes": sum(1 for node in members if node.is_schedulable),
        "max_cpus_per_node": max((node.cpus_total for node in members), default=0),
        "max_memory_mb": max((node.memory_mb for node in members), default=0),
        "max_gpus_per_node": max(gpus_per_node, default=0),
        "gpu_types": gpu_types,
    }


def submit_inventory() -> list[dict[str, Any]]:
    """Every cluster with its partitions: node counts (all, idle, usable), the largest
    CPUs, memory and GPUs per node, and the GPU types with how many each node has. Three
    queries, whatever the size of the fleet."""
    nodes = (
        Node.objects.exclude(state=Node.State.GONE)
        .only("cluster_id", "name", "state", "partitions", "cpus_total", "memory_mb")
        .prefetch_related("gpus")
    )
    by_cluster: dict[int, list[Node]] = defaultdict(list)
    for node in nodes:
        by_cluster[node.cluster_id].append(node)
    partitions: dict[int, list[Partition]] = defaultdict(list)
    for partition in Partition.objects.filter(gone=False).order_by("-is_default", "name"):
        partitions[partition.cluster_id].append(partition)
    clusters = []
    for cluster in Cluster.objects.order_by("-is_default", "name"):
        members = by_cluster.get(cluster.pk, [])
        clusters.append(
            {
                "id": cluster.pk,
                "name": cluster.name,
                "is_default": cluster.is_default,
                "default_partition": cluster.default_partition,
                "partitions": [
                    _partition_summary(
                        partition,
                        [node for node in members if partition.name in (node.partitions or [])],
                    )
                    for partition in partitions.get(cluster.pk, [])
                ],
            }
        )
    return clusters


def partition_label(summary: dict[str, Any]) -> str:
    """``gpu — 2 nodes, 1 idle · h100 ×2/node`` for a partition select."""
    nodes, idle = summary["nodes"], summary["idle_nodes"]
    text = f"{summary['name']} — {nodes} node{'s' if nodes != 1 else ''}, {idle} idle"
    types = [f"{t['name']} ×{t['max_per_node']}/node" for t in summary["gpu_types"]]
    return f"{text} · {', '.join(types) if types else 'no GPUs'}"


def gpu_type_label(gpu_type: dict[str, Any]) -> str:
    """``a100 — 2 per node on 2 nodes`` (or ``2 per node on 1, 1 per node on 3``)."""
    counts = ", ".join(
        f"{entry['gpus']} per node on {entry['nodes']} node{'s' if entry['nodes'] != 1 else ''}"
        for entry in gpu_type["per_node"]
    )
    return f"{gpu_type['name']} — {counts}"


def checkpoint_advice_for_request(
    *,
    cluster: Cluster,
    partition: str,
    preset: str | None,
    checkpoint_every: int | None,
    nodes: int,
    gpus_per_node: int,
    tasks_per_node: int,
) -> dict[str, Any]:
    """Young/Daly advice for a job being composed: its checkpoint cost and step time from
    past jobs (same preset on the partition, else any on the partition), the interruption
    rate from the cluster's history. ``history`` False when the cluster has none yet."""
    history = _failure_history(cluster_id=cluster.pk)
    job_ids = past_job_ids(cluster=cluster, partition=partition, preset=preset)
    basis = "same preset on this partition"
    if not job_ids and preset:
        job_ids = past_job_ids(cluster=cluster, partition=partition, preset=None)
        basis = "any preset on this partition"
    step = measured_step_time(job_ids) if job_ids else StepTime(seconds=None, jobs=0)
    cost = (
        _median_checkpoint_blocking(MetricPoint.objects.filter(job_id__in=job_ids))
        if job_ids
        else None
    )
    advice = goodput.checkpoint_advice(
        checkpoint_cost_s=cost,
        history=history,
        gpus=goodput.job_gpus(
            nodes=nodes, gpus_per_node=gpus_per_node, tasks_per_node=tasks_per_node
        ),
        step_time_s=step.seconds,
        interval_steps=checkpoint_every or None,
        restore_s=None,
    )
    optimal_steps = None
    if advice.optimal_interval_s and step.seconds:
        optimal_steps = max(1, round(advice.optimal_interval_s / step.seconds))
    return {
        "history": history.gpu_hours > 0 or history.interruptions > 0,
        "basis": basis if job_ids else "",
        "jobs": step.jobs,
        "step_time_s": step.seconds,
        "checkpoint_every": checkpoint_every,
        "optimal_checkpoint_every": optimal_steps,
        **advice.as_dict(),
        "words": _advice_in_words(advice, step, optimal_steps, checkpoint_every, history),
    }


def _advice_in_words(
    advice: goodput.Advice,
    step: StepTime,
    optimal_steps: int | None,
    checkpoint_every: int | None,
    history: goodput.FailureHistory,
) -> str:
    duration = goodput.format_duration
    if history.gpu_hours <= 0 and history.interruptions <= 0:
        return (
            "No history on this cluster yet: the interval advice appears once jobs have run "
            "and ended here."
        )
    mtti = (
        f"mean time to interruption {duration(advice.mtti_s)} for a job this size "
        f"({history.interruptions} interruption{'s' if history.interruptions != 1 else ''} "
        f"in {history.gpu_hours:.1f} GPU-hours"
        f"{'; still mostly the 24 h prior' if advice.prior_used else ''})"
    )
    if advice.checkpoint_cost_s is None or step.seconds is None:
        return f"No checkpoint cost measured on this partition yet; {mtti}."
    parts = [
        f"A checkpoint blocks {duration(advice.checkpoint_cost_s)}, a step takes "
        f"{duration(step.seconds)}; {mtti}."
    ]
    if optimal_steps is not None and advice.optimal_interval_s is not None:
        parts.append(
            f"Young/Daly: checkpoint every {duration(advice.optimal_interval_s)} "
            f"(about {optimal_steps} steps)"
            + (
                f", expected goodput {100 * advice.expected_ratio_optimal:.1f}%."
                if advice.expected_ratio_optimal is not None
                else "."
            )
        )
    if checkpoint_every and advice.current_interval_s is not None:
        now = advice.expected_ratio_now
        parts.append(
            f"Every {checkpoint_every} steps is every {duration(advice.current_interval_s)}"
            + (f": expected goodput {100 * now:.1f}%." if now is not None else ".")
        )
    elif checkpoint_every == 0:
        parts.append("0: only at the end; an interruption loses the whole run.")
    return " ".join(parts)
