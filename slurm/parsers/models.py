"""What the parsers return: typed, frozen dataclasses of Slurm's objects."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from slurm.units import (
    Gres,
    tres_gpu_count,
)

# ---------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str
    state_flags: tuple[str, ...] = ()
    reason: str | None = None
    reason_set_by: str | None = None
    reason_changed_at: datetime | None = None
    cpus_total: int | None = None
    cpus_alloc: int | None = None
    memory_mb: int | None = None
    memory_alloc_mb: int | None = None
    memory_free_mb: int | None = None
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    active_features: tuple[str, ...] = ()
    gres: tuple[Gres, ...] = ()
    gres_used: tuple[Gres, ...] = ()
    address: str | None = None
    hostname: str | None = None
    port: int | None = None
    slurmd_version: str | None = None
    architecture: str | None = None
    operating_system: str | None = None
    sockets: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    boot_time: datetime | None = None
    last_busy: datetime | None = None
    tres: dict[str, str] = field(default_factory=dict)
    tres_used: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> tuple[Gres, ...]:
        return tuple(entry for entry in self.gres if entry.is_gpu)

    @property
    def gpu_count(self) -> int:
        return sum(entry.count for entry in self.gpus)

    @property
    def gpus_used(self) -> int:
        used = sum(entry.count for entry in self.gres_used if entry.is_gpu)
        if used or not self.tres_used:
            return used
        return tres_gpu_count(self.tres_used)

    @property
    def is_drained(self) -> bool:
        return "DRAIN" in self.state_flags


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...] = ()
    node_list_expr: str = ""
    default: bool = False
    max_time_minutes: int | None = None
    default_time_minutes: int | None = None
    state: str = "up"
    total_cpus: int | None = None
    total_nodes: int | None = None
    max_nodes: int | None = None
    hidden: bool = False
    tres: dict[str, str] = field(default_factory=dict)
    # Who Slurm lets submit there, as it prints them (``ALL``, or comma lists of Slurm
    # accounts / Unix groups); "" where it printed nothing.
    allow_accounts: str = ""
    deny_accounts: str = ""
    allow_groups: str = ""

    @property
    def open_to_all(self) -> bool:
        """Slurm itself lets every account and group submit here (what it printed says so;
        nothing printed is not "all")."""
        return (
            self.allow_accounts.upper() == "ALL"
            and self.allow_groups.upper() == "ALL"
            and self.deny_accounts.strip() in ("", "(null)")
        )


@dataclass(frozen=True)
class Switch:
    name: str
    level: int
    parent: str | None = None
    nodes: tuple[str, ...] = ()
    node_list_expr: str = ""
    switches: tuple[str, ...] = ()
    link_speed: int | None = None


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str | None = None
    comment: str | None = None
    state: str = "UNKNOWN"
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    node_list_expr: str = ""
    partition: str | None = None
    user: str | None = None
    account: str | None = None
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    time_limit_minutes: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    alloc_tres: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    gpus_per_node: int | None = None
    working_directory: str | None = None
    stdout_path: str | None = None
    source: str = ""

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_JOB_STATES

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_JOB_STATES


FINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
ACTIVE_JOB_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)
JOB_STATE_ALIASES = {
    "CA": "CANCELLED",
    "CD": "COMPLETED",
    "CF": "CONFIGURING",
    "CG": "COMPLETING",
    "F": "FAILED",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "PD": "PENDING",
    "PR": "PREEMPTED",
    "R": "RUNNING",
    "S": "SUSPENDED",
    "TO": "TIMEOUT",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "RQ": "REQUEUED",
}


@dataclass(frozen=True)
class ClusterInfo:
    slurm_version: str
    cluster_name: str | None
    accounting_available: bool
    accounting_error: str | None = None
    partitions: tuple[Partition, ...] = ()
    topology_plugin: str | None = None
    json_supported: bool | None = None

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", self.slurm_version)[:3])


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[SlurmNode, ...]
    partitions: tuple[Partition, ...]
    switches: tuple[Switch, ...]

    @property
    def gpu_count(self) -> int:
        return sum(node.gpu_count for node in self.nodes)
