"""The placement function's inputs and outputs, and the constants it works with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

USABLE_NOW_STATES = frozenset({"idle", "mixed"})
# Busy states that end by themselves: their nodes can be waited for.
WAITABLE_STATES = frozenset({"allocated", "mixed", "completing"})
# Nodes that may run a job now or soon; used to judge an actual placement.
HEALTHY_STATES = USABLE_NOW_STATES | WAITABLE_STATES
LINK_QUALITY = {"nvlink": 0, "pcie": 1, "unknown": 2}
# Health a node may have and still be proposed, and how much each is dispreferred.
HEALTH_PENALTY = {"ok": 0, "unknown": 0, "warning": 1}
# Acceptance findings (``Node.acceptance_state``): a convicted node is never proposed; a
# certified one is preferred over an untested one of the same health.
CONVICTED = "convicted"
ACCEPTANCE_PENALTY = {"certified": 0}
UNTESTED_PENALTY = 1
LINK_WORDS = {"nvlink": "NVLink", "pcie": "PCIe"}

VIRTUAL_ROOT = "(beyond known switches)"

# Per switch: most eligible nodes a part topped by it holds, by switch budget.
Tables = dict[str, list[int]]
# Per switch: its leaf children with nodes (most first), and its table before
# each other child was merged in.
Steps = dict[str, tuple[list[str], list[tuple[str, list[int]]]]]


def no_switch_name(node_name: str) -> str:
    return f"(no switch: {node_name})"


@dataclass(frozen=True)
class SwitchInfo:
    name: str
    parent: str | None
    # 0 = leaf, higher = closer to the root (informational; the tree comes from parent).
    level: int = 0


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str
    partitions: tuple[str, ...]
    leaf_switch: str | None
    gpu_type: str | None
    gpus_total: int
    gpus_free: int
    cpus_total: int
    cpus_free: int
    memory_mb: int
    memory_free_mb: int
    intra_node_link: str = "unknown"
    # When a busy node is expected to be free (whole node); naive means UTC.
    free_at: datetime | None = None
    # GPU/node health from the node probe: "critical" is never proposed, "warning" only
    # when no healthier node does as well, "ok" and "unknown" (never probed) are neutral.
    health: str = "unknown"
    # The newest acceptance finding: "certified", "convicted" or "" (never tested).
    acceptance: str = ""


@dataclass(frozen=True)
class PlacementRequest:
    nodes: int
    gpus_per_node: int
    partition: str | None = None
    gpu_type: str | None = None
    cpus_per_gpu: float | None = None
    memory_mb_per_gpu: int | None = None
    cpus_per_node: int | None = None
    memory_mb_per_node: int | None = None
    allow_wait: bool = True
    # Slurm's --switches=count@max-time: how long the job may wait for that switch count.
    max_wait_minutes: int = 10

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes must be at least 1, not {self.nodes}")
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node must not be negative, not {self.gpus_per_node}")
        if self.max_wait_minutes < 0:
            raise ValueError(f"max_wait_minutes must not be negative: {self.max_wait_minutes}")
        for name in ("cpus_per_gpu", "memory_mb_per_gpu", "cpus_per_node", "memory_mb_per_node"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, not {value}")

    @property
    def cpus_needed(self) -> int:
        per_gpu = math.ceil((self.cpus_per_gpu or 0) * self.gpus_per_node)
        return max(per_gpu, self.cpus_per_node or 0)

    @property
    def memory_mb_needed(self) -> int:
        per_gpu = (self.memory_mb_per_gpu or 0) * self.gpus_per_node
        return max(per_gpu, self.memory_mb_per_node or 0)


@dataclass(frozen=True)
class Placement:
    feasible: bool
    nodes: tuple[str, ...]
    # Compressed host list (``n[3-4]``); "" when infeasible.
    nodelist: str
    # Leaves used, then every switch up to and including the lowest common one.
    switches_spanned: tuple[str, ...]
    leaves: tuple[str, ...]
    lowest_common_switch: str | None
    # The fewest switches any placement of this request spans (0: no topology or infeasible).
    optimal_switch_count: int
    waits_for: tuple[str, ...]
    starts_at: datetime | None
    explanation: str
    reasons: tuple[str, ...]
    slurm_options: dict[str, str]
    topology_known: bool = True

    def to_sbatch_args(self) -> list[str]:
        """``["--nodelist=n[3-4]", "--switches=1@10"]``; [] when infeasible."""
        return [
            f"--{option}={self.slurm_options[option]}"
            for option in ("nodelist", "switches")
            if option in self.slurm_options
        ]


@dataclass(frozen=True)
class PlacementCheck:
    nodes: tuple[str, ...]
    switches_spanned: tuple[str, ...]
    leaves: tuple[str, ...]
    # None when no topology is known.
    optimal_switch_count: int | None
    more_switches_than_necessary: bool
    explanation: str


# ---------------------------------------------------------------------------
# Topology
