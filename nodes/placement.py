"""Topology-aware placement advice: where an N-node × G-GPU job should run.

Pure: no Django, no SSH, no I/O. The caller builds ``NodeInfo``/``SwitchInfo``
from its rows; ``propose_placement`` answers with a ``Placement`` (nodes, the
switches the job's all-reduce traffic crosses, an explanation, Slurm options)
and ``placement_quality`` judges where Slurm actually put a job.

Switches spanned
----------------
Every node hangs off one *attachment switch* (its ``leaf_switch``). The
switches a set of nodes spans are the switches of the smallest connected part
of the switch tree that contains all their attachment switches: one attachment
switch spans just itself (1); several span every switch on the paths from each
of them up to and including their lowest common ancestor. Two leaves under one
spine span 3; two leaves under different aggregation switches of one spine
span 5 (2 leaves + 2 aggregation switches + the spine).

Gaps in the tree are filled in so that this is always defined: a node without
a leaf switch hangs off its own implicit switch (we cannot claim two such
nodes share one); a ``leaf_switch`` or ``parent`` that names no known switch
becomes an implicit switch of that name with no parent; and when the tree has
several roots, a virtual root joins them (traffic between them crosses fabric
we know nothing about, so it counts as a switch). A cluster with no switches
and no node with a leaf switch has *no topology*: switch counts do not apply.

The optimum, exactly
--------------------
Any connected part T of a rooted tree has a single top switch r and is closed
under "parent of a member other than r". A node selection S of N nodes spans
exactly such a part (top = the lowest common ancestor). Conversely any such T
whose attachment switches hold ≥ N eligible nodes contains a selection of N
nodes, and that selection spans a subset of T. So

    optimum = min over switches r, over connected parts T topped by r that
              hold ≥ N eligible nodes, of |T|.

For every switch r and budget b, ``_coverage_tables`` computes the most
eligible nodes a part topped by r with at most b switches can hold (capped at
N): r itself (its directly attached nodes), plus, for each child, either
nothing or a part topped by that child — choices that are independent and whose
sizes add. That is the tree-knapsack recurrence, solved exactly by merging
children one at a time (max-plus convolution). Children that are leaves are
merged in one step: j of them cost j switches and hold at most the j largest
counts. The optimum is the smallest b at which some table reaches N. The cost
is O(switches²) in the worst case and far less in practice, because a table
stops growing once it reaches N.

This is *not* "take the lowest switch whose subtree holds N nodes, then the
fewest leaves under it": a lower switch can need many small leaves while a
higher one needs few big leaves, and the fewest leaves can sit under more
aggregation switches than a few more leaves would (both cases are in the
tests).

Choosing among optimal placements
---------------------------------
Each eligible node has a preference key, smaller is better: usable now before
waited for; among waited-for nodes, the earliest ``free_at``; NVLink over PCIe
over unknown; fewest GPUs left stranded on the node; then the natural name
order. Among the placements with the optimal switch count:

* the worst node is as good as it can be: the eligible nodes are cut at the
  smallest key for which an optimal placement still exists (binary search,
  one table computation per probe) — so nobody waits, or waits as little as
  possible, when an optimal placement allows it, and a PCIe node is used only
  when no optimal placement avoids one;
* every top switch that reaches the optimum with those nodes yields one
  candidate (within the chosen attachment switches: the N best nodes by key),
  and the candidates are compared worst node first, then by names.

With one attachment switch (the common case) this compares every possible
leaf, so it is exact; across several leaves the leaf choice under one top
switch is a deterministic tie-break, not a search.

Waiting
-------
Nodes in idle/mixed state with enough free GPUs, CPUs and memory are usable
now. Only when fewer than N nodes are usable now (and the request allows
waiting) may allocated/mixed/completing nodes with a known ``free_at`` join,
as if their whole capacity frees at that time. Drained, draining, down, fail,
failing, inval, error, gone, unknown, reserved and future nodes are never
proposed.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from nodes.slurm.hostlist import compress, natural_key

USABLE_NOW_STATES = frozenset({"idle", "mixed"})
# Busy states that end by themselves: their nodes can be waited for.
WAITABLE_STATES = frozenset({"allocated", "mixed", "completing"})
# Nodes that may run a job now or soon; used to judge an actual placement.
HEALTHY_STATES = USABLE_NOW_STATES | WAITABLE_STATES
LINK_QUALITY = {"nvlink": 0, "pcie": 1, "unknown": 2}
LINK_WORDS = {"nvlink": "NVLink", "pcie": "PCIe"}

VIRTUAL_ROOT = "(beyond known switches)"

# Per switch: most eligible nodes a part topped by it holds, by switch budget.
_Tables = dict[str, list[int]]
# Per switch: its leaf children with nodes (most first), and its table before
# each other child was merged in.
_Steps = dict[str, tuple[list[str], list[tuple[str, list[int]]]]]


def _no_switch_name(node_name: str) -> str:
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


class _Topology:
    """The switch tree with implicit and virtual switches filled in."""

    def __init__(self, nodes: Sequence[NodeInfo], switches: Sequence[SwitchInfo]) -> None:
        self.known = bool(switches) or any(node.leaf_switch for node in nodes)
        self.virtual: set[str] = set()
        parent: dict[str, str | None] = {}
        for switch in switches:
            if switch.name in parent and parent[switch.name] != switch.parent:
                raise ValueError(f"switch {switch.name!r} is listed twice with different parents")
            parent[switch.name] = switch.parent or None
        # Parents and leaves nobody described are switches without a parent.
        for name in [p for p in parent.values() if p is not None]:
            parent.setdefault(name, None)
        self.attachment: dict[str, str] = {}
        for node in nodes:
            if node.leaf_switch:
                parent.setdefault(node.leaf_switch, None)
                self.attachment[node.name] = node.leaf_switch
            elif self.known:
                own = _no_switch_name(node.name)
                parent[own] = None
                self.virtual.add(own)
                self.attachment[node.name] = own
        roots = [name for name, up in parent.items() if up is None]
        if len(roots) > 1:
            for root in roots:
                parent[root] = VIRTUAL_ROOT
            parent[VIRTUAL_ROOT] = None
            self.virtual.add(VIRTUAL_ROOT)
        self.parent = parent
        self.depth: dict[str, int] = {}
        for name in sorted(parent):
            self._depth_of(name)
        self.children: dict[str, list[str]] = {name: [] for name in parent}
        for name in sorted(parent, key=natural_key):
            up = parent[name]
            if up is not None:
                self.children[up].append(name)

    def _depth_of(self, name: str) -> int:
        chain: list[str] = []
        current: str | None = name
        while current is not None and current not in self.depth:
            if current in chain:
                raise ValueError(f"switch tree has a cycle through {current!r}")
            chain.append(current)
            current = self.parent[current]
        depth = -1 if current is None else self.depth[current]
        for switch in reversed(chain):
            depth += 1
            self.depth[switch] = depth
        return self.depth[name]

    def path_up(self, name: str) -> list[str]:
        path = [name]
        while (up := self.parent[path[-1]]) is not None:
            path.append(up)
        return path

    def span(self, attachments: Iterable[str]) -> tuple[list[str], str | None]:
        """Switches spanned by nodes on these attachment switches, and the top one."""
        used = sorted(set(attachments), key=natural_key)
        if not used:
            return [], None
        if len(used) == 1:
            return used, used[0]
        paths = [self.path_up(name) for name in used]
        common = set(paths[0]).intersection(*paths[1:])
        top = max(common, key=lambda name: self.depth[name])
        spanned: set[str] = set()
        for path in paths:
            for switch in path:
                spanned.add(switch)
                if switch == top:
                    break
        others = sorted(spanned - set(used), key=lambda s: (-self.depth[s], natural_key(s)))
        return used + others, top


def _coverage_tables(
    topology: _Topology, counts: dict[str, int], need: int, cap: int | None = None
) -> tuple[_Tables, _Steps]:
    """Per switch r: table[b] = most nodes (≤ need) a part topped by r holds with ≤ b switches.

    Also returns, per switch, what reconstruction needs: its leaf children with
    nodes (best first) and the table before each other child was merged in.
    """
    tables: _Tables = {}
    steps: _Steps = {}
    limit = cap if cap is not None else len(topology.parent)
    for switch in sorted(topology.parent, key=lambda s: -topology.depth[s]):
        kids = topology.children[switch]
        leaf_kids = [k for k in kids if not topology.children[k] and counts.get(k, 0) > 0]
        leaf_kids.sort(key=lambda k: -counts[k])
        table = [0, min(need, counts.get(switch, 0))]
        running = table[1]
        for kid in leaf_kids:
            if running >= need or len(table) > limit:
                break
            running = min(need, running + counts[kid])
            table.append(running)
        merges: list[tuple[str, list[int]]] = []
        for kid in kids:
            kid_table = tables.get(kid)
            if not topology.children[kid] or not kid_table or kid_table[-1] == 0:
                continue
            if table[-1] >= need and len(table) == 2:
                break
            merges.append((kid, table))
            table = _merge(table, kid_table, need, limit)
        tables[switch] = table
        steps[switch] = (leaf_kids, merges)
    return tables, steps


def _merge(table: list[int], kid: list[int], need: int, limit: int) -> list[int]:
    """Max-plus merge: the top switch (index ≥ 1) plus nothing or a part under ``kid``."""
    size = min(limit + 1, len(table) + len(kid) - 1)
    merged = table[:size] + [0] * (size - len(table))
    for kid_budget in range(1, len(kid)):
        gain = kid[kid_budget]
        # A bigger budget that holds no more nodes is never worth spending.
        if gain == kid[kid_budget - 1]:
            continue
        for own in range(1, min(len(table), size - kid_budget)):
            value = table[own] + gain
            if value > merged[own + kid_budget]:
                merged[own + kid_budget] = value
    for budget in range(1, size):
        merged[budget] = min(need, max(merged[budget], merged[budget - 1]))
        if merged[budget] >= need:
            return merged[: budget + 1]
    return merged


def _first_reaching(table: list[int], need: int) -> int | None:
    for budget, value in enumerate(table):
        if value >= need and budget > 0:
            return budget
    return None


def _reconstruct(
    switch: str,
    budget: int,
    tables: _Tables,
    steps: _Steps,
    counts: dict[str, int],
    need: int,
) -> list[str]:
    """Attachment switches of a part topped by ``switch``, ≤ budget switches, reaching its table."""
    target = tables[switch][min(budget, len(tables[switch]) - 1)]
    budget = min(budget, len(tables[switch]) - 1)
    leaf_kids, merges = steps[switch]
    chosen: list[str] = []
    for kid, before in reversed(merges):
        kid_table = tables[kid]
        for kid_budget in range(0, min(len(kid_table), budget)):
            own = budget - kid_budget
            if own < len(before) and min(need, before[own] + kid_table[kid_budget]) >= target:
                break
        else:  # pragma: no cover - the table was built from these very values
            raise AssertionError("placement table does not reconstruct")
        if kid_budget:
            chosen += _reconstruct(kid, kid_budget, tables, steps, counts, need)
            target = max(0, target - kid_table[kid_budget])
        budget -= kid_budget
    held = counts.get(switch, 0)
    if held:
        chosen.append(switch)
    for kid in leaf_kids[: max(0, budget - 1)]:
        if held >= target:
            break
        chosen.append(kid)
        held += counts[kid]
    return chosen


# ---------------------------------------------------------------------------
# Eligibility


@dataclass(frozen=True)
class _Candidate:
    node: NodeInfo
    attachment: str
    waits: bool
    free_at: datetime | None
    # Preference without the name: (waits, free time, link quality, stranded GPUs).
    rank: tuple[int, float, int, int]

    @property
    def key(self) -> tuple[tuple[int, float, int, int], tuple[str, str, int, int, str]]:
        return (self.rank, natural_key(self.node.name))


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _when(moment: datetime) -> str:
    return _utc(moment).strftime("%Y-%m-%d %H:%M UTC")


def _plural(count: int, word: str, many: str | None = None) -> str:
    return f"{count} {word if count == 1 else (many or word + 's')}"


def _state(node: NodeInfo) -> str:
    return node.state.strip().lower()


def _match_misfit(node: NodeInfo, request: PlacementRequest) -> str | None:
    """Why the node is not what was asked for (partition, GPU type); None if it is."""
    if request.partition is not None and request.partition not in node.partitions:
        have = ",".join(node.partitions) or "none"
        return f"partition {have}, not {request.partition}"
    if request.gpu_type is not None and (node.gpu_type or "").lower() != request.gpu_type.lower():
        return f"GPU type {node.gpu_type or 'none'}, not {request.gpu_type}"
    return None


def _shape_misfit(node: NodeInfo, request: PlacementRequest) -> str | None:
    """Why the node could not host the job even when empty; None if it could."""
    gpus = request.gpus_per_node
    if node.gpus_total < gpus:
        return f"only {_plural(node.gpus_total, 'GPU')} in total (needs {gpus})"
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
        return f"only {_plural(node.cpus_total, 'CPU')} in total (needs {request.cpus_needed})"
    if node.memory_mb < request.memory_mb_needed:
        return f"only {node.memory_mb} MB memory in total (needs {request.memory_mb_needed})"
    return None


def _static_misfit(node: NodeInfo, request: PlacementRequest) -> str | None:
    return _match_misfit(node, request) or _shape_misfit(node, request)


def _free_misfit(node: NodeInfo, request: PlacementRequest) -> str | None:
    """Why an idle/mixed node cannot take the job now; None if it can."""
    gpus = request.gpus_per_node
    if node.gpus_free < gpus:
        kind = f" of type {node.gpu_type}" if node.gpu_type else ""
        plural = "" if node.gpus_free == 1 else "s"
        return f"only {node.gpus_free} free GPU{plural}{kind} (needs {gpus})"
    if node.cpus_free < request.cpus_needed:
        return f"only {_plural(node.cpus_free, 'free CPU')} (needs {request.cpus_needed})"
    if node.memory_free_mb < request.memory_mb_needed:
        return f"only {node.memory_free_mb} MB free memory (needs {request.memory_mb_needed})"
    return None


@dataclass
class _Sorting:
    now: list[_Candidate]
    waitable: list[_Candidate]
    reasons: dict[str, str]
    # Funnel counts for naming the binding constraint.
    matching: int = 0
    shaped: int = 0
    healthy: int = 0


def _sort_nodes(
    nodes: Sequence[NodeInfo], topology: _Topology, request: PlacementRequest
) -> _Sorting:
    sorting = _Sorting(now=[], waitable=[], reasons={})
    gpus = request.gpus_per_node
    for node in nodes:
        state = _state(node)
        misfit = _match_misfit(node, request)
        if misfit is not None:
            sorting.reasons[node.name] = misfit
            continue
        sorting.matching += 1
        misfit = _shape_misfit(node, request)
        if misfit is not None:
            sorting.reasons[node.name] = misfit
            continue
        sorting.shaped += 1
        if state not in HEALTHY_STATES:
            sorting.reasons[node.name] = state or "unknown state"
            continue
        sorting.healthy += 1
        link = LINK_QUALITY.get(node.intra_node_link.lower(), LINK_QUALITY["unknown"])
        attachment = topology.attachment.get(node.name, "")
        free_misfit = _free_misfit(node, request) if state in USABLE_NOW_STATES else None
        if state in USABLE_NOW_STATES and free_misfit is None:
            rank = (0, 0.0, link, node.gpus_free - gpus)
            sorting.now.append(_Candidate(node, attachment, False, None, rank))
        elif state not in WAITABLE_STATES:
            # Idle but short of free resources: nothing running will free them.
            sorting.reasons[node.name] = free_misfit or state
        elif node.free_at is None:
            sorting.reasons[node.name] = free_misfit or f"{state}, no expected free time"
        elif not request.allow_wait:
            sorting.reasons[node.name] = f"{free_misfit or state}; waiting not allowed"
        else:
            free_at = _utc(node.free_at)
            rank = (1, free_at.timestamp(), link, node.gpus_total - gpus)
            sorting.waitable.append(_Candidate(node, attachment, True, free_at, rank))
    return sorting


def _summarise(reasons: dict[str, str]) -> tuple[str, ...]:
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


def _selection_score(chosen: Sequence[_Candidate]) -> tuple[object, ...]:
    """Worst node first, then names: smaller is better."""
    ranks = sorted((c.rank for c in chosen), reverse=True)
    return (tuple(ranks), tuple(sorted(natural_key(c.node.name) for c in chosen)))


def _best_of(pool: Sequence[_Candidate], count: int) -> list[_Candidate]:
    return sorted(pool, key=lambda c: c.key)[:count]


def _optimum(
    topology: _Topology, pool: Sequence[_Candidate], need: int, cap: int | None = None
) -> tuple[int | None, _Tables, _Steps, dict[str, int]]:
    """The fewest switches spanning ``need`` nodes of ``pool`` (None: impossible)."""
    counts: dict[str, int] = {}
    for candidate in pool:
        counts[candidate.attachment] = counts.get(candidate.attachment, 0) + 1
    tables, steps = _coverage_tables(topology, counts, need, cap)
    reached = [b for table in tables.values() if (b := _first_reaching(table, need)) is not None]
    return (min(reached) if reached else None), tables, steps, counts


def _choose(topology: _Topology, pool: list[_Candidate], need: int) -> tuple[list[_Candidate], int]:
    """N candidates spanning the fewest switches, best by preference; and that count."""
    if not topology.known:
        return _best_of(pool, need), 0
    optimum, _tables, _steps, _counts = _optimum(topology, pool, need)
    assert optimum is not None
    # Smallest preference threshold at which an optimal placement still exists.
    thresholds = sorted({c.rank for c in pool})
    low, high = 0, len(thresholds) - 1
    while low < high:
        middle = (low + high) // 2
        subset = [c for c in pool if c.rank <= thresholds[middle]]
        found, *_rest = _optimum(topology, subset, need, cap=optimum)
        if found is not None and found <= optimum:
            high = middle
        else:
            low = middle + 1
    restricted = [c for c in pool if c.rank <= thresholds[low]]
    _found, tables, steps, counts = _optimum(topology, restricted, need, cap=optimum)
    by_attachment: dict[str, list[_Candidate]] = {}
    for candidate in restricted:
        by_attachment.setdefault(candidate.attachment, []).append(candidate)
    best: list[_Candidate] | None = None
    best_score: tuple[object, ...] | None = None
    for switch in sorted(tables, key=natural_key):
        if _first_reaching(tables[switch], need) != optimum:
            continue
        attachments = _reconstruct(switch, optimum, tables, steps, counts, need)
        chosen = _best_of([c for a in attachments for c in by_attachment.get(a, [])], need)
        score = _selection_score(chosen)
        if best_score is None or score < best_score:
            best, best_score = chosen, score
    assert best is not None and len(best) == need
    return best, optimum


# ---------------------------------------------------------------------------
# Words


def _and(words: Sequence[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def _binding_constraint(sorting: _Sorting, request: PlacementRequest, total: int) -> str:
    need = request.nodes
    where = f" in partition {request.partition}" if request.partition else ""
    kind = f"{request.gpu_type} " if request.gpu_type else ""
    gpus = f"{request.gpus_per_node} {kind}GPU{'' if request.gpus_per_node == 1 else 's'}"
    extra = []
    if request.cpus_needed:
        extra.append(f"{request.cpus_needed} CPUs")
    if request.memory_mb_needed:
        extra.append(f"{request.memory_mb_needed} MB memory")
    shape = gpus + (" with " + _and(extra) if extra else "")

    def only(count: int, singular: str, plural: str) -> str:
        if count == 0:
            return f"no node{where} {singular}"
        return f"only {_plural(count, 'node')}{where} {singular if count == 1 else plural}"

    if total < need:
        return f"the cluster has only {_plural(total, 'node')}; {need} requested"
    if sorting.matching < need:
        what = f"{kind}GPUs" if request.gpu_type else "nodes"
        return f"{only(sorting.matching, 'has', 'have')} {what}; {need} requested"
    if sorting.shaped < need:
        return f"{only(sorting.shaped, 'can', 'can')} hold {shape}; {need} requested"
    if sorting.healthy < need:
        holding = f"that can hold {shape}"
        return (
            f"{only(sorting.healthy, holding + ' is', holding + ' are')} up (the rest are "
            f"drained, down or otherwise unavailable); {need} requested"
        )
    usable = len(sorting.now) + len(sorting.waitable)
    waiting = " or become free at a known time" if request.allow_wait else ""
    return f"{only(usable, 'has', 'have')} {shape} free{waiting}; {need} requested"


def _explain(
    topology: _Topology,
    chosen: Sequence[_Candidate],
    spanned: Sequence[str],
    leaves: Sequence[str],
    top: str | None,
    pool: Sequence[_Candidate],
    request: PlacementRequest,
) -> str:
    names = [c.node.name for c in chosen]
    nodelist = compress(names)
    count = len(chosen)
    states = {_state(c.node) for c in chosen if not c.waits}
    waited = [c for c in chosen if c.waits]
    adjective = "idle " if not waited and states == {"idle"} else ""
    noun = f"{count} {adjective}node{'' if count == 1 else 's'}"
    types = {c.node.gpu_type for c in chosen}
    gpu_type = request.gpu_type or (types.pop() if len(types) == 1 else None)
    per_node = f"{request.gpus_per_node} × {gpu_type or 'GPU'}" + (" each" if count > 1 else "")
    links = sorted({c.node.intra_node_link.lower() for c in chosen} & set(LINK_WORDS))
    link_words = ""
    if len(links) == 1 and all(c.node.intra_node_link.lower() == links[0] for c in chosen):
        link_words = f"; {LINK_WORDS[links[0]]} inside each node"
    elif links:
        by_link = {
            link: compress(c.node.name for c in chosen if c.node.intra_node_link.lower() == link)
            for link in links
        }
        link_words = "; " + ", ".join(f"{LINK_WORDS[k]} inside {v}" for k, v in by_link.items())
    if not topology.known:
        placed = (
            f"{noun} ({nodelist}), {per_node}; no topology known, so switches were not compared"
        )
    elif count == 1 or len(leaves) == 1:
        leaf = leaves[0]
        placed = f"{noun} under {leaf} ({nodelist}), {per_node}"
        if count == 1:
            placed += "; one node, so all-reduce traffic stays inside it"
        else:
            up = topology.parent.get(leaf)
            beyond = f"stays off {up}" if up and up not in topology.virtual else "stays on it"
            placed += f"; one leaf switch, so all-reduce traffic {beyond}"
    else:
        held = Counter(c.attachment for c in pool)
        fullest = min(held, key=lambda a: (-held[a], natural_key(a)))
        fullest_count = held[fullest]
        crossed = [s for s in spanned if s not in leaves]
        placed = (
            f"{noun} across {_and(list(leaves))} ({nodelist}), {per_node}: no single leaf has "
            f"{count} usable nodes (the fullest, {fullest}, has {fullest_count}); all-reduce "
            f"traffic crosses {_and(crossed)} — {len(spanned)} switches, the fewest possible"
        )
    placed += link_words
    if waited:
        last = max(c.free_at for c in waited if c.free_at is not None)
        who = compress([c.node.name for c in waited])
        verb = "is" if len(waited) == 1 else "are"
        placed += (
            f". {who} {verb} busy and expected free at {_when(last)}; fewer than {count} suitable "
            f"nodes are free now, so the job waits for {'it' if len(waited) == 1 else 'them'}"
        )
    return placed + "."


def _infeasible(reason: str, reasons: dict[str, str], known: bool) -> Placement:
    return Placement(
        feasible=False,
        nodes=(),
        nodelist="",
        switches_spanned=(),
        leaves=(),
        lowest_common_switch=None,
        optimal_switch_count=0,
        waits_for=(),
        starts_at=None,
        explanation=f"No placement: {reason}.",
        reasons=_summarise(reasons),
        slurm_options={},
        topology_known=known,
    )


def _check_unique(nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    ordered = sorted(nodes, key=lambda n: natural_key(n.name))
    for first, second in itertools.pairwise(ordered):
        if first.name == second.name:
            raise ValueError(f"node {first.name!r} is listed twice")
    return ordered


# ---------------------------------------------------------------------------
# Public


def propose_placement(
    nodes: Sequence[NodeInfo], switches: Sequence[SwitchInfo], request: PlacementRequest
) -> Placement:
    """Propose the N nodes for ``request`` that span the fewest switches.

    Deterministic: the same nodes and switches in any order give the same answer.
    """
    ordered = _check_unique(nodes)
    topology = _Topology(ordered, sorted(switches, key=lambda s: natural_key(s.name)))
    sorting = _sort_nodes(ordered, topology, request)
    need = request.nodes
    pool = list(sorting.now)
    if len(pool) < need:
        pool += sorting.waitable
    else:
        for candidate in sorting.waitable:
            # No time in the text: identical reasons group into one line per host list.
            sorting.reasons[candidate.node.name] = (
                f"busy ({_state(candidate.node)}); not waited for, enough nodes are free now"
            )
    if len(pool) < need:
        return _infeasible(
            _binding_constraint(sorting, request, len(ordered)), sorting.reasons, topology.known
        )

    chosen, optimum = _choose(topology, pool, need)
    chosen = sorted(chosen, key=lambda c: natural_key(c.node.name))
    names = tuple(c.node.name for c in chosen)
    if topology.known:
        spanned, top = topology.span(c.attachment for c in chosen)
        leaves = sorted({c.attachment for c in chosen}, key=natural_key)
    else:
        spanned, top, leaves = [], None, []
    waited = [c for c in chosen if c.waits]
    options = {"nodelist": compress(names)}
    if topology.known:
        options["switches"] = f"{len(leaves)}@{request.max_wait_minutes}"
    return Placement(
        feasible=True,
        nodes=names,
        nodelist=compress(names),
        switches_spanned=tuple(spanned),
        leaves=tuple(leaves),
        lowest_common_switch=top,
        optimal_switch_count=optimum,
        waits_for=tuple(c.node.name for c in waited),
        starts_at=max((c.free_at for c in waited if c.free_at is not None), default=None),
        explanation=_explain(topology, chosen, spanned, leaves, top, pool, request),
        reasons=_summarise(sorting.reasons),
        slurm_options=options,
        topology_known=topology.known,
    )


def placement_quality(
    actual_nodes: Sequence[str],
    nodes: Sequence[NodeInfo],
    switches: Sequence[SwitchInfo],
    request: PlacementRequest | None,
) -> PlacementCheck:
    """Judge where Slurm put a job: switches spanned, and whether fewer would have done.

    The optimum is over every healthy node that could ever host the job (its
    partition, GPU type and shape from ``request``), ignoring current
    busyness, plus the job's own nodes; the job's node count is
    ``len(actual_nodes)``.
    """
    ordered = _check_unique(nodes)
    by_name = {node.name: node for node in ordered}
    actual = sorted(set(actual_nodes), key=natural_key)
    # Nodes we know nothing about still count, as if without a leaf switch.
    missing = [
        NodeInfo(name, "unknown", (), None, None, 0, 0, 0, 0, 0, 0)
        for name in actual
        if name not in by_name
    ]
    everything = sorted([*ordered, *missing], key=lambda n: natural_key(n.name))
    topology = _Topology(everything, sorted(switches, key=lambda s: natural_key(s.name)))
    if not actual:
        return PlacementCheck((), (), (), None, False, "No nodes recorded for this job.")
    nodelist = compress(actual)
    spanned, _top = (
        topology.span(topology.attachment[name] for name in actual)
        if topology.known
        else ([], None)
    )
    leaves = (
        sorted({topology.attachment[name] for name in actual}, key=natural_key)
        if topology.known
        else []
    )
    if not topology.known:
        return PlacementCheck(
            tuple(actual),
            (),
            (),
            None,
            False,
            f"{nodelist}: no topology known, so switches were not compared.",
        )
    shape = request or PlacementRequest(nodes=len(actual), gpus_per_node=0)
    pool = [
        _Candidate(node, topology.attachment[node.name], False, None, (0, 0.0, 0, 0))
        for node in everything
        if node.name in actual
        or (_state(node) in HEALTHY_STATES and _static_misfit(node, shape) is None)
    ]
    optimum, *_rest = _optimum(topology, pool, len(actual))
    assert optimum is not None
    worse = len(spanned) > optimum
    where = f"under {leaves[0]}" if len(leaves) == 1 else f"across {_and(leaves)}"
    text = f"{nodelist} {where}: {_plural(len(spanned), 'switch', 'switches')} spanned"
    if worse:
        text += (
            f" ({_and(spanned)}); {optimum} would have done with other nodes of the same kind, "
            "so all-reduce traffic crossed more of the fabric than necessary."
        )
    else:
        text += ", the fewest possible for this job."
    return PlacementCheck(tuple(actual), tuple(spanned), tuple(leaves), optimum, worse, text)
