"""What each tier measures: the groups of nodes per level of the switch tree, the threshold
each is judged against, and the steps (one Slurm job each) that measure them.

Levels, in order, each only when the set has it: ``node`` (the GPUs of one node, one step
per node with two or more GPUs), ``leaf`` (the set's nodes under one leaf switch, one step
per leaf with two or more of them), ``spine`` (the whole set, when it spans leaves). A
level's steps run together (their groups are disjoint); the next level starts when they
have all ended, and a failing level stops the tier.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from acceptance.models import AcceptanceRun, AcceptanceStep, BusbwThreshold, Tier, Verdict
from acceptance.results import JUDGED_OP
from acceptance.thresholds import (
    LEAF,
    NODE,
    SPINE,
    OperatorThreshold,
    Record,
    Scope,
    Threshold,
    level_of,
    threshold_for,
)
from controlplane.tasknames import ACCEPTANCE_STEP_SUBMIT, task_send
from nodes.models import Node
from nodes.placement.model import no_switch_name
from slurm.hostlist import natural_key

COLLECTIVE_LEVELS = (NODE, LEAF, SPINE)


@dataclass(frozen=True)
class SetNode:
    name: str
    leaf: str | None
    gpus: int


def set_nodes(run: AcceptanceRun) -> list[SetNode]:
    """The run's nodes as the inventory has them now (leaf switch, GPU count)."""
    rows = (
        Node.objects.filter(cluster=run.cluster, name__in=run.nodes)
        .select_related("leaf_switch")
        .prefetch_related("gpus")
    )
    out = [
        SetNode(
            name=row.name,
            leaf=row.leaf_switch.name if row.leaf_switch and not row.leaf_switch.gone else None,
            gpus=len(row.gpus.all()),
        )
        for row in rows
    ]
    return sorted(out, key=lambda n: natural_key(n.name))


def leaves_of(nodes: Sequence[SetNode]) -> dict[str, list[str]]:
    """Leaf switch -> the set's nodes under it; a node without a known leaf is a leaf of
    its own (it cannot be screened with others)."""
    leaves: dict[str, list[str]] = {}
    for node in nodes:
        leaves.setdefault(node.leaf or no_switch_name(node.name), []).append(node.name)
    return leaves


def level_groups(nodes: Sequence[SetNode], level: str) -> list[tuple[str, ...]]:
    """The disjoint groups a level measures (empty: the set does not have that level)."""
    if level == NODE:
        return [(n.name,) for n in nodes if n.gpus >= 2]
    if level == LEAF:
        by_leaf: dict[str, list[str]] = {}
        for n in nodes:
            if n.leaf is not None:
                by_leaf.setdefault(n.leaf, []).append(n.name)
        return [tuple(names) for _, names in sorted(by_leaf.items()) if len(names) >= 2]
    if level == SPINE:
        whole = [n.leaf for n in nodes]
        if len(nodes) >= 2 and level_of(whole, len(nodes)) == SPINE:
            return [tuple(n.name for n in nodes)]
        return []
    raise ValueError(f"unknown level {level!r}")


def certified_records(run: AcceptanceRun, level: str, op: str = JUDGED_OP) -> list[Record]:
    """Measurements of passed runs of this cluster and partition, for thresholds."""
    steps = AcceptanceStep.objects.filter(
        cluster=run.cluster,
        tier=Tier.COLLECTIVES,
        level=level,
        verdict=Verdict.PASSED,
        busbw__isnull=False,
        run__verdict=Verdict.PASSED,
        run__partition=run.partition,
    ).exclude(run=run)
    return [
        Record(
            cluster=run.cluster.name,
            partition=run.partition,
            level=level,
            busbw=float(step.busbw or 0.0),
            certified=True,
            op=op,
            reference=f"run {str(step.run_id)[:8]}",
        )
        for step in steps.only("busbw", "run_id")[:500]
    ]


def threshold_of(run: AcceptanceRun, level: str, op: str = JUDGED_OP) -> Threshold:
    operator = [
        OperatorThreshold(
            cluster=run.cluster.name,
            partition=row.partition or None,
            level=row.level,
            busbw=row.busbw,
            op=row.op,
        )
        for row in BusbwThreshold.objects.filter(cluster=run.cluster, level=level, op=op)
    ]
    return threshold_for(
        Scope(run.cluster.name, run.partition, level, op),
        operator=operator,
        records=certified_records(run, level, op),
    )


def step_key(tier: str, level: str, round_no: int, group: Sequence[str]) -> str:
    key = f"{tier}:{level}:{round_no}:{','.join(group)}"
    if len(key) > 255:
        # Long groups: a digest keeps the key unique and within the column.
        key = f"{tier}:{level}:{round_no}:#{hashlib.sha256(key.encode()).hexdigest()}"
    return key


def steps_create(
    run: AcceptanceRun,
    *,
    tier: str,
    level: str,
    groups: Sequence[tuple[str, ...]],
    nodes: Sequence[SetNode],
    round_no: int = 0,
) -> list[AcceptanceStep]:
    """One step per group (exactly once: a step of the same key is not made twice), its
    threshold fixed now; each enqueued for submission after the transaction commits."""
    gpus = {n.name: n.gpus for n in nodes}
    made = []
    for group in groups:
        fewest = min((gpus.get(name, 0) for name in group), default=0)
        threshold = threshold_of(run, level) if tier != Tier.INVENTORY else None
        try:
            with transaction.atomic():
                step = AcceptanceStep.objects.create(
                    run=run,
                    cluster=run.cluster,
                    tier=tier,
                    level="" if tier == Tier.INVENTORY else level,
                    round=round_no,
                    nodes=list(group),
                    key=step_key(tier, level, round_no, group),
                    tasks_per_node=max(1, fewest),
                    gpus_per_node=fewest,
                    threshold=threshold.busbw if threshold else None,
                    threshold_source=threshold.source if threshold else "",
                    threshold_detail=(threshold.detail if threshold else "")[:512],
                )
        except IntegrityError:
            continue  # made by an earlier pass: exactly once
        made.append(step)
        transaction.on_commit(functools.partial(task_send, ACCEPTANCE_STEP_SUBMIT, str(step.id)))
    return made
