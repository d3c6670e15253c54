"""What a job asks for, checked against what the cluster has, before anything reaches Slurm.

``job_request_validate`` refuses, with the field and why, what the cluster cannot run
(from Gantry's synced inventory) and returns the full trainer config. The submit form,
the API, resume, drills and studies all go through it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from core.errors import FieldError
from jobs.recovery_settings import recovery_overrides_validate
from nodes.environment import NAME as ENV_NAME
from nodes.environment import environment_name_refused
from nodes.models import Cluster, Gpu, Node, Partition
from slurm import commands as slurm_commands
from slurm.hostlist import expand
from trainer.config import ConfigError
from trainer.config import validate as trainer_config_validate

CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class JobRequest:
    cluster: Cluster
    name: str
    config: dict[str, Any]
    partition: str
    nodes: int
    gpus_per_node: int
    gpu_type: str
    tasks_per_node: int
    cpus_per_task: int
    memory_mb: int | None
    time_limit_minutes: int
    nodelist: str
    switches: str
    environment: dict[str, str] | None = None
    # Nodes to leave out (``--exclude``, a node list expression); recovery's settings.
    exclude: str = ""
    recovery: dict[str, Any] | None = None


def validate_environment(
    environment: dict[str, str] | None, *, cluster: Cluster | None = None
) -> dict[str, str]:
    """Extra variables for the ranks: ``NAME: value``, each name on the allow-list of
    ``nodes.environment`` (the defaults and what ``cluster``'s operator added, never a
    hard-denied name) and each value printable. Refused (400) naming the variable and why.
    """
    if not environment:
        return {}
    if not isinstance(environment, dict):
        raise FieldError("environment", "must be an object of NAME: value")
    if len(environment) > 32:
        raise FieldError("environment", "at most 32 variables")
    extra = environment_extra_allowed(cluster)
    clean: dict[str, str] = {}
    for name, value in environment.items():
        why = environment_name_refused(name, extra)
        if why:
            shown = name if isinstance(name, str) and ENV_NAME.fullmatch(name) else repr(name)
            raise FieldError("environment", f"{shown} {why}")
        if not isinstance(value, str) or len(value) > 1024 or CONTROL_CHARACTERS.search(value):
            raise FieldError(
                "environment", f"{name}: a string of at most 1024 characters, no control characters"
            )
        clean[name] = value
    return clean


def environment_extra_allowed(cluster: Cluster | None) -> tuple[str, ...]:
    """What ``cluster``'s operator allows on top of the defaults (entries as stored)."""
    entries = getattr(cluster, "extra_allowed_environment", None) or ()
    return tuple(entry for entry in entries if isinstance(entry, str))


def validate_job_name(name: str) -> str:
    name = name.strip()
    if not name:
        raise FieldError("name", "a name is required")
    if len(name) > 128:
        raise FieldError("name", "at most 128 characters")
    if CONTROL_CHARACTERS.search(name):
        raise FieldError("name", "must not contain control characters such as newlines")
    return name


def _partition(request: JobRequest) -> Partition:
    cluster = request.cluster
    partition = Partition.objects.filter(
        cluster=cluster, name=request.partition, gone=False
    ).first()
    if partition is None:
        names = sorted(cluster.partitions.filter(gone=False).values_list("name", flat=True))
        known = ", ".join(names) or "none synced yet"
        raise FieldError(
            "partition", f"{request.partition!r} is not a partition of {cluster.name} ({known})"
        )
    return partition


def _check_counts(request: JobRequest, partition: Partition) -> None:
    if request.nodes < 1:
        raise FieldError("nodes", "at least 1")
    if request.tasks_per_node < 1:
        raise FieldError("tasks_per_node", "at least 1")
    if request.cpus_per_task < 1:
        raise FieldError("cpus_per_task", "at least 1")
    if request.gpus_per_node < 0:
        raise FieldError("gpus_per_node", "cannot be negative")
    if request.time_limit_minutes < 1:
        raise FieldError("time_limit_minutes", "at least 1 minute")
    if (
        partition.max_time_minutes is not None
        and request.time_limit_minutes > partition.max_time_minutes
    ):
        raise FieldError(
            "time_limit_minutes",
            f"partition {partition.name} allows at most {partition.max_time_minutes} minutes; "
            f"{request.time_limit_minutes} requested",
        )


def _candidates(request: JobRequest, partition: Partition) -> list[Node]:
    candidates = list(
        Node.objects.filter(
            cluster=request.cluster, partitions_text__contains=f",{partition.name},"
        )
        .exclude(state=Node.State.GONE)
        .prefetch_related("gpus")
    )
    if not candidates:
        raise FieldError(
            "partition", f"partition {partition.name} has no nodes (sync the cluster?)"
        )
    if request.nodes > len(candidates):
        raise FieldError(
            "nodes",
            f"partition {partition.name} has {len(candidates)} node"
            f"{'s' if len(candidates) != 1 else ''}; {request.nodes} requested",
        )
    return candidates


def _check_gpus(request: JobRequest, partition: Partition, candidates: list[Node]) -> None:
    def gpus_of(node: Node) -> list[Gpu]:
        gpus = list(node.gpus.all())
        return [g for g in gpus if g.gpu_type == request.gpu_type] if request.gpu_type else gpus

    if request.gpu_type and not any(gpus_of(node) for node in candidates):
        types = sorted({g.gpu_type for node in candidates for g in node.gpus.all() if g.gpu_type})
        raise FieldError(
            "gpu_type",
            f"partition {partition.name} has no {request.gpu_type!r} GPUs"
            f" ({', '.join(types) or 'no GPUs at all'})",
        )
    if not request.gpus_per_node:
        return
    most = max(len(gpus_of(node)) for node in candidates)
    kind = f"{request.gpu_type} " if request.gpu_type else ""
    if request.gpus_per_node > most:
        raise FieldError(
            "gpus_per_node",
            f"no node in partition {partition.name} has more than {most} {kind}GPU"
            f"{'s' if most != 1 else ''}; {request.gpus_per_node} requested",
        )
    enough = [node for node in candidates if len(gpus_of(node)) >= request.gpus_per_node]
    if len(enough) < request.nodes:
        raise FieldError(
            "nodes",
            f"only {len(enough)} node{'s' if len(enough) != 1 else ''} in partition "
            f"{partition.name} have {request.gpus_per_node} {kind}GPUs; "
            f"{request.nodes} requested",
        )


def _check_cpus_and_memory(
    request: JobRequest, partition: Partition, candidates: list[Node]
) -> None:
    cpus = request.cpus_per_task * request.tasks_per_node
    most_cpus = max(node.cpus_total for node in candidates)
    if cpus > most_cpus:
        raise FieldError(
            "cpus_per_task",
            f"{request.tasks_per_node} task(s) × {request.cpus_per_task} CPUs = {cpus} CPUs per "
            f"node, but nodes in {partition.name} have at most {most_cpus}",
        )
    if request.memory_mb is not None:
        most_memory = max(node.memory_mb for node in candidates)
        if request.memory_mb > most_memory:
            raise FieldError(
                "memory_mb",
                f"nodes in {partition.name} have at most {most_memory} MB; "
                f"{request.memory_mb} MB requested",
            )


def _check_placement_options(
    request: JobRequest, partition: Partition, candidates: list[Node]
) -> None:
    if request.nodelist:
        try:
            wanted = expand(request.nodelist)
            slurm_commands.check_hostlist(request.nodelist)
        except ValueError as error:
            raise FieldError("nodelist", f"not a node list expression: {error}") from None
        names = {node.name for node in candidates}
        unknown = [node for node in wanted if node not in names]
        if unknown:
            raise FieldError(
                "nodelist", f"not nodes of partition {partition.name}: {', '.join(unknown)}"
            )
        if len(wanted) > request.nodes:
            raise FieldError(
                "nodelist", f"{len(wanted)} nodes listed but only {request.nodes} requested"
            )
    if request.switches and not re.fullmatch(r"\d+(@\d+)?", request.switches):
        raise FieldError("switches", "use COUNT or COUNT@MINUTES, e.g. 1@10")
    if request.exclude:
        _check_exclude(request, partition, candidates)


class PerNodeAsk(Protocol):
    """What a request (or a job) asks of each node."""

    @property
    def gpu_type(self) -> str: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def cpus_per_task(self) -> int: ...
    @property
    def tasks_per_node(self) -> int: ...
    @property
    def memory_mb(self) -> int | None: ...


def node_fits(request: PerNodeAsk, node: Node) -> bool:
    """Whether one node of the request's partition has what the request asks per node:
    its GPUs (of the type), its tasks' CPUs, its memory."""
    gpus = [g for g in node.gpus.all() if not request.gpu_type or g.gpu_type == request.gpu_type]
    return (
        len(gpus) >= request.gpus_per_node
        and node.cpus_total >= request.cpus_per_task * request.tasks_per_node
        and (request.memory_mb is None or not node.memory_mb or node.memory_mb >= request.memory_mb)
    )


def _check_exclude(request: JobRequest, partition: Partition, candidates: list[Node]) -> None:
    try:
        left_out = set(expand(request.exclude))
        slurm_commands.check_hostlist(request.exclude)
    except ValueError as error:
        raise FieldError("exclude", f"not a node list expression: {error}") from None
    remaining = [
        node for node in candidates if node.name not in left_out and node_fits(request, node)
    ]
    if len(remaining) < request.nodes:
        raise FieldError(
            "exclude",
            f"leaving out {', '.join(sorted(left_out))} leaves {len(remaining)} node(s) of "
            f"{partition.name} that fit, {request.nodes} requested",
        )


def job_request_validate(request: JobRequest) -> dict[str, Any]:
    """Refuse, with the field and why, what the cluster cannot run; return the full config.

    Checked against Gantry's synced inventory, before anything reaches Slurm.
    """
    validate_job_name(request.name)
    try:
        config = trainer_config_validate(request.config).to_dict()
    except ConfigError as error:
        raise FieldError(f"config.{error.key}", error.why) from None
    partition = _partition(request)
    _check_counts(request, partition)
    candidates = _candidates(request, partition)
    _check_gpus(request, partition, candidates)
    _check_cpus_and_memory(request, partition, candidates)
    _check_placement_options(request, partition, candidates)
    validate_environment(request.environment, cluster=request.cluster)
    recovery_overrides_validate(request.recovery)
    return config
