"""Reads for recovery: incidents a person may see (the job's one access rule), a fleet view
per cluster and week, the suspect nodes operators are offered."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from core.types import User
from jobs.selectors import job_get_for_user, job_list_for_user
from nodes.models import Node
from recovery.incidents import lineage_root
from recovery.models import Incident, SuspectNode


def incident_list_for_user(*, user: User) -> QuerySet[Incident]:
    """Incidents of the jobs ``user`` may see (the same rule as the jobs themselves)."""
    return Incident.objects.filter(job__in=job_list_for_user(user=user)).select_related(
        "job", "cluster", "resumed_from", "resumed_job"
    )


def incident_list(
    *, user: User, job: str | None = None, cluster: str | None = None, outcome: str | None = None
) -> QuerySet[Incident]:
    incidents = incident_list_for_user(user=user)
    if job:
        found = job_get_for_user(user=user, job_id=job)
        incidents = incidents.filter(lineage_root=_root_id(found))
    if cluster:
        incidents = incidents.filter(cluster__name=cluster)
    if outcome:
        incidents = incidents.filter(outcome=outcome)
    return incidents.order_by("-detected_at", "-id")


def _root_id(job: Any) -> Any:
    return lineage_root(job).id


@dataclass
class FleetWeek:
    cluster: str
    week: str
    incidents: int = 0
    recovered: int = 0
    held: int = 0
    # Mean seconds from detection to the resumed job's submission.
    mean_time_to_recover_s: float | None = None
    mean_time_to_detect_s: float | None = None
    lost_gpu_hours: float = 0.0
    by_signal: dict[str, int] = field(default_factory=dict)

    @property
    def signal_labels(self) -> list[tuple[str, int]]:
        """``by_signal`` in words (a preemption reads "preempted (not requeued by Slurm)")."""
        labels = dict(Incident.Signal.choices)
        return [(labels.get(name, name), count) for name, count in sorted(self.by_signal.items())]


def incident_fleet_weeks(*, weeks: int = 8, now: datetime | None = None) -> list[FleetWeek]:
    """Per cluster and ISO week: incidents, how many recovered or were held, mean time to
    detect and to recover, GPU-hours of work lost."""
    now = now or timezone.now()
    since = now - timedelta(weeks=weeks)
    rows = Incident.objects.filter(detected_at__gte=since).select_related("cluster")
    grouped: dict[tuple[str, str], list[Incident]] = defaultdict(list)
    for incident in rows:
        iso = incident.detected_at.isocalendar()
        grouped[(incident.cluster.name, f"{iso.year}-W{iso.week:02d}")].append(incident)
    found = []
    for (cluster, week_name), items in sorted(grouped.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        recovered = [i for i in items if i.resumed_at is not None]
        found.append(
            FleetWeek(
                cluster=cluster,
                week=week_name,
                incidents=len(items),
                recovered=len(recovered),
                held=sum(1 for i in items if i.outcome == Incident.Outcome.HELD),
                mean_time_to_recover_s=_mean(
                    [
                        (i.resumed_at - i.detected_at).total_seconds()
                        for i in recovered
                        if i.resumed_at
                    ]
                ),
                mean_time_to_detect_s=_mean([i.time_to_detect_s for i in items]),
                lost_gpu_hours=round(sum(i.lost_gpu_hours or 0.0 for i in items), 3),
                by_signal=dict(Counter(i.signal for i in items)),
            )
        )
    return list(reversed(found))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class SuspectSummary:
    node: Node
    suspicions: list[SuspectNode]
    jobs: int

    @property
    def offered_for_draining(self) -> bool:
        """Suspect in incidents of different jobs' lineages: evidence beyond one run."""
        return self.jobs >= 2

    @property
    def silent_data_corruption(self) -> bool:
        return any(item.is_silent_data_corruption for item in self.suspicions)


def _evidence_lineage(suspicion: SuspectNode, roots: dict[Any, Any]) -> Any:
    """The lineage whose evidence a suspicion is: its incident's, or (silent data
    corruption) that of the job whose checkpoint the drills ran. ``roots`` caches a job's
    lineage root by job id."""
    if suspicion.incident is not None:
        return suspicion.incident.lineage_root_id
    if suspicion.drill is None:
        return None
    job = suspicion.drill.checkpoint.job
    if job.id not in roots:
        roots[job.id] = lineage_root(job).id
    return roots[job.id]


def _suspicions() -> QuerySet[SuspectNode]:
    return SuspectNode.objects.select_related(
        "node",
        "node__cluster",
        "incident",
        "incident__job",
        "drill",
        "drill__checkpoint",
        "drill__checkpoint__job",
    )


def suspect_nodes(*, cluster_id: int | None = None) -> list[SuspectSummary]:
    """Nodes with suspicions no operator cleared, most suspected first. A node's runs are
    the distinct lineages its evidence comes from (an incident's, or the checkpoint's
    job's for silent data corruption)."""
    rows = _suspicions().filter(cleared_at__isnull=True)
    if cluster_id is not None:
        rows = rows.filter(node__cluster_id=cluster_id)
    by_node: dict[int, list[SuspectNode]] = defaultdict(list)
    for row in rows:
        by_node[row.node_id].append(row)
    roots: dict[Any, Any] = {}
    found = [
        SuspectSummary(
            node=items[0].node,
            suspicions=items,
            jobs=len(
                {_evidence_lineage(item, roots) for item in items} - {None},
            ),
        )
        for items in by_node.values()
    ]
    return sorted(found, key=lambda s: (-s.jobs, -len(s.suspicions), s.node.name))


def node_incidents(*, node: Node, limit: int = 20) -> list[SuspectNode]:
    """The suspicions that named ``node`` (an incident's, or silent data corruption a
    pair of drills showed; cleared or not), newest first."""
    return list(_suspicions().filter(node=node).order_by("-created_at")[:limit])


def incident_counts() -> dict[tuple[int, str, str], int]:
    """(cluster id, signal, outcome) -> incidents ever recorded (one query)."""
    from django.db.models import Count

    rows = (
        Incident.objects.order_by()
        .values("cluster_id", "signal", "outcome")
        .annotate(count=Count("id"))
    )
    return {(r["cluster_id"], r["signal"], r["outcome"]): r["count"] for r in rows}


def suspect_counts() -> dict[int, tuple[int, int]]:
    """cluster id -> (nodes with suspicions no operator cleared, those of them suspected of
    silent data corruption) (one query)."""
    from django.db.models import Count, Q

    rows = (
        SuspectNode.objects.filter(cleared_at__isnull=True)
        .order_by()
        .values("node__cluster_id")
        .annotate(
            count=Count("node_id", distinct=True),
            sdc=Count(
                "node_id",
                distinct=True,
                filter=Q(kind=SuspectNode.Kind.SILENT_DATA_CORRUPTION),
            ),
        )
    )
    return {r["node__cluster_id"]: (r["count"], r["sdc"]) for r in rows}
