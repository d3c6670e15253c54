"""Reads for recovery: incidents a person may see (the job's one access rule), a fleet view
per cluster and week, the suspect nodes operators are offered."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from core.roles import is_operator
from core.types import User
from jobs.selectors import job_get_for_user, job_list_for_user
from nodes.models import Node
from recovery.evidence import node_is_faulty
from recovery.incidents import lineage_root
from recovery.models import Incident, SuspectNode

# The most open suspicions of one node read to count their owners (a node with more is
# offered for draining long before).
MAX_OWNERS_READ = 500


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
    # The distinct runs (lineages) and the distinct owners the evidence comes from.
    jobs: int
    owners: int = 0

    @property
    def slurm_says_faulty(self) -> bool:
        """Slurm itself shows the node down, drained or failing (the inventory's copy of
        its node state, never anything a job wrote)."""
        return node_is_faulty(state=self.node.state, flags=self.node.state_flags)

    @property
    def offered_for_draining(self) -> bool:
        """Evidence from two or more different owners, or Slurm's own view of the node.
        Runs are not enough: one person's two jobs (two lineages) are one party's word,
        and a researcher must not be able to get another's node drained by themselves."""
        return self.owners >= 2 or self.slurm_says_faulty

    @property
    def silent_data_corruption(self) -> bool:
        return any(item.is_silent_data_corruption for item in self.suspicions)


def _evidence_job(suspicion: SuspectNode) -> Any:
    """The job whose run a suspicion is evidence from: its incident's, or (silent data
    corruption) the job whose checkpoint the drills ran."""
    if suspicion.incident is not None:
        return suspicion.incident.job
    if suspicion.drill is None:
        return None
    return suspicion.drill.checkpoint.job


def _evidence_lineage(suspicion: SuspectNode, roots: dict[Any, Any]) -> Any:
    """The lineage whose evidence a suspicion is: its incident's, or (silent data
    corruption) that of the job whose checkpoint the drills ran. ``roots`` caches a job's
    lineage root by job id."""
    if suspicion.incident is not None:
        return suspicion.incident.lineage_root_id
    job = _evidence_job(suspicion)
    if job is None:
        return None
    if job.id not in roots:
        roots[job.id] = lineage_root(job).id
    return roots[job.id]


def _evidence_owners(items: list[SuspectNode]) -> int:
    """How many different owners (``Job.owner``: who submitted the run the evidence is
    from) the suspicions of one node come from."""
    owners = {getattr(_evidence_job(item), "owner_id", None) for item in items}
    return len(owners - {None})


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
    job's for silent data corruption); its owners, the distinct owners of those runs."""
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
            owners=_evidence_owners(items),
        )
        for items in by_node.values()
    ]
    return sorted(found, key=lambda s: (-s.owners, -s.jobs, -len(s.suspicions), s.node.name))


def node_incidents(*, node: Node, limit: int = 20) -> list[SuspectNode]:
    """The suspicions that named ``node`` (an incident's, or silent data corruption a
    pair of drills showed; cleared or not), newest first."""
    return list(_suspicions().filter(node=node).order_by("-created_at")[:limit])


@dataclass(frozen=True)
class NodeSuspicions:
    """What a person may see of the suspicions of one node. Everyone sees that it is
    suspected and how much; the evidence (other people's job ids, steps, losses, drills)
    is in ``rows`` for operators only, so a researcher learns nothing of another's run
    from a node page."""

    open: int
    cleared: int
    owners: int
    silent_data_corruption: int
    rows: list[SuspectNode]
    shows_evidence: bool

    @property
    def total(self) -> int:
        return self.open + self.cleared


def node_suspicions_for_user(*, user: User, node: Node, limit: int = 20) -> NodeSuspicions:
    """The suspicions of ``node`` as ``user`` may see them: counts for everyone, the
    evidence itself for operators (``core.roles.is_operator``)."""
    from django.db.models import Count, Q

    counts = SuspectNode.objects.filter(node=node).aggregate(
        open=Count("id", filter=Q(cleared_at__isnull=True)),
        cleared=Count("id", filter=Q(cleared_at__isnull=False)),
        sdc=Count(
            "id",
            filter=Q(cleared_at__isnull=True, kind=SuspectNode.Kind.SILENT_DATA_CORRUPTION),
        ),
    )
    open_rows = list(_suspicions().filter(node=node, cleared_at__isnull=True)[:MAX_OWNERS_READ])
    operator = is_operator(user)
    return NodeSuspicions(
        open=counts["open"] or 0,
        cleared=counts["cleared"] or 0,
        owners=_evidence_owners(open_rows),
        silent_data_corruption=counts["sdc"] or 0,
        rows=node_incidents(node=node, limit=limit) if operator else [],
        shows_evidence=operator,
    )


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
