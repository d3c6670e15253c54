"""The switch tree and the exact minimum-switch search (tree knapsack)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nodes.placement.model import VIRTUAL_ROOT, NodeInfo, Steps, SwitchInfo, Tables, no_switch_name
from slurm.hostlist import natural_key


class Topology:
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
                own = no_switch_name(node.name)
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


def coverage_tables(
    topology: Topology, counts: dict[str, int], need: int, cap: int | None = None
) -> tuple[Tables, Steps]:
    """Per switch r: table[b] = most nodes (≤ need) a part topped by r holds with ≤ b switches.

    Also returns, per switch, what reconstruction needs: its leaf children with
    nodes (best first) and the table before each other child was merged in.
    """
    tables: Tables = {}
    steps: Steps = {}
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
            table = merge_tables(table, kid_table, need, limit)
        tables[switch] = table
        steps[switch] = (leaf_kids, merges)
    return tables, steps


def merge_tables(table: list[int], kid: list[int], need: int, limit: int) -> list[int]:
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


def first_reaching(table: list[int], need: int) -> int | None:
    for budget, value in enumerate(table):
        if value >= need and budget > 0:
            return budget
    return None


def reconstruct(
    switch: str,
    budget: int,
    tables: Tables,
    steps: Steps,
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
            chosen += reconstruct(kid, kid_budget, tables, steps, counts, need)
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
