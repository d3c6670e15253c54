"""The certificate a run issues when it ends: one JSON document, immutable once issued.

It records the exact configuration as the inventory (synced from Slurm) had it at issue
time, the topology, each node's stack (from the probe the run itself took, where it took
one), each criterion with its measured value, threshold and verdict, the nodes it convicts
and, for a set certified before, what regressed since the previous certificate of exactly
the same nodes.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from acceptance.models import AcceptanceRun, AcceptanceStep, Certificate, Tier, Verdict
from health.models import NodeHealth
from nodes.models import Node, Switch

SCHEMA = "gantry-acceptance-certificate/1"
# A busbw this much below the previous certificate's for the same group is a regression.
REGRESSION_FRACTION = 0.05


def nodes_as_text(names: list[str]) -> str:
    return "," + ",".join(sorted(names)) + ","


def _node_configuration(run: AcceptanceRun) -> list[dict[str, Any]]:
    rows = (
        Node.objects.filter(cluster=run.cluster, name__in=run.nodes)
        .select_related("leaf_switch")
        .prefetch_related("gpus")
        .order_by("name")
    )
    stacks = {h.node_id: h for h in NodeHealth.objects.filter(node__in=[row.pk for row in rows])}
    out = []
    for node in rows:
        health = stacks.get(node.pk)
        out.append(
            {
                "name": node.name,
                "state": node.state,
                "partitions": list(node.partitions or []),
                "features": list(node.features or []),
                "cpus": node.cpus_total,
                "memory_mb": node.memory_mb,
                "leaf_switch": node.leaf_switch.name if node.leaf_switch else None,
                "gpus": [
                    {"index": gpu.index, "type": gpu.gpu_type, "memory_mb": gpu.memory_mb}
                    for gpu in sorted(node.gpus.all(), key=lambda g: g.index)
                ],
                "health_state": node.health_state,
                "stack": health.stack if health is not None else {},
                "stack_fingerprint": health.stack_fingerprint if health is not None else "",
            }
        )
    return out


def _topology(run: AcceptanceRun) -> list[dict[str, Any]]:
    return [
        {
            "name": switch.name,
            "level": switch.level,
            "parent": switch.parent.name if switch.parent else None,
            "link_speed": switch.link_speed,
        }
        for switch in Switch.objects.filter(cluster=run.cluster, gone=False)
        .select_related("parent")
        .order_by("-level", "name")
    ]


def criterion(step: AcceptanceStep) -> dict[str, Any]:
    return {
        "step": str(step.id),
        "tier": step.tier,
        "level": step.level,
        "purpose": step.purpose,
        "round": step.round,
        "nodes": list(step.nodes),
        "measured_busbw": step.busbw,
        "threshold": step.threshold,
        "threshold_source": step.threshold_source,
        "threshold_detail": step.threshold_detail,
        "verdict": step.verdict or Verdict.INCONCLUSIVE,
        "reason": step.reason,
        "slurm_job_id": step.slurm_job_id,
    }


def _sustained(run: AcceptanceRun) -> dict[str, Any] | None:
    if Tier.SUSTAINED not in run.tiers:
        return None
    outcome = (run.outcomes or {}).get(Tier.SUSTAINED, {})
    return {
        "dataset": outcome.get("dataset"),
        "precision": outcome.get("precision"),
        "scale": outcome.get("scale"),
        "verdict": outcome.get("verdict"),
    }


def regressions(
    previous: dict[str, Any] | None, criteria: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Criteria of the same tier, level and nodes that got worse since ``previous``: a
    verdict that was passed and is not now, or a busbw more than 5% lower."""
    if not previous:
        return []
    before = {
        (c["tier"], c["level"], tuple(c["nodes"])): c
        for c in previous.get("criteria", [])
        if c.get("tier") == Tier.COLLECTIVES
    }
    found = []
    for now in criteria:
        old = before.get((now["tier"], now["level"], tuple(now["nodes"])))
        if old is None:
            continue
        was, value = old.get("measured_busbw"), now.get("measured_busbw")
        dropped = (
            isinstance(was, int | float)
            and isinstance(value, int | float)
            and was > 0
            and value < was * (1 - REGRESSION_FRACTION)
        )
        worse = old.get("verdict") == Verdict.PASSED and now["verdict"] != Verdict.PASSED
        if dropped or worse:
            found.append(
                {
                    "tier": now["tier"],
                    "level": now["level"],
                    "nodes": now["nodes"],
                    "before": {"busbw": was, "verdict": old.get("verdict")},
                    "now": {"busbw": value, "verdict": now["verdict"]},
                    "change": (value / was - 1)
                    if dropped and isinstance(value, int | float)
                    else None,
                }
            )
    return found


def previous_certificate(run: AcceptanceRun) -> Certificate | None:
    return (
        Certificate.objects.filter(cluster=run.cluster, nodes_text=nodes_as_text(run.nodes))
        .exclude(run=run)
        .order_by("-issued_at")
        .first()
    )


def certificate_document(run: AcceptanceRun, now: datetime) -> dict[str, Any]:
    steps = list(run.steps.order_by("created_at", "key"))
    criteria = [criterion(step) for step in steps if step.tier != Tier.INVENTORY]
    previous = previous_certificate(run)
    return {
        "schema": SCHEMA,
        "run": str(run.id),
        "cluster": run.cluster.name,
        "partition": run.partition,
        "scope": {"kind": run.scope, "value": run.scope_value},
        "requested_by": run.requested_by.get_username() if run.requested_by else None,
        "tiers_requested": list(run.tiers),
        "options": run.options,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "ended_at": run.ended_at.isoformat() if run.ended_at else None,
        "issued_at": now.isoformat(),
        "verdict": run.verdict,
        "reason": run.reason,
        "nodes": _node_configuration(run),
        "topology": _topology(run),
        "tiers": [{"tier": tier, **outcome} for tier, outcome in (run.outcomes or {}).items()],
        "inventory": [
            {**criterion(step), "evidence": step.evidence}
            for step in steps
            if step.tier == Tier.INVENTORY
        ],
        "criteria": criteria,
        "sustained": _sustained(run),
        "convicted": list(run.convicted or []),
        "previous_certificate": previous.pk if previous else None,
        "regressions": regressions(previous.document if previous else None, criteria),
    }


def canonical_digest(document: dict[str, Any]) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def certificate_issue(*, run: AcceptanceRun, now: datetime) -> Certificate:
    """Issue the run's certificate once (a second call returns the first)."""
    existing = Certificate.objects.filter(run=run).first()
    if existing is not None:
        return existing
    document = json.loads(json.dumps(certificate_document(run, now), default=str))
    return Certificate.objects.create(
        run=run,
        cluster=run.cluster,
        verdict=run.verdict,
        nodes=sorted(run.nodes),
        nodes_text=nodes_as_text(run.nodes),
        convicted=list(run.convicted or []),
        document=document,
        digest=canonical_digest(document),
        issued_at=now,
    )
