"""Bad-node isolation as a sequence of rounds of Slurm jobs (``acceptance.isolation`` does
the group testing; this feeds it the measurements).

``isolate`` is pure and deterministic: given the same busbw for the same groups it asks for
the same rounds. So each watcher cycle replays it from the start over the steps already
measured; the first round whose steps do not exist yet is created (its groups are disjoint:
one parallel Slurm job each) and the replay stops there (``RoundPending``) until they have
all ended. A step keyed by (round, group) is made once (``tiers.steps_create``). A step
that could not measure (refused, lost, no document) stops the isolation as inconclusive:
a missing measurement is never read as a slow node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from acceptance.isolation import Group, Isolation, Measurement, isolate
from acceptance.models import AcceptanceRun, AcceptanceStep, Tier
from acceptance.thresholds import LEAF, SPINE
from acceptance.tiers import SetNode, leaves_of, step_key, steps_create, threshold_of


class RoundPending(Exception):
    """The next round's steps are made or still running: come back next cycle."""


class Unmeasurable(Exception):
    """A step of the round measured nothing: the isolation cannot judge."""


@dataclass
class IsolationResult:
    isolation: Isolation | None
    pending: bool = False
    inconclusive: str = ""


def _level(group: Group, leaf_of: dict[str, str]) -> str:
    return LEAF if len({leaf_of[n] for n in group}) == 1 else SPINE


class _Replay:
    def __init__(self, run: AcceptanceRun, nodes: Sequence[SetNode]) -> None:
        self.run = run
        self.nodes = nodes
        self.leaves = leaves_of(nodes)
        self.leaf_of = {n: leaf for leaf, members in self.leaves.items() for n in members}
        self.round = 0
        self.steps = {
            step.key: step for step in run.steps.filter(tier=Tier.ISOLATION).order_by("created_at")
        }

    def measure_round(self, groups: list[Group]) -> list[float]:
        self.round += 1
        keys = [step_key(Tier.ISOLATION, _level(g, self.leaf_of), self.round, g) for g in groups]
        found = [self.steps.get(key) for key in keys]
        if not all(found):
            missing = [g for g, step in zip(groups, found, strict=True) if step is None]
            for level in (LEAF, SPINE):
                of_level = [g for g in missing if _level(g, self.leaf_of) == level]
                if of_level:
                    steps_create(
                        self.run,
                        tier=Tier.ISOLATION,
                        level=level,
                        groups=of_level,
                        nodes=self.nodes,
                        round_no=self.round,
                    )
            raise RoundPending
        steps = [step for step in found if step is not None]
        if any(not step.is_final for step in steps):
            raise RoundPending
        for step in steps:
            if step.busbw is None:
                raise Unmeasurable(f"{', '.join(step.nodes)} (round {self.round}): {step.reason}")
        return [float(step.busbw or 0.0) for step in steps]


def isolation_thresholds(
    run: AcceptanceRun, leaves: dict[str, list[str]]
) -> dict[str, float] | str:
    """Per level, the busbw a group must reach; a string saying why when a level that the
    isolation may use has none."""
    values: dict[str, float] = {}
    for level in (LEAF, SPINE):
        threshold = threshold_of(run, level)
        if threshold.busbw is not None:
            values[level] = threshold.busbw
    if LEAF not in values:
        return "no leaf-level threshold set or on record"
    if SPINE not in values:
        if len(leaves) > 1:
            return "no spine-level threshold set or on record, and the set spans leaves"
        # One leaf: no group ever leaves it, so the spine value is never used.
        values[SPINE] = values[LEAF]
    return values


def isolation_advance(run: AcceptanceRun, nodes: Sequence[SetNode]) -> IsolationResult:
    replay = _Replay(run, nodes)
    thresholds = isolation_thresholds(run, replay.leaves)
    if isinstance(thresholds, str):
        return IsolationResult(None, inconclusive=thresholds)
    try:
        found = isolate(replay.leaves, None, thresholds, measure_round=replay.measure_round)
    except RoundPending:
        return IsolationResult(None, pending=True)
    except Unmeasurable as error:
        return IsolationResult(None, inconclusive=f"a measurement could not be taken: {error}")
    _purposes(run, found.measurements, replay.leaf_of)
    return IsolationResult(found)


def _purposes(run: AcceptanceRun, measurements: Sequence[Measurement], leaf_of: Any) -> None:
    """Each isolation step learns what it was for (screen, bisect, confirm, repeat)."""
    for m in measurements:
        key = step_key(Tier.ISOLATION, _level(m.group, leaf_of), m.round, m.group)
        AcceptanceStep.objects.filter(run=run, key=key, purpose="").update(purpose=m.purpose)


def measurement_evidence(m: Measurement) -> dict[str, Any]:
    return {
        "group": list(m.group),
        "level": m.level,
        "busbw": m.busbw,
        "threshold": m.threshold,
        "passed": m.passed,
        "purpose": m.purpose,
        "round": m.round,
    }


def isolation_outcome(found: Isolation) -> dict[str, Any]:
    """The isolation's findings as the run and its certificate keep them."""
    return {
        "findings": [
            {
                "node": f.node,
                "leaf": f.leaf,
                "verdict": f.verdict,
                "reason": f.reason,
                "evidence": [measurement_evidence(m) for m in f.evidence],
            }
            for f in found.findings
        ],
        "cleared": found.cleared,
        "unexplained": [[measurement_evidence(m) for m in group] for group in found.unexplained],
        "suspect_leaves": found.suspect_leaves,
        "jobs": found.jobs,
        "rounds": found.rounds,
    }
