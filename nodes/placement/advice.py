"""The two entry points: propose a placement, judge an actual one."""

from __future__ import annotations

from collections.abc import Sequence

from nodes.placement.explain import binding_constraint, check_unique, explain, infeasible, words_and
from nodes.placement.model import (
    HEALTHY_STATES,
    NodeInfo,
    Placement,
    PlacementCheck,
    PlacementRequest,
    SwitchInfo,
)
from nodes.placement.selection import (
    Candidate,
    choose,
    optimum_of,
    plural,
    preference_of_health,
    sort_nodes,
    state_of,
    static_misfit,
    summarise,
)
from nodes.placement.tree import Topology
from slurm.hostlist import compress, natural_key


def propose_placement(
    nodes: Sequence[NodeInfo], switches: Sequence[SwitchInfo], request: PlacementRequest
) -> Placement:
    """Propose the N nodes for ``request`` that span the fewest switches.

    Deterministic: the same nodes and switches in any order give the same answer.
    """
    ordered = check_unique(nodes)
    topology = Topology(ordered, sorted(switches, key=lambda s: natural_key(s.name)))
    sorting = sort_nodes(ordered, topology, request)
    need = request.nodes
    pool = list(sorting.now)
    if len(pool) < need:
        pool += sorting.waitable
    else:
        for candidate in sorting.waitable:
            # No time in the text: identical reasons group into one line per host list.
            sorting.reasons[candidate.node.name] = (
                f"busy ({state_of(candidate.node)}); not waited for, enough nodes are free now"
            )
    if len(pool) < need:
        return infeasible(
            binding_constraint(sorting, request, len(ordered)), sorting.reasons, topology.known
        )

    chosen, optimum = choose(topology, pool, need)
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
        explanation=explain(topology, chosen, spanned, leaves, top, pool, request),
        reasons=summarise(sorting.reasons),
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
    ordered = check_unique(nodes)
    by_name = {node.name: node for node in ordered}
    actual = sorted(set(actual_nodes), key=natural_key)
    # Nodes we know nothing about still count, as if without a leaf switch.
    missing = [
        NodeInfo(name, "unknown", (), None, None, 0, 0, 0, 0, 0, 0)
        for name in actual
        if name not in by_name
    ]
    everything = sorted([*ordered, *missing], key=lambda n: natural_key(n.name))
    topology = Topology(everything, sorted(switches, key=lambda s: natural_key(s.name)))
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
        Candidate(node, topology.attachment[node.name], False, None, (0, 0.0, 0, 0, 0))
        for node in everything
        if node.name in actual
        or (
            state_of(node) in HEALTHY_STATES
            and preference_of_health(node) is not None
            and static_misfit(node, shape) is None
        )
    ]
    optimum, *_rest = optimum_of(topology, pool, len(actual))
    assert optimum is not None
    worse = len(spanned) > optimum
    where = f"under {leaves[0]}" if len(leaves) == 1 else f"across {words_and(leaves)}"
    text = f"{nodelist} {where}: {plural(len(spanned), 'switch', 'switches')} spanned"
    if worse:
        text += (
            f" ({words_and(spanned)}); {optimum} would have done with other nodes of the same "
            "kind, so all-reduce traffic crossed more of the fabric than necessary."
        )
    else:
        text += ", the fewest possible for this job."
    return PlacementCheck(tuple(actual), tuple(spanned), tuple(leaves), optimum, worse, text)
