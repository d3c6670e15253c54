"""A simulated fabric for bad-node isolation (tests/acceptance/test_isolation.py and
bench/isolation_bench.py): nodes grouped by leaf switch, a link rate per node.

Bandwidth model: a collective over a group runs at its slowest member's link (the
bottleneck), times a factor for the highest level it crosses (1.0 within a leaf, 0.8 across
the spine by default); optionally multiplied by (1 + N(0, noise)), floored at 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from acceptance.isolation import LEAF, SPINE, Group

HEALTHY_RATE = 50e9  # bytes/s: a 400 Gb/s NIC
LEVEL_FACTOR = {LEAF: 1.0, SPINE: 0.8}
ACCEPT_FRACTION = 0.92  # providers accept at ~92% of the expected figure


def fabric(nodes: int, leaf_size: int) -> dict[str, list[str]]:
    """``nodes`` nodes, ``leaf_size`` per leaf switch (the last leaf may be smaller)."""
    leaves: dict[str, list[str]] = {}
    for i in range(nodes):
        leaves.setdefault(f"leaf{i // leaf_size:03d}", []).append(f"n{i:04d}")
    return leaves


def thresholds(fraction: float = ACCEPT_FRACTION) -> dict[str, float]:
    return {level: fraction * HEALTHY_RATE * f for level, f in LEVEL_FACTOR.items()}


@dataclass
class Bottleneck:
    leaves: dict[str, list[str]]
    slow: dict[str, float] = field(default_factory=dict)  # node -> fraction of the healthy rate
    noise: float = 0.0
    seed: int = 0
    calls: list[Group] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.leaf_of = {n: leaf for leaf, members in self.leaves.items() for n in members}
        self.rng = random.Random(self.seed)

    def level(self, group: Group) -> str:
        return LEAF if len({self.leaf_of[n] for n in group}) == 1 else SPINE

    def busbw(self, group: Group) -> float:
        self.calls.append(group)
        rate = min(HEALTHY_RATE * self.slow.get(n, 1.0) for n in group)
        value = rate * LEVEL_FACTOR[self.level(group)]
        if self.noise:
            value *= max(0.0, 1.0 + self.rng.gauss(0.0, self.noise))
        return value
