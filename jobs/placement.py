"""Placement for jobs: advice for a job request, and where a placed job ended up.

``nodes.placement_service`` turns the inventory into advice; this module adds what only
jobs know: when busy nodes free up (the time limits of the jobs running on them), the
request a job is composed from, and the verdict on a job's actual placement.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta

from core import cache
from core.errors import FieldError
from jobs.models import Job
from jobs.validation import JobRequest, job_request_validate
from nodes.models import Cluster, Node
from nodes.placement import Placement, PlacementCheck, placement_quality
from nodes.placement_service import placement_advice, placement_inputs, placement_request
from slurm.hostlist import compress, expand


def busy_nodes_free_at(cluster: Cluster) -> dict[str, datetime]:
    """When each busy node is expected free: the latest end of the time limits of the
    running jobs on it (started_at + time_limit), in UTC. Unknown nodes are absent."""
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
        free_at=busy_nodes_free_at(request.cluster),
    )


def job_request_with_advice(request: JobRequest) -> tuple[JobRequest, Placement]:
    """The request with the advice's ``nodelist`` and ``switches`` filled in.

    Refuses (FieldError on ``use_placement_advice``) when no placement is possible, so a
    user who asked for advice never silently gets none.
    """
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
    node_infos, switch_infos = placement_inputs(
        job.cluster, free_at=busy_nodes_free_at(job.cluster)
    )
    request = placement_request(
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


@dataclass(frozen=True)
class JobPlacement:
    """What the job page says of where a job runs: the verdict (None before placement)
    and the names of the leaf switches over its nodes."""

    check: JobPlacementCheck | None
    switches: list[str]


def job_switches_spanned(job: Job) -> list[str]:
    """The leaf switches over the job's allocated nodes, by name. One query."""
    names = job.allocated_node_names
    if not names:
        return []
    leaves = (
        Node.objects.filter(cluster=job.cluster_id, name__in=names)
        .exclude(leaf_switch__isnull=True)
        .values_list("leaf_switch__name", flat=True)
    )
    return sorted(set(leaves))


def job_placement(job: Job) -> JobPlacement:
    """``job_placement_check`` and ``job_switches_spanned``, computed once per allocation:
    the check reads every node of the cluster, too much for a page polled every few
    seconds. Nothing to compute (and no query) before the job is placed. A placed job's
    nodes stay its nodes while it runs: the key names the job and its allocation."""
    if not job.allocated_nodes:
        return JobPlacement(check=None, switches=[])
    return cache.get_or_set(
        cache.JOB_PLACEMENT,
        cache.key_job_placement(
            job_id=job.id,
            allocated_nodes=job.allocated_nodes,
            nodelist_requested=job.nodelist_requested,
            switches_requested=job.switches_requested,
        ),
        lambda: JobPlacement(check=job_placement_check(job), switches=job_switches_spanned(job)),
    )


def job_placement_known(
    *, job_id: object, allocated_nodes: str, nodelist_requested: str, switches_requested: str
) -> JobPlacement | None:
    """What ``job_placement`` answers for this allocation if it needs no computing (the
    job is not placed, or its verdict is in the cache); None when it would compute it."""
    if not allocated_nodes:
        return JobPlacement(check=None, switches=[])
    found = cache.peek(
        cache.JOB_PLACEMENT,
        cache.key_job_placement(
            job_id=job_id,
            allocated_nodes=allocated_nodes,
            nodelist_requested=nodelist_requested,
            switches_requested=switches_requested,
        ),
    )
    return found if isinstance(found, JobPlacement) else None
