"""The advice in words: why these nodes, what bound the choice, why nothing fits."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

from nodes.placement.model import LINK_WORDS, NodeInfo, Placement, PlacementRequest
from nodes.placement.selection import Candidate, Sorting, plural, state_of, summarise, when
from nodes.placement.tree import Topology
from slurm.hostlist import compress, natural_key


def words_and(words: Sequence[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def binding_constraint(sorting: Sorting, request: PlacementRequest, total: int) -> str:
    need = request.nodes
    where = f" in partition {request.partition}" if request.partition else ""
    kind = f"{request.gpu_type} " if request.gpu_type else ""
    gpus = f"{request.gpus_per_node} {kind}GPU{'' if request.gpus_per_node == 1 else 's'}"
    extra = []
    if request.cpus_needed:
        extra.append(f"{request.cpus_needed} CPUs")
    if request.memory_mb_needed:
        extra.append(f"{request.memory_mb_needed} MB memory")
    shape = gpus + (" with " + words_and(extra) if extra else "")

    def only(count: int, singular: str, many: str) -> str:
        if count == 0:
            return f"no node{where} {singular}"
        return f"only {plural(count, 'node')}{where} {singular if count == 1 else many}"

    if total < need:
        return f"the cluster has only {plural(total, 'node')}; {need} requested"
    if sorting.matching < need:
        what = f"{kind}GPUs" if request.gpu_type else "nodes"
        return f"{only(sorting.matching, 'has', 'have')} {what}; {need} requested"
    if sorting.shaped < need:
        return f"{only(sorting.shaped, 'can', 'can')} hold {shape}; {need} requested"
    if sorting.healthy < need:
        holding = f"that can hold {shape}"
        return (
            f"{only(sorting.healthy, holding + ' is', holding + ' are')} up (the rest are "
            f"drained, down, GPU-unhealthy or otherwise unavailable); {need} requested"
        )
    usable = len(sorting.now) + len(sorting.waitable)
    waiting = " or become free at a known time" if request.allow_wait else ""
    return f"{only(usable, 'has', 'have')} {shape} free{waiting}; {need} requested"


def explain(
    topology: Topology,
    chosen: Sequence[Candidate],
    spanned: Sequence[str],
    leaves: Sequence[str],
    top: str | None,
    pool: Sequence[Candidate],
    request: PlacementRequest,
) -> str:
    names = [c.node.name for c in chosen]
    nodelist = compress(names)
    count = len(chosen)
    states = {state_of(c.node) for c in chosen if not c.waits}
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
            f"{noun} across {words_and(list(leaves))} ({nodelist}), {per_node}: no single leaf has "
            f"{count} usable nodes (the fullest, {fullest}, has {fullest_count}); all-reduce "
            f"traffic crosses {words_and(crossed)} — {len(spanned)} switches, the fewest possible"
        )
    placed += link_words
    if waited:
        last = max(c.free_at for c in waited if c.free_at is not None)
        who = compress([c.node.name for c in waited])
        verb = "is" if len(waited) == 1 else "are"
        placed += (
            f". {who} {verb} busy and expected free at {when(last)}; fewer than {count} suitable "
            f"nodes are free now, so the job waits for {'it' if len(waited) == 1 else 'them'}"
        )
    return placed + "."


def infeasible(reason: str, reasons: dict[str, str], known: bool) -> Placement:
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
        reasons=summarise(reasons),
        slurm_options={},
        topology_known=known,
    )


def check_unique(nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    ordered = sorted(nodes, key=lambda n: natural_key(n.name))
    for first, second in itertools.pairwise(ordered):
        if first.name == second.name:
            raise ValueError(f"node {first.name!r} is listed twice")
    return ordered


# ---------------------------------------------------------------------------
# Public
