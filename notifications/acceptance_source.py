"""What the collector reads of acceptance: each certificate issued (the run passed, failed
or was inconclusive) and each node it convicts, one event each (``source_key``)."""

from __future__ import annotations

from datetime import datetime

from django.urls import reverse

from acceptance.models import Certificate
from notifications.sources import EventDraft, link
from notifications.topics import EventKind


def acceptance_outcomes(*, since: datetime) -> list[EventDraft]:
    rows = (
        Certificate.objects.filter(issued_at__gt=since)
        .select_related("run", "cluster")
        .order_by("issued_at", "id")
    )
    drafts = []
    for certificate in rows:
        run = certificate.run
        url = link(reverse("acceptance-detail", args=[run.id]))
        about = {
            "id": str(run.id),
            "verdict": certificate.verdict,
            "reason": run.reason,
            "cluster": certificate.cluster.name,
            "nodes": certificate.nodes,
            "convicted": certificate.convicted,
            "url": url,
        }
        drafts.append(
            EventDraft(
                source_key=f"acceptance:{run.id}:ended",
                kind=EventKind.ACCEPTANCE_ENDED,
                occurred_at=certificate.issued_at,
                title=f"acceptance of {run.scope_value} on {certificate.cluster.name}: "
                f"{certificate.verdict}"[:200],
                cluster_id=certificate.cluster_id,
                requester_id=run.requested_by_id,
                data={"verdict": certificate.verdict, "acceptance": about},
            )
        )
        for node in certificate.convicted:
            drafts.append(
                EventDraft(
                    source_key=f"acceptance:{run.id}:convicted:{node}"[:128],
                    kind=EventKind.ACCEPTANCE_CONVICTED,
                    occurred_at=certificate.issued_at,
                    title=f"acceptance convicted {node} on {certificate.cluster.name}"[:200],
                    cluster_id=certificate.cluster_id,
                    requester_id=run.requested_by_id,
                    data={"node": node, "acceptance": about},
                )
            )
    return drafts
