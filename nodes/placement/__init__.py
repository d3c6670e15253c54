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
waited for; among waited-for nodes, the earliest ``free_at``; GPU health ok or
unknown (never probed) over warning; NVLink over PCIe over unknown; fewest GPUs
left stranded on the node; then the natural name order. Among the placements
with the optimal switch count:

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
proposed, nor is a node whose GPU health (``NodeInfo.health``, from the node
probe) is critical, nor one an acceptance run convicted (``NodeInfo.acceptance``);
among nodes of equal health, one certified by acceptance is preferred.
"""

from __future__ import annotations

from nodes.placement.advice import placement_quality, propose_placement
from nodes.placement.model import (
    HEALTHY_STATES,
    USABLE_NOW_STATES,
    VIRTUAL_ROOT,
    WAITABLE_STATES,
    NodeInfo,
    Placement,
    PlacementCheck,
    PlacementRequest,
    SwitchInfo,
)

__all__ = [
    "HEALTHY_STATES",
    "USABLE_NOW_STATES",
    "VIRTUAL_ROOT",
    "WAITABLE_STATES",
    "NodeInfo",
    "Placement",
    "PlacementCheck",
    "PlacementRequest",
    "SwitchInfo",
    "placement_quality",
    "propose_placement",
]
