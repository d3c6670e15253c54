"""Which nodes may take the job, in which order of preference, and the chosen ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from nodes.placement.model import (
    ACCEPTANCE_PENALTY,
    CONVICTED,
    HEALTH_PENALTY,
    HEALTHY_STATES,
    LINK_QUALITY,
    UNTESTED_PENALTY,
    USABLE_NOW_STATES,
    WAITABLE_STATES,
    NodeInfo,
    PlacementRequest,
    Steps,
    Tables,
)
from nodes.placement.tree import Topology, coverage_tables, first_reaching, reconstruct
from slurm.hostlist import compress, natural_key


@dataclass(frozen=True)
class Candidate:
    node: NodeInfo
    attachment: str
    waits: bool
    free_at: datetime | None
    # Preference without the name: (waits, free time, health, link quality, stranded GPUs).
    rank: tuple[int, float, int, int, int]

    @property
    def key(self) -> tuple[tuple[int, float, int, int, int], tuple[str, str, int, int, str]]:
        return (self.rank, natural_key(self.node.name))


def utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def when(moment: datetime) -> str:
    return utc(moment).strftime("%Y-%m-%d %H:%M UTC")


def plural(count: int, word: str, many: str | None = None) -> str:
    return f"{count} {word if count == 1 else (many or word + 's')}"


def state_of(node: NodeInfo) -> str:
    return node.state.strip().lower()


def match_misfit(node: NodeInfo, request: PlacementRequest) -> str | None:
    """Why the node is not what was asked for (partition, GPU type); None if it is."""
    if request.partition is not None and request.partition not in node.partitions:
        have = ",".join(node.partitions) or "none"
        return f"partition {have}, not {request.partition}"
    if request.gpu_type is not None and (node.gpu_type or "").lower() != request.gpu_type.lower():
        return f"GPU type {node.gpu_type or 'none'}, not {request.gpu_type}"
    return None


def shape_misfit(node: NodeInfo, request: PlacementRequest) -> str | None:
    """Why the node could not host the job even when empty; None if it could."""
    gpus = request.gpus_per_node
    if node.gpus_total < gpus:
        return f"only {plural(node.gpus_total, 'GPU')} in total (needs {gpus})"
    # Balance of the node itself: a thin node stays thin even when empty.
    if request.cpus_per_gpu and node.gpus_total:
        per_gpu = node.cpus_total / node.gpus_total
        if per_gpu < request.cpus_per_gpu:
            return f"{per_gpu:g} CPUs per GPU (needs {request.cpus_per_gpu:g})"
    if request.memory_mb_per_gpu and node.gpus_total:
        per_gpu_mb = node.memory_mb / node.gpus_total
        if per_gpu_mb < request.memory_mb_per_gpu:
            return f"{per_gpu_mb:g} MB memory per GPU (needs {request.memory_mb_per_gpu})"
    if node.cpus_total < request.cpus_needed:
        return f"only {plural(node.cpus_total, 'CPU')} in total (needs {request.cpus_needed})"
    if node.memory_mb < request.memory_mb_needed:
        return f"only {node.memory_mb} MB memory in total (needs {request.memory_mb_needed})"
    return None


def static_misfit(node: NodeInfo, request: PlacementRequest) -> str | None:
    return match_misfit(node, request) or shape_misfit(node, request)


def free_misfit_of(node: NodeInfo, request: PlacementRequest) -> str | None:
    """Why an idle/mixed node cannot take the job now; None if it can."""
    gpus = request.gpus_per_node
    if node.gpus_free < gpus:
        kind = f" of type {node.gpu_type}" if node.gpu_type else ""
        suffix = "" if node.gpus_free == 1 else "s"
        return f"only {node.gpus_free} free GPU{suffix}{kind} (needs {gpus})"
    if node.cpus_free < request.cpus_needed:
        return f"only {plural(node.cpus_free, 'free CPU')} (needs {request.cpus_needed})"
    if node.memory_free_mb < request.memory_mb_needed:
        return f"only {node.memory_free_mb} MB free memory (needs {request.memory_mb_needed})"
    return None


def preference_of_health(node: NodeInfo) -> int | None:
    """GPU health first (ok/unknown over warning), then acceptance (certified over
    untested); None: never proposed (critical health, or convicted by acceptance)."""
    health = HEALTH_PENALTY.get(node.health.strip().lower())
    acceptance = node.acceptance.strip().lower()
    if health is None or acceptance == CONVICTED:
        return None
    return health * (UNTESTED_PENALTY + 1) + ACCEPTANCE_PENALTY.get(acceptance, UNTESTED_PENALTY)


def unhealthy_reason(node: NodeInfo) -> str:
    if node.acceptance.strip().lower() == CONVICTED:
        return "convicted by an acceptance run"
    return f"GPU health {node.health or 'unknown'}"


@dataclass
class Sorting:
    now: list[Candidate]
    waitable: list[Candidate]
    reasons: dict[str, str]
    # Funnel counts for naming the binding constraint.
    matching: int = 0
    shaped: int = 0
    healthy: int = 0


def sort_nodes(nodes: Sequence[NodeInfo], topology: Topology, request: PlacementRequest) -> Sorting:
    sorting = Sorting(now=[], waitable=[], reasons={})
    gpus = request.gpus_per_node
    for node in nodes:
        state = state_of(node)
        misfit = match_misfit(node, request)
        if misfit is not None:
            sorting.reasons[node.name] = misfit
            continue
        sorting.matching += 1
        misfit = shape_misfit(node, request)
        if misfit is not None:
            sorting.reasons[node.name] = misfit
            continue
        sorting.shaped += 1
        if state not in HEALTHY_STATES:
            sorting.reasons[node.name] = state or "unknown state"
            continue
        health = preference_of_health(node)
        if health is None:
            sorting.reasons[node.name] = unhealthy_reason(node)
            continue
        sorting.healthy += 1
        link = LINK_QUALITY.get(node.intra_node_link.lower(), LINK_QUALITY["unknown"])
        attachment = topology.attachment.get(node.name, "")
        free_misfit = free_misfit_of(node, request) if state in USABLE_NOW_STATES else None
        if state in USABLE_NOW_STATES and free_misfit is None:
            rank = (0, 0.0, health, link, node.gpus_free - gpus)
            sorting.now.append(Candidate(node, attachment, False, None, rank))
        elif state not in WAITABLE_STATES:
            # Idle but short of free resources: nothing running will free them.
            sorting.reasons[node.name] = free_misfit or state
        elif node.free_at is None:
            sorting.reasons[node.name] = free_misfit or f"{state}, no expected free time"
        elif not request.allow_wait:
            sorting.reasons[node.name] = f"{free_misfit or state}; waiting not allowed"
        else:
            free_at = utc(node.free_at)
            rank = (1, free_at.timestamp(), health, link, node.gpus_total - gpus)
            sorting.waitable.append(Candidate(node, attachment, True, free_at, rank))
    return sorting


def summarise(reasons: dict[str, str]) -> tuple[str, ...]:
    """``{"n2": "drained", "n5": "drained"}`` -> ``("n[2,5]: drained",)``."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in reasons.items():
        by_reason.setdefault(reason, []).append(name)
    lines = [
        (natural_key(min(names, key=natural_key)), f"{compress(names)}: {reason}")
        for reason, names in by_reason.items()
    ]
    return tuple(line for _key, line in sorted(lines))


# ---------------------------------------------------------------------------
# Choosing


def selection_score(chosen: Sequence[Candidate]) -> tuple[object, ...]:
    """Worst node first, then names: smaller is better."""
    ranks = sorted((c.rank for c in chosen), reverse=True)
    return (tuple(ranks), tuple(sorted(natural_key(c.node.name) for c in chosen)))


def best_of(pool: Sequence[Candidate], count: int) -> list[Candidate]:
    return sorted(pool, key=lambda c: c.key)[:count]


def optimum_of(
    topology: Topology, pool: Sequence[Candidate], need: int, cap: int | None = None
) -> tuple[int | None, Tables, Steps, dict[str, int]]:
    """The fewest switches spanning ``need`` nodes of ``pool`` (None: impossible)."""
    counts: dict[str, int] = {}
    for candidate in pool:
        counts[candidate.attachment] = counts.get(candidate.attachment, 0) + 1
    tables, steps = coverage_tables(topology, counts, need, cap)
    reached = [b for table in tables.values() if (b := first_reaching(table, need)) is not None]
    return (min(reached) if reached else None), tables, steps, counts


def choose(topology: Topology, pool: list[Candidate], need: int) -> tuple[list[Candidate], int]:
    """N candidates spanning the fewest switches, best by preference; and that count."""
    if not topology.known:
        return best_of(pool, need), 0
    optimum, _tables, _steps, _counts = optimum_of(topology, pool, need)
    assert optimum is not None
    # Smallest preference threshold at which an optimal placement still exists.
    thresholds = sorted({c.rank for c in pool})
    low, high = 0, len(thresholds) - 1
    while low < high:
        middle = (low + high) // 2
        subset = [c for c in pool if c.rank <= thresholds[middle]]
        found, *_rest = optimum_of(topology, subset, need, cap=optimum)
        if found is not None and found <= optimum:
            high = middle
        else:
            low = middle + 1
    restricted = [c for c in pool if c.rank <= thresholds[low]]
    _found, tables, steps, counts = optimum_of(topology, restricted, need, cap=optimum)
    by_attachment: dict[str, list[Candidate]] = {}
    for candidate in restricted:
        by_attachment.setdefault(candidate.attachment, []).append(candidate)
    best: list[Candidate] | None = None
    best_score: tuple[object, ...] | None = None
    for switch in sorted(tables, key=natural_key):
        if first_reaching(tables[switch], need) != optimum:
            continue
        attachments = reconstruct(switch, optimum, tables, steps, counts, need)
        chosen = best_of([c for a in attachments for c in by_attachment.get(a, [])], need)
        score = selection_score(chosen)
        if best_score is None or score < best_score:
            best, best_score = chosen, score
    assert best is not None and len(best) == need
    return best, optimum


# ---------------------------------------------------------------------------
# Words
