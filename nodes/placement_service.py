"""Placement advice from Gantry's rows: inventory → ``nodes.placement`` inputs, and back.

``nodes.placement`` is pure; this module is the one place that reads Node, Gpu, Switch,
Link and running Job rows to build its ``NodeInfo``/``SwitchInfo``, asks it for advice
while a job is composed, and judges where Slurm actually put a job for the job page.
Reads only: nothing here writes or talks to the cluster.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from nodes.models import Cluster, Gpu, Link, Node, Switch
from nodes.placement import (
    NodeInfo,
    Placement,
    PlacementCheck,
    PlacementRequest,
    SwitchInfo,
    placement_quality,
    propose_placement,
)
from nodes.slurm.hostlist import compress, expand

if TYPE_CHECKING:
    from jobs.models import Job
    from jobs.services import JobRequest

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


def _free_at_by_node(cluster: Cluster) -> dict[str, datetime]:
    """When each busy node is expected free: the latest end of the time limits of the
    running jobs on it (started_at + time_limit), in UTC. Unknown nodes are absent."""
    from jobs.models import Job

    free_at: dict[str, datetime] = {}
    running = Job.objects.filter(
        cluster=cluster, state__in=[Job.State.RUNNING, Job.State.COMPLETING]
    ).exclude(started_at__isnull=True)
    for job in running.only("allocated_nodes", "started_at", "time_limit_minutes"):
        assert job.started_at is not None
        ends = job.started_at + timedelta(minutes=job.time_limit_minutes)
        for name in job.allocated_node_names:
            if name not in free_at or ends > free_at[name]:
                free_at[name] = ends
    return free_at


def placement_inputs(cluster: Cluster) -> tuple[list[NodeInfo], list[SwitchInfo]]:
    """The cluster's nodes and switches as the placement function wants them."""
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
    free_at = _free_at_by_node(cluster)
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
            )
        )
    return infos, switch_infos


def _request(
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
) -> Placement:
    """Where an N-node × G-GPU job should run now, from the last synced inventory."""
    node_infos, switch_infos = placement_inputs(cluster)
    return propose_placement(
        node_infos,
        switch_infos,
        _request(
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


def placement_advice_for_request(request: JobRequest) -> Placement:
    return placement_advice(
        cluster=request.cluster,
        partition=request.partition,
        nodes=request.nodes,
        gpus_per_node=request.gpus_per_node,
        gpu_type=request.gpu_type,
        tasks_per_node=request.tasks_per_node,
        cpus_per_task=request.cpus_per_task,
        memory_mb=request.memory_mb,
    )


def job_request_with_advice(request: JobRequest) -> tuple[JobRequest, Placement]:
    """The request with the advice's ``nodelist`` and ``switches`` filled in.

    Refuses (FieldError on ``use_placement_advice``) when no placement is possible, so a
    user who asked for advice never silently gets none.
    """
    from controlplane.errors import FieldError
    from jobs.services import job_request_validate

    # What the cluster cannot run at all is refused with its own field first.
    job_request_validate(request)
    advice = placement_advice_for_request(request)
    if not advice.feasible:
        raise FieldError("use_placement_advice", advice.explanation)
    options = advice.slurm_options
    return (
        dataclasses.replace(
            request,
            nodelist=options.get("nodelist", ""),
            switches=options.get("switches", ""),
        ),
        advice,
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


@dataclass(frozen=True)
class JobPlacementCheck:
    """Where a job ran, judged against the topology and against what it asked for."""

    check: PlacementCheck
    nodelist: str
    requested_nodelist: str
    # None: the job asked for no node list, so there is nothing to match.
    matches_request: bool | None
    summary: str

    @property
    def flagged(self) -> bool:
        return self.check.more_switches_than_necessary or self.matches_request is False


def job_placement_check(job: Job) -> JobPlacementCheck | None:
    """Judge a placed job: its nodes, switches spanned, whether fewer would have done,
    and whether it ran where it asked to (the accepted advice). None before placement."""
    actual = job.allocated_node_names
    if not actual:
        return None
    node_infos, switch_infos = placement_inputs(job.cluster)
    request = _request(
        partition=job.partition,
        nodes=max(1, len(actual)),
        gpus_per_node=job.gpus_per_node,
        gpu_type=job.gpu_type,
        tasks_per_node=job.tasks_per_node,
        cpus_per_task=job.cpus_per_task,
        memory_mb=job.memory_mb,
    )
    check = placement_quality(actual, node_infos, switch_infos, request)
    nodelist = compress(actual)
    matches: bool | None = None
    if job.nodelist_requested:
        try:
            wanted = set(expand(job.nodelist_requested))
        except ValueError:
            wanted = set()
        matches = wanted <= set(actual) and len(actual) == job.nodes
    spanned = len(check.switches_spanned)
    if check.leaves:
        where = (
            f"under {check.leaves[0]}"
            if len(check.leaves) == 1
            else f"across {', '.join(check.leaves)}"
        )
        text = f"{nodelist} {where} ({spanned} switch{'' if spanned == 1 else 'es'})"
    else:
        text = f"{nodelist} (no topology known)"
    if matches is True:
        text += " — matches the advice" if job.switches_requested else " — matches the request"
    elif matches is False:
        text += f" — does not match the requested {job.nodelist_requested}"
    if check.more_switches_than_necessary and check.optimal_switch_count is not None:
        optimum = check.optimal_switch_count
        text += (
            f"; spans {spanned} switches; {optimum} {'was' if optimum == 1 else 'were'} possible"
        )
    return JobPlacementCheck(
        check=check,
        nodelist=nodelist,
        requested_nodelist=job.nodelist_requested,
        matches_request=matches,
        summary=text,
    )
