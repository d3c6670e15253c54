"""What the collector reads of silent data corruption: each node a pair of restore drills
named (``recovery.sdc``), one event per suspicion (``source_key``), for operators."""

from __future__ import annotations

from datetime import datetime

from django.urls import reverse

from notifications.sources import EventDraft, link
from notifications.topics import EventKind
from recovery.models import SuspectNode


def sdc_suspicions(*, since: datetime) -> list[EventDraft]:
    rows = (
        SuspectNode.objects.filter(
            kind=SuspectNode.Kind.SILENT_DATA_CORRUPTION, created_at__gt=since
        )
        .select_related("node", "node__cluster", "drill", "drill__checkpoint")
        .order_by("created_at", "id")
    )
    drafts = []
    for suspicion in rows:
        node = suspicion.node
        drill = suspicion.drill
        about = {
            "node": node.name,
            "cluster": node.cluster.name,
            "drill": str(suspicion.drill_id),
            "passed_drill": str(suspicion.passed_drill_id) if suspicion.passed_drill_id else None,
            "checkpoint_step": drill.checkpoint.step if drill is not None else None,
            "evidence": suspicion.evidence,
            "url": link(reverse("node-detail", args=[node.pk])),
        }
        drafts.append(
            EventDraft(
                source_key=f"suspect:{suspicion.pk}:sdc",
                kind=EventKind.SUSPECT_SDC,
                occurred_at=suspicion.created_at,
                title=f"silent data corruption suspected on {node.name} ({node.cluster.name})"[
                    :200
                ],
                cluster_id=node.cluster_id,
                data={"suspect": about},
            )
        )
    return drafts
