"""Software-stack fingerprints and drift within a partition. Pure.

A node's stack is what its probe read: driver, CUDA (the driver's), NCCL, torch (and the
CUDA it was built with), Python, kernel and, optionally, the installed packages. Its
fingerprint is a sha256 over the sorted ``key=value`` items (packages as ``pkg:name``), so
two nodes with the same stack have the same fingerprint whatever order things came in.

Drift: among the nodes of a partition that have a stack, each item's majority value (held
by more than half of them, "absent" included); a node that differs from a majority is
listed with what it has and what the majority has. An item without a majority (a split)
lists every node with its value, since no side can claim to be the norm.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

STACK_KEYS = ("driver", "cuda", "nccl", "torch", "torch_cuda", "python", "kernel")
MAX_PACKAGES = 2000


def stack_items(stack: Mapping[str, Any]) -> dict[str, str]:
    """The stack as flat ``key → value`` text: the known keys, then ``pkg:<name>``."""
    items: dict[str, str] = {}
    for key in STACK_KEYS:
        value = stack.get(key)
        if value is not None and str(value).strip():
            items[key] = str(value).strip()[:128]
    packages = stack.get("packages")
    if isinstance(packages, Mapping):
        for name in sorted(packages)[:MAX_PACKAGES]:
            items[f"pkg:{str(name).lower()[:128]}"] = str(packages[name])[:64]
    return items


def stack_fingerprint(stack: Mapping[str, Any]) -> str:
    """A stable digest of the stack (first 16 hex digits of sha256); "" for an empty one."""
    items = stack_items(stack)
    if not items:
        return ""
    text = "\n".join(f"{key}={value}" for key, value in sorted(items.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Difference:
    node: str
    key: str
    # None: the node does not have the item.
    value: str | None
    # What most nodes have (None: most nodes do not have the item).
    majority: str | None
    # No value is held by more than half the nodes: ``majority`` means nothing.
    split: bool = False


def stack_drift(stacks: Mapping[str, Mapping[str, Any]]) -> list[Difference]:
    """Which nodes differ from their partition's majority, and in what.

    ``stacks``: node name → stack. Nodes with an empty stack are left out (never probed is
    not drift). Deterministic: sorted by node, then item."""
    flat = {node: stack_items(stack) for node, stack in stacks.items()}
    flat = {node: items for node, items in flat.items() if items}
    if len(flat) < 2:
        return []
    keys = sorted({key for items in flat.values() for key in items})
    differences = []
    for key in keys:
        values = Counter(items.get(key) for items in flat.values())
        value, count = values.most_common(1)[0]
        if len(values) == 1:
            continue
        split = count * 2 <= len(flat)
        for node, items in flat.items():
            mine = items.get(key)
            if split or mine != value:
                differences.append(Difference(node, key, mine, None if split else value, split))
    return sorted(differences, key=lambda d: (d.node, d.key))


def drift_by_node(differences: list[Difference]) -> dict[str, list[Difference]]:
    grouped: dict[str, list[Difference]] = {}
    for difference in differences:
        grouped.setdefault(difference.node, []).append(difference)
    return grouped
