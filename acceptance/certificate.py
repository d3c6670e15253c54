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

from acceptance.models import (
    AcceptanceRun,
    AcceptanceStep,
    Certificate,
    RecoveryTrial,
    Tier,
    Verdict,
)
from acceptance.recovery_tier import TRAINER_CONFIG as RECOVERY_TRAINER_CONFIG
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
    extra: dict[str, Any] = {}
    if step.tier == Tier.SUSTAINED:
        extra["measured_tokens_per_s"] = (step.measured or {}).get("tokens_per_s")
    return {
        **extra,
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


def sustained_summary(run: AcceptanceRun) -> dict[str, Any] | None:
    """The sustained tier as the certificate records it: the configuration (dataset,
    precision, scale, key), throughput and MFU with threshold and verdict, the loss verdict,
    and the losses with their digest (what a later run of the same key is compared with)."""
    if Tier.SUSTAINED not in run.tiers:
        return None
    outcome = (run.outcomes or {}).get(Tier.SUSTAINED, {})
    step = run.steps.filter(tier=Tier.SUSTAINED).first()
    measured = (step.measured if step else None) or {}
    configuration = (step.configuration if step else None) or {}
    throughput = measured.get("throughput") or {}
    return {
        "verdict": outcome.get("verdict"),
        "reason": outcome.get("reason"),
        "step": str(step.id) if step else None,
        "state": step.state if step else None,
        "config_key": step.config_key if step else None,
        "dataset": outcome.get("dataset") or measured.get("dataset"),
        "precision": configuration.get("precision"),
        "device": configuration.get("device"),
        "scale": outcome.get("scale"),
        "trainer_config": configuration.get("trainer_config"),
        "trainer_digest": configuration.get("trainer_digest"),
        "throughput": {
            "tokens_per_s": measured.get("tokens_per_s"),
            "samples_per_s": measured.get("samples_per_s"),
            "window": measured.get("window"),
            "threshold": step.threshold if step else None,
            "threshold_source": step.threshold_source if step else None,
            "threshold_detail": step.threshold_detail if step else None,
            "verdict": throughput.get("verdict"),
        },
        "mfu": {
            "value": measured.get("mfu"),
            "note": measured.get("mfu_note"),
            "model_flops_per_s": measured.get("model_flops_per_s"),
            "flops_per_token": measured.get("flops_per_token"),
        },
        "loss": measured.get("loss"),
        "final_loss": measured.get("final_loss"),
        "losses": measured.get("losses"),
        "losses_digest": measured.get("losses_digest"),
        "reference": {
            "step": configuration.get("reference_step"),
            "run": configuration.get("reference_run"),
        },
        "baseline": outcome.get("baseline"),
    }


def recovery_summary(run: AcceptanceRun) -> dict[str, Any] | None:
    """The recovery tier as the certificate records it: the job and its fault, each
    criterion (recovered, time to recover, lost work, the drill) and the figures."""
    if Tier.RECOVERY not in run.tiers:
        return None
    outcome = (run.outcomes or {}).get(Tier.RECOVERY, {})
    trial = RecoveryTrial.objects.filter(run=run).first()
    return {
        "verdict": outcome.get("verdict"),
        "reason": outcome.get("reason"),
        "criteria": outcome.get("criteria") or [],
        "job": str(trial.job_id) if trial and trial.job_id else None,
        "fault": trial.fault if trial else None,
        "fault_step": trial.fault_step if trial else None,
        "trainer_config": RECOVERY_TRAINER_CONFIG,
        "stage": trial.stage if trial and not trial.cleaned_up_at else "",
        "drill": str(trial.drill_id) if trial and trial.drill_id else None,
        "figures": {
            key: outcome.get(key)
            for key in (
                "incident",
                "signal",
                "outcome",
                "time_to_detect_s",
                "time_to_recover_s",
                "lost_steps",
                "lost_gpu_hours",
                "resumed_job",
                "resumed_from_step",
                "proving_drill",
            )
        },
        "cleanup_problems": outcome.get("cleanup_problems") or [],
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
        "sustained": sustained_summary(run),
        "recovery": recovery_summary(run),
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
