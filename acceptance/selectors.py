"""Reads of the acceptance app for its pages and API: runs, a run's tiers and criteria,
the per-level busbw chart, a node's certificate history."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet
from django.http import Http404

from acceptance.certificate import recovery_summary, sustained_summary
from acceptance.models import AcceptanceRun, AcceptanceStep, Certificate, Tier, Verdict
from acceptance.tiers import COLLECTIVE_LEVELS
from nodes.models import Node

CHART_WIDTH, CHART_HEIGHT, CHART_LEFT, CHART_BOTTOM = 640, 220, 56, 40


def run_list(*, cluster_id: int | None = None, state: str = "") -> QuerySet[AcceptanceRun]:
    runs = AcceptanceRun.objects.select_related("cluster", "requested_by").order_by("-created_at")
    if cluster_id is not None:
        runs = runs.filter(cluster_id=cluster_id)
    if state:
        runs = runs.filter(state=state)
    return runs


def run_get(*, run_id: Any) -> AcceptanceRun:
    """The run, or 404 (an id that is not a UUID is not found either)."""
    try:
        wanted = uuid.UUID(str(run_id))
    except ValueError:
        raise Http404("No such acceptance run.") from None
    run = AcceptanceRun.objects.select_related("cluster", "requested_by").filter(id=wanted).first()
    if run is None:
        raise Http404("No such acceptance run.")
    return run


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    value_text: str
    verdict: str


@dataclass
class Chart:
    """Bars of busbw per collectives step, grouped by level, with each level's threshold."""

    bars: list[Bar] = field(default_factory=list)
    thresholds: list[dict[str, Any]] = field(default_factory=list)
    levels: list[dict[str, Any]] = field(default_factory=list)
    top_text: str = ""
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT

    @property
    def empty(self) -> bool:
        return not self.bars


def busbw_chart(steps: list[AcceptanceStep]) -> Chart:
    measured = [s for s in steps if s.tier == Tier.COLLECTIVES and s.busbw is not None]
    chart = Chart()
    if not measured:
        return chart
    ordered = sorted(measured, key=lambda s: (COLLECTIVE_LEVELS.index(s.level), s.key))
    top = max([s.busbw or 0.0 for s in ordered] + [s.threshold or 0.0 for s in ordered]) or 1.0
    plot_w = CHART_WIDTH - CHART_LEFT - 8
    plot_h = CHART_HEIGHT - CHART_BOTTOM - 10
    slot = plot_w / len(ordered)
    chart.top_text = f"{top / 1e9:.3g} GB/s"
    for i, step in enumerate(ordered):
        height = plot_h * (step.busbw or 0.0) / top
        x = CHART_LEFT + i * slot + slot * 0.15
        chart.bars.append(
            Bar(
                x=round(x, 1),
                y=round(10 + plot_h - height, 1),
                width=round(slot * 0.7, 1),
                height=round(height, 1),
                label=",".join(step.nodes) if len(step.nodes) <= 3 else f"{len(step.nodes)} nodes",
                value_text=f"{(step.busbw or 0.0) / 1e9:.3g} GB/s",
                verdict=step.verdict,
            )
        )
        if step.threshold:
            y = round(10 + plot_h - plot_h * step.threshold / top, 1)
            chart.thresholds.append(
                {"x1": round(x - slot * 0.1, 1), "x2": round(x + slot * 0.8, 1), "y": y}
            )
    for level in COLLECTIVE_LEVELS:
        indexes = [i for i, s in enumerate(ordered) if s.level == level]
        if indexes:
            middle = CHART_LEFT + (indexes[0] + indexes[-1] + 1) / 2 * slot
            chart.levels.append({"name": level, "x": round(middle, 1)})
    return chart


@dataclass
class RunView:
    run: AcceptanceRun
    tiers: list[dict[str, Any]]
    steps: list[AcceptanceStep]
    chart: Chart
    convicted: list[Node]
    certificate: Certificate | None
    regressions: list[dict[str, Any]]
    findings: list[dict[str, Any]]
    sustained: dict[str, Any] | None = None
    loss_chart: dict[str, Any] | None = None
    recovery: dict[str, Any] | None = None


def run_view(*, run: AcceptanceRun) -> RunView:
    steps = list(run.steps.order_by("created_at", "key"))
    outcomes = run.outcomes or {}
    tiers = []
    for tier in Tier:
        if tier.value in outcomes or tier.value in run.tiers or tier.value == run.current_tier:
            outcome = outcomes.get(tier.value, {})
            tiers.append(
                {
                    "tier": tier.value,
                    "label": tier.label,
                    "verdict": outcome.get("verdict", ""),
                    "reason": outcome.get("reason", ""),
                    "seconds": outcome.get("seconds"),
                    "current": tier.value == run.current_tier,
                    "steps": sum(1 for s in steps if s.tier == tier.value),
                }
            )
    certificate = Certificate.objects.filter(run=run).first()
    convicted = list(
        Node.objects.filter(cluster=run.cluster, name__in=run.convicted or []).order_by("name")
    )
    findings = list((outcomes.get(Tier.ISOLATION.value) or {}).get("findings") or [])
    sustained = sustained_summary(run)
    return RunView(
        run=run,
        tiers=tiers,
        steps=steps,
        chart=busbw_chart(steps),
        convicted=convicted,
        certificate=certificate,
        regressions=list((certificate.document.get("regressions") if certificate else None) or []),
        findings=findings,
        sustained=sustained,
        loss_chart=loss_chart((sustained or {}).get("losses")),
        recovery=recovery_summary(run),
    )


LOSS_CHART_POINTS = 400


def loss_chart(losses: Any) -> dict[str, Any] | None:
    """The sustained run's loss curve as an SVG polyline (at most ``LOSS_CHART_POINTS``
    points, every k-th logged step), or None without losses."""
    if not isinstance(losses, dict):
        return None
    points = sorted(
        (int(step), float(loss))
        for step, loss in losses.items()
        if str(step).isdigit() and isinstance(loss, int | float) and not isinstance(loss, bool)
    )
    if len(points) < 2:
        return None
    every = max(1, len(points) // LOSS_CHART_POINTS)
    shown = points[::every]
    first, last = shown[0][0], shown[-1][0]
    low, high = min(v for _, v in shown), max(v for _, v in shown)
    plot_w, plot_h = CHART_WIDTH - CHART_LEFT - 8, CHART_HEIGHT - CHART_BOTTOM - 10
    span, rise = max(1, last - first), (high - low) or 1.0
    coordinates = " ".join(
        f"{CHART_LEFT + plot_w * (step - first) / span:.1f},"
        f"{10 + plot_h - plot_h * (value - low) / rise:.1f}"
        for step, value in shown
    )
    return {
        "points": coordinates,
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "top_text": f"{high:.4g}",
        "bottom_text": f"{low:.4g}",
        "first_step": first,
        "last_step": last,
    }


def node_certificates(*, node: Node, limit: int = 20) -> list[dict[str, Any]]:
    """The certificates that name this node, newest first, with what each said of it."""
    rows = Certificate.objects.filter(
        cluster_id=node.cluster_id, nodes_text__contains=f",{node.name},"
    ).order_by("-issued_at")[:limit]
    return [
        {
            "certificate": row,
            "run_id": row.run_id,
            "verdict": row.verdict,
            "convicted": node.name in (row.convicted or []),
            "nodes": len(row.nodes),
            "regressions": len(row.document.get("regressions") or []),
        }
        for row in rows
    ]


# How many of a cluster's newest certificates are searched for each node's last one.
CERTIFIED_SEARCH = 200


def certified_stacks(*, cluster_id: int, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each of ``names``' stack in the newest certificate that names it and did not fail
    (of the cluster's ``CERTIFIED_SEARCH`` newest): the stack last accepted, so a node that
    changed stays the odd one out in later runs until a run accepts it again. A node in
    none of them is left out."""
    wanted = set(names)
    found: dict[str, dict[str, Any]] = {}
    rows = (
        Certificate.objects.filter(cluster_id=cluster_id)
        .exclude(verdict=Verdict.FAILED)
        .order_by("-issued_at")
    )
    for document in rows.values_list("document", flat=True)[:CERTIFIED_SEARCH].iterator():
        for entry in (document or {}).get("nodes") or []:
            name = entry.get("name") if isinstance(entry, dict) else None
            stack = entry.get("stack") if isinstance(entry, dict) else None
            if name in wanted and name not in found and isinstance(stack, dict) and stack:
                found[name] = stack
        if len(found) == len(wanted):
            break
    return found
