"""Reads for jobs: who may see which job, the job list, metric series, checkpoints,
goodput, the jobs on a node, a pending job's place in the queue."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import (
    Avg,
    BooleanField,
    Case,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.http import Http404
from django.utils import timezone

from core.errors import FieldError
from core.roles import is_operator
from jobs import goodput
from jobs.models import Checkpoint, Job, MetricPoint
from nodes.models import Node
from nodes.slurm.hostlist import expand
from trainer.config import DEFAULTS as TRAINER_DEFAULTS


def job_list_for_user(*, user: Any) -> QuerySet[Job]:
    """Jobs a user may see: all for operators, their own for everyone else."""
    jobs = Job.objects.select_related("cluster", "owner")
    if is_operator(user):
        return jobs
    if not getattr(user, "is_authenticated", False):
        return jobs.none()
    return jobs.filter(owner=user)


def job_list(
    *,
    user: Any,
    state: str | None = None,
    owner: str | None = None,
    cluster: str | None = None,
    search: str | None = None,
    mine: bool = False,
) -> QuerySet[Job]:
    """The one job list behind the jobs page and the API: what ``user`` may see, filtered.

    ``state`` must be a job state (FieldError otherwise); ``owner`` a user name; ``cluster``
    a cluster name; ``search`` matches the name (contains) or the Slurm job id (exact);
    ``mine`` keeps the user's own jobs.
    """
    jobs = job_list_for_user(user=user).select_related("parent", "resume_from")
    if state:
        if state not in Job.State.values:
            raise FieldError("state", f"unknown job state {state!r}")
        jobs = jobs.filter(state=state)
    if owner:
        jobs = jobs.filter(owner__username=owner)
    if mine:
        jobs = jobs.filter(owner_id=getattr(user, "pk", None))
    if cluster:
        jobs = jobs.filter(cluster__name=cluster)
    if search:
        jobs = jobs.filter(Q(name__icontains=search) | Q(slurm_job_id=search))
    return jobs


def job_get_for_user(*, user: Any, job_id: UUID | str) -> Job:
    """The one access check for a job, used by pages, API and tasks alike.

    Raises Http404 both for a missing job and for someone else's: no existence leak.
    """
    try:
        return job_list_for_user(user=user).get(id=job_id)
    except (Job.DoesNotExist, ValueError, TypeError, ValidationError):
        raise Http404("No such job.") from None


METRIC_SERIES = (
    "loss",
    "samples_per_s",
    "tokens_per_s",
    "step_time_s",
    "data_time_s",
    "checkpoint_blocking_s",
    "elapsed_s",
)


def job_metrics(
    *,
    job: Job,
    step_min: int | None = None,
    step_max: int | None = None,
    max_points: int = 2000,
) -> dict[str, Any]:
    """Metric series for charts, at most ``max_points`` per series.

    Over the limit, steps are grouped into equal buckets in SQL and each bucket becomes
    one point (mean of each series, the bucket's last step): constant cost per request.
    """
    # The answer only changes when new metrics arrive, which moves metrics_offset.
    cache_key = f"job-metrics:{job.id}:{job.metrics_offset}:{step_min}:{step_max}:{max_points}"
    cached = cache.get(cache_key)
    if cached is not None:
        cached = dict(cached)
        # Read fresh: the events set these without new points.
        cached.update(
            optimal_loss=job.optimal_loss,
            target_loss=job.target_loss,
            target_reached_step=job.target_reached_step,
        )
        return cached  # type: ignore[no-any-return]
    result = _job_metrics_uncached(
        job=job, step_min=step_min, step_max=step_max, max_points=max_points
    )
    cache.set(cache_key, result, timeout=600)
    return result


def _job_metrics_uncached(
    *, job: Job, step_min: int | None, step_max: int | None, max_points: int
) -> dict[str, Any]:
    points = MetricPoint.objects.filter(job=job)
    if step_min is not None:
        points = points.filter(step__gte=step_min)
    if step_max is not None:
        points = points.filter(step__lte=step_max)
    bounds = points.aggregate(lo=Min("step"), hi=Max("step"), n=Count("id"))
    series_fields = list(METRIC_SERIES)
    if not bounds["n"]:
        rows: list[dict[str, Any]] = []
        downsampled = False
    elif bounds["n"] <= max_points:
        rows = list(points.order_by("step").values("step", *series_fields))
        downsampled = False
    else:
        lo, hi = bounds["lo"], bounds["hi"]
        span = hi - lo + 1
        bucket = ExpressionWrapper(
            (F("step") - lo) * max_points / span, output_field=IntegerField()
        )
        rows = list(
            points.annotate(bucket=bucket)
            .values("bucket")
            .annotate(step=Max("step"), **{name: Avg(name) for name in series_fields})
            .order_by("bucket")
            .values("step", *series_fields)
        )
        downsampled = True
    return {
        "job": str(job.id),
        "count": bounds["n"] or 0,
        "downsampled": downsampled,
        "step": [row["step"] for row in rows],
        "series": {name: [row[name] for row in rows] for name in series_fields},
        "optimal_loss": job.optimal_loss,
        "target_loss": job.target_loss,
        "target_reached_step": job.target_reached_step,
    }


def checkpoint_get_for_user(*, user: Any, checkpoint_id: int) -> Checkpoint:
    """A checkpoint of a job the user may see; 404 otherwise (no existence leak)."""
    checkpoints = Checkpoint.objects.select_related("job", "job__cluster", "job__owner").filter(
        job__in=job_list_for_user(user=user)
    )
    try:
        return checkpoints.get(pk=checkpoint_id)
    except (Checkpoint.DoesNotExist, ValueError, TypeError):
        raise Http404("No such checkpoint.") from None


def _lineage_job_ids(*, job: Job) -> list[UUID]:
    """The ids of the job's lineage: its root (followed up through the checkpoint each job
    resumed from, else its parent) and every job resumed from that root, transitively.
    One recursive query, however deep the lineage. Going down it follows ``parent`` alone,
    which ``job_resume`` always sets to the resumed checkpoint's job: an indexed join."""
    quote = connection.ops.quote_name
    jobs, checkpoints = quote(Job._meta.db_table), quote(Checkpoint._meta.db_table)
    source = f"COALESCE(c.{quote('job_id')}, j.{quote('parent_id')})"
    with_source = (
        f"{jobs} j LEFT JOIN {checkpoints} c ON c.{quote('id')} = j.{quote('resume_from_id')}"
    )
    # Depth bounds guard against a cycle someone made by hand in the admin.
    sql = f"""
        WITH RECURSIVE up(id, source, depth) AS (
            SELECT j.{quote("id")}, {source}, 0 FROM {with_source} WHERE j.{quote("id")} = %s
            UNION ALL
            SELECT j.{quote("id")}, {source}, up.depth + 1 FROM {with_source}
            JOIN up ON j.{quote("id")} = up.source WHERE up.depth < 10000
        ),
        root(id) AS (SELECT id FROM up ORDER BY depth DESC LIMIT 1),
        down(id, depth) AS (
            SELECT id, 0 FROM root
            UNION ALL
            SELECT j.{quote("id")}, down.depth + 1 FROM {jobs} j
            JOIN down ON j.{quote("parent_id")} = down.id WHERE down.depth < 10000
        )
        SELECT DISTINCT id FROM down
    """  # noqa: S608 - table and column names only; the job id is a parameter
    job_key = Job._meta.pk.get_db_prep_value(job.id, connection)  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        cursor.execute(sql, [job_key])
        ids = [UUID(str(row[0])) for row in cursor.fetchall()]
    return ids or [job.id]


def _step_totals_by_job(
    ranges: dict[str, goodput.StepRanges],
) -> dict[str, dict[bool, goodput.StepTotals]]:
    """Each lineage job's step sums, preserved (False) and lost (True), summed in the
    database: one query whatever the number of metric points."""
    lost_when = [
        When(Q(job_id=job_id, step__gt=ranges[job_id].cutoff), then=Value(True))
        for job_id in ranges
        if ranges[job_id].cutoff is not None
    ]
    lost: Any = (
        Case(*lost_when, default=Value(False), output_field=BooleanField())
        if lost_when
        else Value(False, output_field=BooleanField())
    )
    rows = (
        MetricPoint.objects.filter(job_id__in=list(ranges))
        .annotate(lost=lost)
        .values("job_id", "lost")
        .annotate(
            points=Count("id"),
            last=Max("step"),
            step_time=Sum("step_time_s"),
            data_time=Sum("data_time_s"),
            blocking=Sum("checkpoint_blocking_s"),
        )
        .order_by()
    )
    totals: dict[str, dict[bool, goodput.StepTotals]] = {}
    for row in rows:
        job_id, is_lost = str(row["job_id"]), bool(row["lost"])
        steps_range = ranges[job_id]
        after = (
            steps_range.cutoff if is_lost and steps_range.cutoff is not None else steps_range.start
        )
        totals.setdefault(job_id, {})[is_lost] = goodput.StepTotals(
            points=row["points"],
            steps=max(0, row["last"] - after),
            step_time_s=row["step_time"] or 0.0,
            data_time_s=row["data_time"] or 0.0,
            checkpoint_blocking_s=row["blocking"] or 0.0,
        )
    return totals


def _failure_history(*, cluster_id: int) -> goodput.FailureHistory:
    """Interruptions and GPU-hours of the cluster's ended jobs: one query, grouped by job
    shape (few groups), the runtimes summed in the database."""
    interrupted = [Job.State.FAILED, Job.State.LOST, Job.State.NODE_FAIL]
    rows = (
        Job.objects.filter(
            cluster_id=cluster_id,
            state__in=Job.FINAL_STATES,
            started_at__isnull=False,
            ended_at__isnull=False,
        )
        .values("nodes", "gpus_per_node", "tasks_per_node")
        .annotate(
            runtime=Sum(F("ended_at") - F("started_at"), output_field=DurationField()),
            interruptions=Count("id", filter=Q(state__in=interrupted)),
        )
        .order_by()
    )
    interruptions, gpu_hours = 0, 0.0
    for row in rows:
        gpus = goodput.job_gpus(
            nodes=row["nodes"],
            gpus_per_node=row["gpus_per_node"],
            tasks_per_node=row["tasks_per_node"],
        )
        runtime = row["runtime"]
        seconds = runtime.total_seconds() if isinstance(runtime, timedelta) else 0.0
        gpu_hours += gpus * max(0.0, seconds) / 3600.0
        interruptions += row["interruptions"]
    return goodput.FailureHistory(interruptions=interruptions, gpu_hours=gpu_hours)


def _median_checkpoint_blocking(points: QuerySet[MetricPoint]) -> float | None:
    """The median blocking seconds of the steps that saved a checkpoint: two queries (a
    count, then the middle one or two values), never the whole column."""
    blocking = points.filter(checkpoint_blocking_s__gt=0)
    count = blocking.count()
    if not count:
        return None
    middle = list(
        blocking.order_by("checkpoint_blocking_s").values_list("checkpoint_blocking_s", flat=True)[
            (count - 1) // 2 : count // 2 + 1
        ]
    )
    return goodput.median([float(value) for value in middle if value is not None])


def job_goodput(*, job: Job, now: datetime | None = None) -> dict[str, Any]:
    """The goodput ledger of the job and of its lineage, and checkpoint-interval advice
    (formulas in ``jobs.goodput``). A fixed number of queries: the metric points are
    summed in the database, never loaded."""
    now = now or timezone.now()
    lineage_ids = _lineage_job_ids(job=job)
    first_point = MetricPoint.objects.filter(job=OuterRef("pk")).order_by("step")
    lineage_jobs = list(
        Job.objects.filter(id__in=lineage_ids)
        .only("id", "created_at", "submitted_at", "started_at", "ended_at", "parent_id")
        .annotate(
            resume_step=F("resume_from__step"),
            resume_source=F("resume_from__job_id"),
            first_wall=Subquery(first_point.values("wall_time")[:1]),
            first_elapsed=Subquery(first_point.values("elapsed_s")[:1]),
        )
        .order_by("created_at", "id")
    )
    links = []
    for lineage_job in lineage_jobs:
        source = lineage_job.resume_source or lineage_job.parent_id  # type: ignore[attr-defined]
        links.append(
            goodput.LineageLink(
                job_id=str(lineage_job.id),
                created_at=lineage_job.created_at,
                source_id=str(source) if source else None,
                resume_step=lineage_job.resume_step,  # type: ignore[attr-defined]
            )
        )
    ranges = goodput.lineage_step_ranges(links)
    totals = _step_totals_by_job(ranges)
    times = []
    for lineage_job, link in zip(lineage_jobs, links, strict=True):
        loop_started_at = None
        first_wall = lineage_job.first_wall  # type: ignore[attr-defined]
        if first_wall is not None:
            elapsed = lineage_job.first_elapsed or 0.0  # type: ignore[attr-defined]
            loop_started_at = first_wall - timedelta(seconds=max(0.0, elapsed))
        job_totals = totals.get(link.job_id, {})
        times.append(
            goodput.JobTimes(
                job_id=link.job_id,
                submitted_at=lineage_job.submitted_at,
                started_at=lineage_job.started_at,
                ended_at=lineage_job.ended_at,
                loop_started_at=loop_started_at,
                resumed=link.resume_step is not None,
                preserved=job_totals.get(False, goodput.StepTotals()),
                lost=job_totals.get(True, goodput.StepTotals()),
                source_id=link.source_id,
            )
        )
    lineage, per_job = goodput.lineage_ledgers(times, now=now)
    this_job = per_job.get(str(job.id), lineage)
    return {
        **lineage.as_dict(),
        "lineage": [link.job_id for link in links],
        "started": job.started_at is not None,
        "job": this_job.as_dict(),
        "advice": _job_checkpoint_advice(
            job=job,
            lineage_ids=lineage_ids,
            totals=totals.get(str(job.id), {}),
            per_job=per_job,
            start_step=ranges[str(job.id)].start if str(job.id) in ranges else 0,
            resumed_ids={link.job_id for link in links if link.resume_step is not None},
        ).as_dict(),
    }


def _job_checkpoint_advice(
    *,
    job: Job,
    lineage_ids: list[UUID],
    totals: dict[bool, goodput.StepTotals],
    per_job: dict[str, goodput.Ledger],
    start_step: int,
    resumed_ids: set[str],
) -> goodput.Advice:
    cost = _median_checkpoint_blocking(MetricPoint.objects.filter(job=job))
    if cost is None:
        # A resumed job that has not saved yet: its lineage saves alike.
        cost = _median_checkpoint_blocking(MetricPoint.objects.filter(job_id__in=lineage_ids))
    points = sum(part.points for part in totals.values())
    step_time = sum(part.step_time_s for part in totals.values()) / points if points else None
    configured = (job.config or {}).get("checkpoint_every", TRAINER_DEFAULTS["checkpoint_every"])
    interval_steps = goodput.checkpoint_interval_steps(
        Checkpoint.objects.filter(job=job).order_by().values_list("step", flat=True),
        start_step=start_step,
        configured=configured if isinstance(configured, int) else None,
    )
    drilled = Checkpoint.objects.filter(
        job_id__in=lineage_ids, drills__load_s__isnull=False
    ).aggregate(load_s=Avg("drills__load_s"))["load_s"]
    restore_s, restore_source = None, "none"
    if drilled is not None:
        restore_s, restore_source = float(drilled), "drills"
    else:
        restores = [
            per_job[job_id].buckets["restore"]
            for job_id in resumed_ids
            if job_id in per_job and per_job[job_id].buckets["restore"] > 0
        ]
        if restores:
            restore_s, restore_source = sum(restores) / len(restores), "resume"
    return goodput.checkpoint_advice(
        checkpoint_cost_s=cost,
        history=_failure_history(cluster_id=job.cluster_id),
        gpus=goodput.job_gpus(
            nodes=job.nodes, gpus_per_node=job.gpus_per_node, tasks_per_node=job.tasks_per_node
        ),
        step_time_s=step_time,
        interval_steps=interval_steps,
        restore_s=restore_s,
        restore_source=restore_source,
    )


# A job occupies its nodes in these states; the node page lists them as running there.
ON_NODE_STATES = (Job.State.RUNNING, Job.State.COMPLETING)


@dataclass(frozen=True)
class NodeJobs:
    """The jobs on one node that a user may see, and how many running ones they may not."""

    running: list[Job]
    recent: list[Job]
    hidden_running: int


def _host_list_names(expression: str, name: str) -> bool:
    try:
        return name in expand(expression)
    except ValueError:
        return False


def _may_name_node(jobs: QuerySet[Job], *, node: Node) -> QuerySet[Job]:
    """Jobs of the node's cluster whose host list may name the node: a database filter
    that narrows the candidates before their host lists are expanded. Host list brackets
    hold only digits, so the node name's part before its first digit appears literally in
    every host list that names the node (``gpu-a`` in ``gpu-a[6-8]``)."""
    literal = re.match(r"\D*", node.name)
    prefix = literal.group(0) if literal else ""
    return jobs.filter(cluster_id=node.cluster_id, allocated_nodes__contains=prefix).exclude(
        allocated_nodes=""
    )


def jobs_on_node(
    *,
    user: Any,
    node: Node,
    recent_days: int = 7,
    limit: int = 20,
    now: datetime | None = None,
) -> NodeJobs:
    """The jobs running on ``node`` now and the newest ``limit`` that ended there in the
    last ``recent_days``, among the jobs ``user`` may see (``job_list_for_user``); running
    jobs they may not see are only counted, since the node's GPUs show them busy anyway.

    The database narrows to the node's cluster and to host lists that may name it; only
    those host lists are expanded. Ended jobs are read newest first, until ``limit`` match.
    """
    now = now or timezone.now()
    running_candidates = _may_name_node(Job.objects.filter(state__in=ON_NODE_STATES), node=node)
    running_ids = [
        job_id
        for job_id, expression in running_candidates.values_list("id", "allocated_nodes")
        if _host_list_names(expression, node.name)
    ]
    running = list(
        job_list_for_user(user=user).filter(id__in=running_ids).order_by("started_at", "id")
    )
    ended = _may_name_node(
        job_list_for_user(user=user).filter(
            state__in=Job.FINAL_STATES, ended_at__gte=now - timedelta(days=recent_days)
        ),
        node=node,
    ).order_by("-ended_at", "-id")
    recent: list[Job] = []
    if limit > 0:
        for job in ended.iterator(chunk_size=100):
            if _host_list_names(job.allocated_nodes, node.name):
                recent.append(job)
                if len(recent) >= limit:
                    break
    return NodeJobs(running=running, recent=recent, hidden_running=len(running_ids) - len(running))


@dataclass(frozen=True)
class QueuePosition:
    """Where a pending job stands among the pending jobs Gantry knows of in its cluster
    and partition, by submit time."""

    position: int
    of: int
    partition: str


def job_queue_position(*, job: Job) -> QueuePosition | None:
    """The job's place in Gantry's view of the queue, or None unless it is pending.

    Not Slurm's order: Slurm orders by priority and also sees jobs submitted without Gantry.
    One query.
    """
    if job.state != Job.State.PENDING:
        return None
    queued_at = job.submitted_at or job.created_at
    counts = (
        Job.objects.filter(
            cluster_id=job.cluster_id, partition=job.partition, state=Job.State.PENDING
        )
        .annotate(queued_at=Coalesce("submitted_at", "created_at"))
        .aggregate(
            of=Count("id"),
            ahead=Count(
                "id",
                filter=Q(queued_at__lt=queued_at) | Q(queued_at=queued_at, id__lt=job.id),
            ),
        )
    )
    of = max(counts["of"] or 0, 1)
    return QueuePosition(
        position=min((counts["ahead"] or 0) + 1, of), of=of, partition=job.partition
    )
