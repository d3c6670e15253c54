"""Bad-node isolation by group testing: pure, no Django, no torch.

The nodes come grouped by leaf switch (``nodes.models.Switch``, level 0, and each node's
``leaf_switch``). A measurement runs one collective over a group of nodes and returns its
busbw; a group passes when its busbw reaches the threshold of its level: ``leaf`` when every
member hangs off one leaf switch, ``spine`` when the group spans leaves (deeper trees count
as ``spine`` for any group that leaves its leaf).

1. **Screen**: each leaf with two or more nodes, all leaves in one round. A passing group
   clears its members: they are known healthy and may serve as buddies. A leaf of one node
   cannot be measured alone: its node goes straight to confirmation.
2. **Bisect**: a failing group of four or more nodes is split into two halves of at least two
   nodes, all halves of a round measured together (they are disjoint); failing halves are
   split again. A failing group of two or three nodes makes each member a suspect (a single
   node cannot be measured). A failing group whose halves both pass is *unexplained*
   (noise, or a fault only the whole group shows, e.g. the leaf's uplink): reported, nobody
   convicted.
3. **Confirm**: each suspect is measured paired with a cleared buddy, one of its own leaf
   when there is one (level ``leaf``), else of another leaf (``spine``); a buddy serves one
   pair per round. A failing pair convicts the suspect, a passing pair clears it. With no
   cleared node at all, the suspect is *inconclusive*, never convicted.

Noise, the rule: a measurement within ``margin`` (default 5%) of its threshold, on either
side, is borderline and is measured once more in the next round; the group passes when the
better of the two reaches the threshold (contention only ever slows a collective down, so
the faster measurement is the truer one). Both measurements are kept as evidence. A busbw
that is not a finite non-negative number (a collective that crashed) counts as 0.

Cost: one screening round of (#leaves with 2+ nodes) measurements, then per bad node two
per bisection level and the confirmation of the last failing group's two (or three)
members: 2*log2(leaf size) for leaves of a power of two, plus repeats of borderline
measurements; never the n(n-1)/2 pairs of an exhaustive search. Rounds: 1 + log2(leaf size)
(+1 per round that had a borderline measurement, + more confirmation rounds when suspects
outnumber the healthy buddies).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .thresholds import LEAF, SPINE

LEVELS = (LEAF, SPINE)  # the levels a group of two or more nodes can exercise
CONVICTED, INCONCLUSIVE = "convicted", "inconclusive"
SCREEN, BISECT, CONFIRM, REPEAT = "screen", "bisect", "confirm", "repeat"

Group = tuple[str, ...]
Measure = Callable[[Group], float]
MeasureRound = Callable[[list[Group]], Sequence[float]]


@dataclass(frozen=True)
class Measurement:
    """One job: a collective over ``group``; ``passed`` is this measurement's own outcome."""

    group: Group
    level: str
    busbw: float
    threshold: float
    passed: bool
    purpose: str  # screen | bisect | confirm | repeat
    round: int


@dataclass(frozen=True)
class Finding:
    node: str
    leaf: str
    verdict: str  # convicted | inconclusive
    reason: str
    evidence: tuple[Measurement, ...]  # the failing measurements of the groups holding it


@dataclass
class Isolation:
    findings: list[Finding]
    cleared: list[str]
    measurements: list[Measurement]
    rounds: int
    unexplained: list[tuple[Measurement, ...]] = field(default_factory=list)
    # Leaves of two or more nodes whose every node is convicted: the switch may be at fault.
    suspect_leaves: list[str] = field(default_factory=list)

    @property
    def convicted(self) -> list[str]:
        return [f.node for f in self.findings if f.verdict == CONVICTED]

    @property
    def inconclusive(self) -> list[str]:
        return [f.node for f in self.findings if f.verdict == INCONCLUSIVE]

    @property
    def jobs(self) -> int:
        return len(self.measurements)


def thresholds_by_level(threshold: float | Mapping[str, float]) -> dict[str, float]:
    """One busbw threshold for every level, or one per level (``leaf`` and ``spine``)."""
    if isinstance(threshold, Mapping):
        missing = [level for level in LEVELS if level not in threshold]
        if missing:
            raise ValueError(f"no threshold for level(s) {', '.join(missing)}")
        values = {level: float(threshold[level]) for level in LEVELS}
    else:
        values = dict.fromkeys(LEVELS, float(threshold))
    if not all(math.isfinite(v) and v > 0 for v in values.values()):
        raise ValueError("thresholds must be positive numbers")
    return values


class _Rounds:
    """Measures disjoint groups a round at a time, repeating borderline ones once."""

    def __init__(
        self,
        leaf_of: dict[str, str],
        measure: MeasureRound,
        thresholds: dict[str, float],
        margin: float,
    ) -> None:
        self.leaf_of = leaf_of
        self.measure = measure
        self.thresholds = thresholds
        self.margin = margin
        self.measurements: list[Measurement] = []
        self.count = 0

    def level(self, group: Group) -> str:
        return LEAF if len({self.leaf_of[n] for n in group}) == 1 else SPINE

    def _take(self, groups: list[Group], purpose: str) -> list[Measurement]:
        self.count += 1
        values = list(self.measure(groups))
        if len(values) != len(groups):
            raise ValueError(f"measure returned {len(values)} values for {len(groups)} groups")
        out = []
        for group, value in zip(groups, values, strict=True):
            busbw = float(value) if _usable(value) else 0.0
            level = self.level(group)
            limit = self.thresholds[level]
            rec = Measurement(group, level, busbw, limit, busbw >= limit, purpose, self.count)
            out.append(rec)
        self.measurements.extend(out)
        return out

    def _borderline(self, m: Measurement) -> bool:
        return abs(m.busbw - m.threshold) <= self.margin * m.threshold

    def run(self, groups: list[Group], purpose: str) -> list[tuple[bool, list[Measurement]]]:
        """Per group: (passed, its measurements); borderline ones measured again next round,
        decided on the better of the two."""
        if not groups:
            return []
        first = self._take(groups, purpose)
        outcome = [(m.passed, [m]) for m in first]
        again = [i for i, m in enumerate(first) if self._borderline(m)]
        if again:
            repeats = self._take([groups[i] for i in again], REPEAT)
            for i, rep in zip(again, repeats, strict=True):
                outcome[i] = (first[i].passed or rep.passed, [first[i], rep])
        return outcome


def _usable(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


def _leaf_index(leaves: Mapping[str, Sequence[str]]) -> dict[str, str]:
    leaf_of: dict[str, str] = {}
    for leaf, members in leaves.items():
        for node in members:
            if node in leaf_of:
                raise ValueError(f"node {node!r} is under two leaves ({leaf_of[node]}, {leaf})")
            leaf_of[node] = leaf
    if not leaf_of:
        raise ValueError("no nodes to test")
    return leaf_of


@dataclass
class _State:
    cleared: list[str] = field(default_factory=list)
    suspects: dict[str, list[Measurement]] = field(default_factory=dict)
    unexplained: list[tuple[Measurement, ...]] = field(default_factory=list)

    def clear(self, group: Group) -> None:
        self.cleared.extend(n for n in group if n not in self.cleared)


def _failed(evidence: list[Measurement]) -> list[Measurement]:
    return [m for m in evidence if not m.passed]


def _screen_and_bisect(leaves: Mapping[str, Sequence[str]], rounds: _Rounds, state: _State) -> None:
    for members in leaves.values():
        if len(members) == 1:
            state.suspects[members[0]] = []  # unscreened: a single node cannot be measured
    failing: list[tuple[Group, list[Measurement]]] = []
    groups = [tuple(m) for m in leaves.values() if len(m) >= 2]
    for group, (ok, ev) in zip(groups, rounds.run(groups, SCREEN), strict=True):
        if ok:
            state.clear(group)
        else:
            failing.append((group, _failed(ev)))
    while failing:
        parents, halves, inherited = [], [], []
        for group, evidence in failing:
            if len(group) < 4:
                for node in group:
                    state.suspects[node] = list(evidence)
                continue
            mid = len(group) // 2
            parents.append(evidence)
            halves += [group[:mid], group[mid:]]
            inherited += [evidence, evidence]
        outcomes = rounds.run(halves, BISECT)
        failing = []
        for i, (half, (ok, ev)) in enumerate(zip(halves, outcomes, strict=True)):
            if ok:
                state.clear(half)
            else:
                failing.append((half, inherited[i] + _failed(ev)))
        for p, evidence in enumerate(parents):
            if outcomes[2 * p][0] and outcomes[2 * p + 1][0]:
                state.unexplained.append(tuple(evidence))


def _pairs(
    pending: list[str], cleared: list[str], leaf_of: dict[str, str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """One round of (suspect, buddy) pairs, a buddy of the suspect's own leaf first; the
    suspects left for a later round (every buddy busy)."""
    busy: set[str] = set()
    pairs: list[tuple[str, str]] = []
    waiting: list[str] = []
    for suspect in pending:
        own = [b for b in cleared if b not in busy and leaf_of[b] == leaf_of[suspect]]
        other = [b for b in cleared if b not in busy]
        if not (own or other):
            waiting.append(suspect)
            continue
        buddy = (own or other)[0]
        busy.add(buddy)
        pairs.append((suspect, buddy))
    return pairs, waiting


def _confirm(rounds: _Rounds, state: _State, leaf_of: dict[str, str]) -> list[Finding]:
    findings: list[Finding] = []
    pending = list(state.suspects)
    while pending:
        pairs, pending = _pairs(pending, state.cleared, leaf_of)
        if not pairs:
            for node in pending:
                why = "no known-healthy node to pair it with"
                held = tuple(state.suspects[node])
                findings.append(Finding(node, leaf_of[node], INCONCLUSIVE, why, held))
            break
        outcomes = rounds.run(list(pairs), CONFIRM)
        for (suspect, buddy), (ok, ev) in zip(pairs, outcomes, strict=True):
            if ok:
                state.clear((suspect,))
                continue
            why = f"below threshold paired with known-healthy {buddy}"
            evidence = tuple(state.suspects[suspect] + _failed(ev))
            findings.append(Finding(suspect, leaf_of[suspect], CONVICTED, why, evidence))
    return findings


def _one_by_one(measure: Measure | None) -> MeasureRound:
    def per_round(groups: list[Group]) -> list[float]:
        assert measure is not None
        return [measure(g) for g in groups]

    return per_round


def isolate(
    leaves: Mapping[str, Sequence[str]],
    measure: Measure | None,
    threshold: float | Mapping[str, float],
    *,
    measure_round: MeasureRound | None = None,
    margin: float = 0.05,
) -> Isolation:
    """Screen per leaf, bisect failing groups, confirm suspects against healthy buddies.

    ``leaves``: leaf switch name -> its nodes (in a stable order). ``measure(group)`` returns
    the busbw of one collective over the group; ``measure_round(groups)`` (instead) measures
    a round of disjoint groups at once, as parallel jobs. ``threshold``: one busbw or one per
    level (``leaf``, ``spine``)."""
    if (measure is None) == (measure_round is None):
        raise ValueError("pass exactly one of measure and measure_round")
    if not 0 <= margin < 1:
        raise ValueError("margin must be in [0, 1)")
    leaf_of = _leaf_index(leaves)
    per_round = measure_round if measure_round is not None else _one_by_one(measure)
    rounds = _Rounds(leaf_of, per_round, thresholds_by_level(threshold), margin)
    state = _State()
    _screen_and_bisect(leaves, rounds, state)
    findings = _confirm(rounds, state, leaf_of)
    convicted = {f.node for f in findings if f.verdict == CONVICTED}
    bad_leaves = [
        leaf
        for leaf, members in leaves.items()
        if len(members) >= 2 and all(n in convicted for n in members)
    ]
    return Isolation(
        findings=sorted(findings, key=lambda f: f.node),
        cleared=sorted(state.cleared),
        measurements=rounds.measurements,
        rounds=rounds.count,
        unexplained=state.unexplained,
        suspect_leaves=bad_leaves,
    )
