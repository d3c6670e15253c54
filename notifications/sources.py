"""What the collector reads: the happenings already recorded by the apps, as event drafts.

- a job ending: its ``JobEvent`` into a final state (one event per job);
- a drill finishing: ``RestoreDrill.finished_at`` with its verdict, or its cancellation
  (one per drill);
- a node entering a drained or a down state: its ``NodeEvent`` (one per event row; a node
  going from draining to drained is not a second drain);
- a recovery incident opened, and closed (recovered, held, not recovered, left running):
  ``Incident.detected_at`` / ``closed_at`` (one event each per incident);
- a node's or a GPU's health turning warning, critical or unknown, or back to ok from a state
  it had been judged in (``HealthEvent``; one event per node and probe, whichever of its
  GPUs changed: a node going critical with its GPU is one notification, not two);
- a running job over its cluster's proven-age limit (``jobs.goodput.work_at_risk``): one per job and
  newest proven checkpoint, so a job that gets a new proof and ages past the limit again is
  a new breach.

Each reader takes its window; rows written late (a transaction that committed after the
previous read) fall in the next window, which overlaps the last one by time and by id, and
``source_key`` keeps a happening that is read twice one event. A fixed number of queries per
read, on indexes: the event tables by primary key, drills by (verdict, finished_at).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Exists, F, Max, OuterRef, Q, Value
from django.db.models.functions import Coalesce
from django.urls import reverse

from drills.models import RestoreDrill
from health.models import HealthEvent
from jobs.goodput.ledger import format_duration
from jobs.goodput.work_at_risk import proven_age_breaches
from jobs.models import Job, JobEvent
from nodes.models import Node, NodeEvent
from notifications.topics import EventKind
from recovery.models import Incident

DRAINED_STATES = frozenset({Node.State.DRAINING, Node.State.DRAINED})
DOWN_STATES = frozenset({Node.State.DOWN, Node.State.FAIL, Node.State.FAILING})


@dataclass
class EventDraft:
    source_key: str
    kind: str
    occurred_at: datetime
    title: str
    cluster_id: int | None
    owner_id: int | None = None
    requester_id: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


def link(path: str) -> str:
    """An absolute link when ``GANTRY_BASE_URL`` is set, else the path."""
    return f"{settings.GANTRY_BASE_URL}{path}" if settings.GANTRY_BASE_URL else path


@dataclass(frozen=True)
class Window:
    """What one read covers: rows newer than ``since`` and with an id in ``(after_id,
    upto_id]``. The id range keeps the read on the primary key's index (the event tables
    have no index on the time alone); the time keeps out old rows that the id overlap
    would reach back to."""

    since: datetime
    after_id: int
    upto_id: int


def newest_id(model: type[JobEvent] | type[NodeEvent]) -> int:
    return int(model.objects.aggregate(newest=Max("id"))["newest"] or 0)


def job_endings(*, window: Window) -> list[EventDraft]:
    rows = (
        JobEvent.objects.filter(
            id__gt=window.after_id,
            id__lte=window.upto_id,
            at__gt=window.since,
            to_state__in=Job.FINAL_STATES,
        )
        .exclude(from_state=F("to_state"))
        .select_related("job", "job__cluster", "job__owner")
        .order_by("at", "id")
    )
    drafts = []
    for row in rows:
        job = row.job
        drafts.append(
            EventDraft(
                source_key=f"job:{job.id}:ended",
                kind=EventKind.JOB_ENDED,
                occurred_at=row.at,
                title=f"job {job.name} {job.get_state_display()}",
                cluster_id=job.cluster_id,
                owner_id=job.owner_id,
                data={
                    "job": {
                        "id": str(job.id),
                        "name": job.name,
                        "state": row.to_state,
                        "reason": job.state_reason,
                        "exit_code": job.exit_code,
                        "slurm_job_id": job.slurm_job_id,
                        "cluster": job.cluster.name,
                        "owner": job.owner.get_username(),
                        "last_step": job.last_step,
                        "url": link(reverse("job-detail", args=[job.id])),
                    }
                },
            )
        )
    return drafts


def drill_outcomes(*, since: datetime) -> list[EventDraft]:
    rows = (
        RestoreDrill.objects.filter(
            # Every verdict ("" for a cancelled drill): the (verdict, finished_at) index.
            verdict__in=[*RestoreDrill.Verdict.values, ""],
            finished_at__gt=since,
            state__in=[RestoreDrill.State.FINISHED, RestoreDrill.State.CANCELLED],
        )
        .select_related("checkpoint", "checkpoint__job", "checkpoint__job__cluster")
        .order_by("finished_at", "id")
    )
    drafts = []
    for drill in rows:
        job = drill.checkpoint.job
        verdict = drill.verdict or "cancelled"
        drafts.append(
            EventDraft(
                source_key=f"drill:{drill.id}:finished",
                kind=EventKind.DRILL_FINISHED,
                occurred_at=drill.finished_at or since,
                title=f"restore drill of {job.name} @ step {drill.checkpoint.step}: {verdict}",
                cluster_id=drill.cluster_id or job.cluster_id,
                owner_id=job.owner_id,
                requester_id=drill.requested_by_id,
                data={
                    "verdict": verdict,
                    "drill": {
                        "id": str(drill.id),
                        "verdict": verdict,
                        "reason": drill.reason,
                        "reason_code": drill.reason_code,
                        "trigger": drill.trigger,
                        "checkpoint_step": drill.checkpoint.step,
                        "job": {"id": str(job.id), "name": job.name},
                        "cluster": job.cluster.name,
                        "url": link(reverse("drill-detail", args=[drill.id])),
                    },
                },
            )
        )
    return drafts


def node_changes(*, window: Window) -> list[EventDraft]:
    rows = (
        NodeEvent.objects.filter(
            id__gt=window.after_id,
            id__lte=window.upto_id,
            at__gt=window.since,
            to_state__in=[*DRAINED_STATES, *DOWN_STATES],
        )
        .select_related("node", "node__cluster")
        .order_by("at", "id")
    )
    drafts = []
    for row in rows:
        if row.to_state in DRAINED_STATES and row.from_state not in DRAINED_STATES:
            kind, what = EventKind.NODE_DRAINED, "drained"
        elif row.to_state in DOWN_STATES and row.from_state not in DOWN_STATES:
            kind, what = EventKind.NODE_DOWN, "down"
        else:
            continue
        node = row.node
        drafts.append(
            EventDraft(
                source_key=f"nodeevent:{row.id}",
                kind=kind,
                occurred_at=row.at,
                title=f"node {node.cluster.name}/{node.name} {what} ({row.to_state})",
                cluster_id=node.cluster_id,
                data={
                    "node": {
                        "name": node.name,
                        "cluster": node.cluster.name,
                        "from_state": row.from_state,
                        "to_state": row.to_state,
                        "message": row.message,
                        "url": link(reverse("node-detail", args=[node.id])),
                    }
                },
            )
        )
    return drafts


def breaches(*, now: datetime) -> list[EventDraft]:
    drafts = []
    for risk in proven_age_breaches(jobs=Job.objects.all(), now=now):
        reference = risk.proven.step if risk.proven.step is not None else "none"
        proof = (
            f"proven step {risk.proven.step} is {format_duration(risk.proven.age_s)} old"
            if risk.proven.step is not None
            else f"no proven checkpoint in {format_duration(risk.proven.age_s)}"
        )
        drafts.append(
            EventDraft(
                source_key=f"breach:{risk.job_id}:{reference}",
                kind=EventKind.PROVEN_AGE_BREACH,
                occurred_at=now,
                title=f"job {risk.name}: {proof} (limit {format_duration(risk.max_proven_age_s)})",
                cluster_id=risk.cluster_id,
                owner_id=risk.owner_id,
                data={
                    "job": {
                        "id": risk.job_id,
                        "name": risk.name,
                        "cluster": risk.cluster,
                        "url": link(reverse("job-detail", args=[risk.job_id])),
                    },
                    "work_at_risk": _json_safe(risk.as_dict()),
                },
            )
        )
    return drafts


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def incidents(*, since: datetime) -> list[EventDraft]:
    """Incidents opened or closed since ``since``: one event for each, per incident."""
    rows = (
        Incident.objects.filter(
            Q(detected_at__gt=since) | Q(closed_at__gt=since) | Q(deadline_passed_at__gt=since)
        )
        .select_related("job", "cluster", "resumed_from")
        .order_by("detected_at", "id")
    )
    drafts = []
    for incident in rows:
        job = incident.job
        data = {
            "outcome": incident.outcome,
            "incident": {
                "id": incident.pk,
                "signal": incident.signal,
                "detail": incident.detail,
                "outcome": incident.outcome,
                "reason": incident.reason,
                "resumed_from_step": incident.resumed_from.step if incident.resumed_from else None,
                "resumed_job": str(incident.resumed_job_id) if incident.resumed_job_id else None,
                "excluded_nodes": incident.excluded_nodes,
                "resumed_proof": incident.resumed_proof,
                "steps": incident.steps,
                "lost_steps": incident.lost_steps,
                "job": {"id": str(job.id), "name": job.name},
                "cluster": incident.cluster.name,
                "url": link(reverse("job-detail", args=[job.id])),
            },
        }
        if incident.detected_at > since:
            drafts.append(
                EventDraft(
                    source_key=f"incident:{incident.pk}:opened",
                    kind=EventKind.INCIDENT_OPENED,
                    occurred_at=incident.detected_at,
                    title=f"job {job.name}: {incident.get_signal_display()}: {incident.detail}"[
                        :200
                    ],
                    cluster_id=incident.cluster_id,
                    owner_id=job.owner_id,
                    data=data,
                )
            )
        passed = incident.deadline_passed_at
        if passed is not None and passed > since:
            late: dict[str, Any] = next(
                (s for s in reversed(incident.steps or []) if "deadline" in s.get("outcome", "")),
                {},
            )
            drafts.append(
                EventDraft(
                    source_key=f"incident:{incident.pk}:deadline:{passed.isoformat()}",
                    kind=EventKind.INCIDENT_DEADLINE,
                    occurred_at=passed,
                    title=f"job {job.name}: recovery step {late.get('name', '?')}: "
                    f"{late.get('outcome', 'deadline passed')}"[:200],
                    cluster_id=incident.cluster_id,
                    owner_id=job.owner_id,
                    data=data,
                )
            )
        if incident.closed_at is not None and incident.closed_at > since:
            drafts.append(
                EventDraft(
                    source_key=f"incident:{incident.pk}:closed",
                    kind=EventKind.INCIDENT_CLOSED,
                    occurred_at=incident.closed_at,
                    title=f"job {job.name}: recovery {incident.get_outcome_display()}: "
                    f"{incident.reason}"[:200],
                    cluster_id=incident.cluster_id,
                    owner_id=job.owner_id,
                    data=data,
                )
            )
    return drafts


BAD_HEALTH = frozenset({"warning", "critical", "unknown"})


def _health_rows(since: datetime) -> list[HealthEvent]:
    """Health changes after ``since`` (the ``at`` index), each told whether the same node
    or GPU had an earlier change (so a first verdict of "ok" is no news)."""
    slot = Coalesce("gpu_index", Value(-1))
    earlier = HealthEvent.objects.annotate(slot=slot).filter(
        node_id=OuterRef("node_id"), slot=OuterRef("slot"), id__lt=OuterRef("id")
    )
    return list(
        HealthEvent.objects.filter(at__gt=since)
        .annotate(slot=slot, earlier=Exists(earlier))
        .select_related("node", "node__cluster")
        .order_by("at", "id")
    )


def _health_news(row: HealthEvent) -> bool:
    if row.to_state in BAD_HEALTH:
        return True
    return row.from_state != "unknown" or bool(getattr(row, "earlier", False))


def health_changes(*, since: datetime) -> list[EventDraft]:
    """One event per node and moment (one probe's changes) with news in it."""
    groups: dict[tuple[int, datetime], list[HealthEvent]] = {}
    for row in _health_rows(since):
        groups.setdefault((row.node_id, row.at), []).append(row)
    drafts = []
    for rows in groups.values():
        if not any(_health_news(row) for row in rows):
            continue
        node = rows[0].node
        main = next((row for row in rows if row.gpu_index is None), rows[0])
        where = "" if main.gpu_index is None else f" GPU {main.gpu_index}"
        drafts.append(
            EventDraft(
                source_key=f"health:{node.id}:{min(row.id for row in rows)}",
                kind=EventKind.HEALTH_CHANGED,
                occurred_at=main.at,
                title=f"node {node.cluster.name}/{node.name}{where}: {main.from_state} → "
                f"{main.to_state}: {main.reason}"[:200],
                cluster_id=node.cluster_id,
                data={
                    "node": {
                        "name": node.name,
                        "cluster": node.cluster.name,
                        "url": link(reverse("node-detail", args=[node.id])),
                    },
                    "changes": [
                        {
                            "gpu": row.gpu_index,
                            "from_state": row.from_state,
                            "to_state": row.to_state,
                            "reason": row.reason,
                            "action": row.action,
                        }
                        for row in rows
                    ],
                },
            )
        )
    return drafts
