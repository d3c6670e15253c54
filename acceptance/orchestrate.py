"""The acceptance run's state machine, advanced by each watcher cycle of its cluster
(``acceptance_cycle``, called from ``watcher.cycle``) and once when a run starts.

``queued`` → ``running`` through the tiers asked for, in ``TIER_ORDER``: a tier's steps are
made (each one Slurm job, submitted exactly once by the lifecycle), and when they have all
ended the tier is judged. A failing tier stops the run, except a failing collectives level
above the node, which hands over to bad-node isolation first. A node-level failure convicts
its node directly: that measurement involved no other node. When the run ends it issues its
certificate (``acceptance.certificate``) and sets each node's ``acceptance_state``.

Safe to re-run any time: the run row is locked while it advances, steps are made once per
key, and every decision is recomputed from what is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction

from acceptance.certificate import certificate_issue
from acceptance.models import TIER_ORDER, AcceptanceRun, AcceptanceStep, Tier, Verdict
from acceptance.recovery_tier import recovery_advance
from acceptance.results import tier_verdict
from acceptance.rounds import isolation_advance, isolation_outcome
from acceptance.sustained import sustained_advance
from acceptance.thresholds import NODE
from acceptance.tiers import COLLECTIVE_LEVELS, SetNode, level_groups, set_nodes, steps_create
from nodes.models import AcceptanceState, Cluster, Node

logger = logging.getLogger(__name__)


def acceptance_cycle(*, cluster: Cluster, now: datetime) -> int:
    """Advance every active run of ``cluster``; one run's failure never stops the others."""
    changes = 0
    for run_id in AcceptanceRun.objects.filter(
        cluster=cluster, state__in=list(AcceptanceRun.ACTIVE_STATES)
    ).values_list("id", flat=True):
        try:
            changes += run_advance(run_id=run_id, now=now)
        except Exception:
            logger.exception("acceptance run %s: advancing failed", run_id)
    return changes


def run_advance(*, run_id: Any, now: datetime) -> int:
    """One step of the state machine for one run; returns 1 when something changed."""
    with transaction.atomic():
        run = (
            AcceptanceRun.objects.select_for_update(of=("self",))
            .select_related("cluster", "requested_by")
            .filter(id=run_id)
            .first()
        )
        if run is None or not run.is_active:
            return 0
        if run.state == AcceptanceRun.State.QUEUED:
            run.state = AcceptanceRun.State.RUNNING
            run.started_at = now
            run.save(update_fields=["state", "started_at"])
            return _start_tier(run, _next_tier(run, None), now) or 1
        return _advance(run, now)


def _next_tier(run: AcceptanceRun, after: str | None) -> str | None:
    """The next tier asked for after ``after`` (isolation is never asked for: it follows
    a failing collectives level)."""
    order = [t.value for t in TIER_ORDER if t != Tier.ISOLATION]
    start = order.index(after) + 1 if after in order else 0
    for tier in order[start:]:
        if tier in run.tiers:
            return tier
    return None


def _start_tier(run: AcceptanceRun, tier: str | None, now: datetime) -> int:
    if tier is None:
        return _finish(run, now)
    run.current_tier = tier
    run.save(update_fields=["current_tier"])
    nodes = set_nodes(run)
    if tier == Tier.INVENTORY:
        steps_create(run, tier=tier, level="", groups=[tuple(n.name for n in nodes)], nodes=nodes)
        return 1
    return _advance(run, now) or 1


def _advance(run: AcceptanceRun, now: datetime) -> int:
    tier = run.current_tier
    if tier == Tier.INVENTORY:
        return _advance_inventory(run, now)
    if tier == Tier.COLLECTIVES:
        return _advance_collectives(run, set_nodes(run), now)
    if tier == Tier.ISOLATION:
        return _advance_isolation(run, set_nodes(run), now)
    if tier == Tier.SUSTAINED:
        sustained = sustained_advance(run, set_nodes(run))
        if isinstance(sustained, int):
            return sustained
        return _tier_done(
            run, tier, sustained.verdict, sustained.reason, now, extra=sustained.extra
        )
    if tier == Tier.RECOVERY:
        gpus = min((n.gpus for n in set_nodes(run)), default=0)
        recovered = recovery_advance(run, gpus, now)
        if isinstance(recovered, int):
            return recovered
        return _tier_done(
            run, tier, recovered.verdict, recovered.reason, now, extra=recovered.extra
        )
    return _start_tier(run, _next_tier(run, tier), now)


def _steps(run: AcceptanceRun, tier: str, level: str | None = None) -> list[AcceptanceStep]:
    rows = run.steps.filter(tier=tier)
    if level is not None:
        rows = rows.filter(level=level)
    return list(rows.order_by("created_at", "key"))


def _advance_inventory(run: AcceptanceRun, now: datetime) -> int:
    steps = _steps(run, Tier.INVENTORY)
    if not steps or any(not s.is_final for s in steps):
        return 0
    step = steps[0]
    verdict = step.verdict or Verdict.INCONCLUSIVE
    at_fault = list((step.evidence or {}).get("at_fault") or [])
    reason = step.reason or ("cancelled" if step.state == step.State.CANCELLED else "")
    return _tier_done(run, Tier.INVENTORY, verdict, reason, now, convicted=at_fault)


def _advance_collectives(run: AcceptanceRun, nodes: Sequence[SetNode], now: datetime) -> int:
    levels: dict[str, dict[str, Any]] = {}
    for level in COLLECTIVE_LEVELS:
        groups = level_groups(nodes, level)
        if not groups:
            continue
        steps = _steps(run, Tier.COLLECTIVES, level)
        if not steps:
            steps_create(run, tier=Tier.COLLECTIVES, level=level, groups=groups, nodes=nodes)
            return 1
        if any(not s.is_final for s in steps):
            return 0
        verdict = tier_verdict([s.verdict or Verdict.INCONCLUSIVE for s in steps])
        failing = [s for s in steps if s.verdict == Verdict.FAILED]
        levels[level] = {"verdict": verdict, "steps": len(steps)}
        if verdict == Verdict.FAILED:
            reason = f"{level} level: " + "; ".join(
                f"{','.join(s.nodes)}: {s.reason}" for s in failing
            )
            # One node alone: no other node took part, so the measurement convicts it.
            convicted = [s.nodes[0] for s in failing] if level == NODE else []
            return _tier_done(
                run,
                Tier.COLLECTIVES,
                Verdict.FAILED,
                reason,
                now,
                extra={"levels": levels, "failed_level": level},
                convicted=convicted,
            )
    verdict = tier_verdict([v["verdict"] for v in levels.values()])
    if not levels:
        reason = "no level could be measured (no node with two GPUs, no two nodes)"
    elif verdict == Verdict.PASSED:
        reason = f"{', '.join(levels)}: every group at or above its threshold"
    else:
        reason = "; ".join(
            f"{s.level} {','.join(s.nodes)}: {s.reason}"
            for s in _steps(run, Tier.COLLECTIVES)
            if s.verdict != Verdict.PASSED
        )
    return _tier_done(run, Tier.COLLECTIVES, verdict, reason, now, extra={"levels": levels})


def _advance_isolation(run: AcceptanceRun, nodes: Sequence[SetNode], now: datetime) -> int:
    result = isolation_advance(run, nodes)
    if result.pending:
        return 0
    if result.isolation is None:
        # The level still failed: the run fails; who is at fault stays open.
        return _tier_done(run, Tier.ISOLATION, Verdict.INCONCLUSIVE, result.inconclusive, now)
    found = result.isolation
    outcome = isolation_outcome(found)
    if found.convicted:
        reason = (
            f"convicted {', '.join(found.convicted)} ({found.jobs} jobs, {found.rounds} rounds)"
        )
        verdict = Verdict.FAILED
    else:
        reason = (
            f"nobody convicted in {found.jobs} jobs: the failure was not reproduced on any "
            "node alone (noise, or a fault only the whole group shows)"
        )
        verdict = Verdict.INCONCLUSIVE
    if found.inconclusive:
        reason += f"; inconclusive: {', '.join(found.inconclusive)}"
    return _tier_done(
        run, Tier.ISOLATION, verdict, reason, now, extra=outcome, convicted=found.convicted
    )


def _tier_done(
    run: AcceptanceRun,
    tier: str,
    verdict: str,
    reason: str,
    now: datetime,
    *,
    extra: dict[str, Any] | None = None,
    convicted: Sequence[str] = (),
) -> int:
    outcomes = dict(run.outcomes or {})
    outcomes[tier] = {
        "verdict": verdict,
        "reason": reason[:4000],
        **(extra or {}),
        **_tier_time(run, outcomes, now),
    }
    run.outcomes = outcomes
    run.convicted = sorted(set(run.convicted or []) | set(convicted))
    run.save(update_fields=["outcomes", "convicted"])
    if tier == Tier.COLLECTIVES and verdict == Verdict.FAILED:
        if outcomes[tier].get("failed_level") != NODE:
            return _start_tier_isolation(run, now)
        return _finish(run, now)
    if tier == Tier.ISOLATION or verdict == Verdict.FAILED:
        return _finish(run, now)
    return _start_tier(run, _next_tier(run, tier), now)


def _tier_time(run: AcceptanceRun, outcomes: dict[str, Any], now: datetime) -> dict[str, Any]:
    """When the tier ended and how long it took: tiers run one after another, so it began
    when the one before it ended (the run's start for the first)."""
    began = run.started_at or now
    for outcome in outcomes.values():
        try:
            ended = datetime.fromisoformat(str(outcome.get("ended_at")))
        except ValueError:
            continue
        began = max(began, ended)
    return {"ended_at": now.isoformat(), "seconds": round((now - began).total_seconds(), 1)}


def _start_tier_isolation(run: AcceptanceRun, now: datetime) -> int:
    run.current_tier = Tier.ISOLATION
    run.save(update_fields=["current_tier"])
    return _advance_isolation(run, set_nodes(run), now) or 1


def run_verdict(outcomes: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """The run's verdict from its tiers' (failed beats inconclusive beats passed), and why."""
    ordered = [(t.value, outcomes[t.value]) for t in TIER_ORDER if t.value in outcomes]
    for wanted in (Verdict.FAILED, Verdict.INCONCLUSIVE):
        for tier, outcome in ordered:
            if outcome.get("verdict") == wanted:
                return wanted, f"{Tier(tier).label}: {outcome.get('reason', '')}"[:4000]
    if not ordered:
        return Verdict.INCONCLUSIVE, "no tier ran"
    return Verdict.PASSED, f"{len(ordered)} tier(s) passed"


def _finish(run: AcceptanceRun, now: datetime) -> int:
    verdict, reason = run_verdict(run.outcomes or {})
    if verdict == Verdict.FAILED and run.outcomes.get(Tier.ISOLATION):
        # The level's failure is the verdict; isolation says who (or that it cannot).
        reason = (
            f"{Tier.COLLECTIVES.label}: {run.outcomes[Tier.COLLECTIVES]['reason']}; "
            f"isolation: {run.outcomes[Tier.ISOLATION]['reason']}"
        )[:4000]
    run.state = AcceptanceRun.State.FINISHED
    run.current_tier = ""
    run.verdict = verdict
    run.reason = reason
    run.ended_at = now
    run.save(update_fields=["state", "current_tier", "verdict", "reason", "ended_at"])
    _node_states(run)
    certificate_issue(run=run, now=now)
    return 1


def _node_states(run: AcceptanceRun) -> None:
    """Convicted nodes are convicted; a passed run certifies every node of its set; other
    nodes keep what they had (an inconclusive run says nothing new of them)."""
    convicted = list(run.convicted or [])
    nodes = Node.objects.filter(cluster=run.cluster)
    if convicted:
        nodes.filter(name__in=convicted).update(acceptance_state=AcceptanceState.CONVICTED)
    if run.verdict == Verdict.PASSED:
        nodes.filter(name__in=run.nodes).exclude(name__in=convicted).update(
            acceptance_state=AcceptanceState.CERTIFIED
        )
