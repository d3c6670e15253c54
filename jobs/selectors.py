"""Reads for jobs: who may see which job, the job list, metric series, checkpoints, the
jobs on a node, a pending job's place in the queue. Goodput reads are in
``jobs.goodput.selectors`` (``job_goodput`` is re-exported here)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import (
    Avg,
    Count,
    ExpressionWrapper,
    F,
    IntegerField,
    Max,
    Min,
    Q,
    QuerySet,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.http import Http404
from django.utils import timezone

from core import cache
from core.errors import FieldError
from core.prepared import NO_INT, NO_UUID, PreparedRead, int_literal
from core.roles import is_operator, stand_in
from core.types import MaybeUser, User
from jobs.goodput.selectors import job_goodput as job_goodput
from jobs.metric_series import downsampled_series, ranged_series
from jobs.models import Checkpoint, Job, MetricPoint
from nodes.models import Node
from slurm.hostlist import expand


def job_list_for_user(*, user: MaybeUser) -> QuerySet[Job]:
    """Jobs a user may see: all for operators, their own for everyone else, none for
    someone not signed in."""
    jobs = Job.objects.select_related("cluster", "owner")
    if is_operator(user):
        return jobs
    if not user.is_authenticated:
        return jobs.none()
    return jobs.filter(owner=user)


def job_list(
    *,
    user: User,
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
    # Of the related rows only what the list shows (a cluster row is mostly SSH details).
    jobs = (
        job_list_for_user(user=user)
        .select_related("resume_from")
        .only(
            *(field.name for field in Job._meta.concrete_fields),
            "cluster__name",
            "owner__username",
            "resume_from__step",
            "resume_from__job_id",
        )
    )
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


def job_list_versions(
    jobs: QuerySet[Job], *, also: Sequence[str] = ()
) -> QuerySet[Job, dict[str, Any]]:
    """``jobs`` as ``values()`` rows that change whenever what the job list shows of a job
    changes: its id, ``created_at`` (the list's order) and a digest of its whole row
    (PostgreSQL hashes the row itself; elsewhere the columns come along), with the names
    the list shows of its owner, cluster and resumed checkpoint (``also``: and these
    related fields). Cheap to read for a page (no model objects), so a client's copy of a
    page can be checked before serializing."""
    related = ("owner__username", "cluster__name", "resume_from__step", *also)
    if connection.vendor == "postgresql":
        # Raw SQL, kept for a measured target (the job list API's capacity at 100k jobs,
        # bench/web_bench.py): the database hashes the row instead of sending every column.
        table = connection.ops.quote_name(Job._meta.db_table)
        digest = RawSQL(f"md5(CAST(ROW({table}.*) AS text))", [])  # noqa: S611 - no input
        return jobs.annotate(row_digest=digest).values("id", "created_at", "row_digest", *related)
    columns = [field.attname for field in Job._meta.concrete_fields]
    return jobs.values(*columns, *related)


def job_get_for_user(*, user: MaybeUser, job_id: UUID | str, only: Sequence[str] = ()) -> Job:
    """The one access check for a job, used by pages, API and tasks alike.

    Raises Http404 both for a missing job and for someone else's: no existence leak.
    ``only``: read just these fields of the job and none of its related rows (a poll's
    cheap look at whether anything changed; reading any other field costs a query).
    """
    if not only:
        # Compiled once per role (``core.prepared``): every job page, poll and job API call
        # reads its job this way, and compiling the wide row cost more than reading it.
        return _JOB_FOR_USER.one(user=user, job_id=job_id)
    jobs = job_list_for_user(user=user).select_related(None).only(*only)
    return job_one(jobs, job_id)


class JobReadForUser:
    """One job of ``reshape(jobs)`` (``jobs``: what ``job_list_for_user``, the one access
    rule, lets a user see; ``reshape``: annotations, ``values_list``...), compiled once per
    role (``core.prepared``) for a stand-in user: an operator sees any job, anyone else
    their own. ``one`` raises Http404 as ``job_get_for_user`` does."""

    def __init__(self, reshape: Callable[[QuerySet[Job]], QuerySet[Any]]) -> None:
        def seen_by(*, operator: bool) -> PreparedRead:
            def build(job_id: UUID, owner_id: int = NO_INT) -> QuerySet[Any]:
                user = stand_in(operator=operator, pk=owner_id)
                return reshape(job_list_for_user(user=user).filter(id=job_id))

            if operator:
                return PreparedRead(lambda job_id: build(job_id), job_id=NO_UUID)
            return PreparedRead(build, job_id=NO_UUID, owner_id=NO_INT)

        self._reads = {operator: seen_by(operator=operator) for operator in (True, False)}

    def one(self, *, user: MaybeUser, job_id: UUID | str) -> Any:
        if not user.is_authenticated:
            raise Http404("No such job.")
        operator = is_operator(user)
        values: dict[str, Any] = {"job_id": job_id}
        if not operator:
            values["owner_id"] = user.pk
        try:
            found = self._reads[operator].first(**values)
        except (ValueError, ValidationError):
            found = None  # not an id
        if found is None:
            raise Http404("No such job.")
        return found


_JOB_FOR_USER = JobReadForUser(lambda jobs: jobs)


def job_one(jobs: QuerySet[Job, Any], job_id: UUID | str) -> Any:
    """Job ``job_id`` of ``jobs`` (a queryset built on ``job_list_for_user``, possibly
    reshaped: ``values_list``, annotations); Http404 when it is not there or the id is not
    an id, as ``job_get_for_user`` answers."""
    try:
        return jobs.get(id=job_id)
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
    result = dict(
        cache.get_or_set(
            cache.JOB_METRICS,
            cache.key_job_metrics(
                job_id=job.id,
                metrics_offset=job.metrics_offset,
                step_min=step_min,
                step_max=step_max,
                max_points=max_points,
            ),
            lambda: _job_metrics_uncached(
                job=job, step_min=step_min, step_max=step_max, max_points=max_points
            ),
        )
    )
    # Read fresh: the events set these without new points.
    result.update(
        optimal_loss=job.optimal_loss,
        target_loss=job.target_loss,
        target_reached_step=job.target_reached_step,
    )
    return result


def _job_metrics_uncached(
    *, job: Job, step_min: int | None, step_max: int | None, max_points: int
) -> dict[str, Any]:
    whole = step_min is None and step_max is None
    if whole and job.points_totals_valid and job.points_count > max_points:
        # The live chart's view: extended with the new steps, not averaged again.
        series = downsampled_series(job, max_points, METRIC_SERIES)
        return {
            "job": str(job.id),
            "count": series["count"],
            "downsampled": True,
            "step": series["step"],
            "series": series["series"],
            "optimal_loss": job.optimal_loss,
            "target_loss": job.target_loss,
            "target_reached_step": job.target_reached_step,
        }
    rolled_to = job.metrics_rolled_up_to
    if rolled_to is not None and (step_min is None or step_min <= rolled_to):
        # Steps rolled up by metric retention are in range: raw points and roll-ups.
        return {
            "job": str(job.id),
            **ranged_series(job, step_min, step_max, max_points, METRIC_SERIES),
            "optimal_loss": job.optimal_loss,
            "target_loss": job.target_loss,
            "target_reached_step": job.target_reached_step,
        }
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
            (F("step") - int_literal(lo)) * int_literal(max_points) / int_literal(span),
            output_field=IntegerField(),
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


def checkpoint_get_for_user(*, user: MaybeUser, checkpoint_id: int) -> Checkpoint:
    """A checkpoint of a job the user may see; 404 otherwise (no existence leak)."""
    checkpoints = Checkpoint.objects.select_related("job", "job__cluster", "job__owner").filter(
        job__in=job_list_for_user(user=user)
    )
    try:
        return checkpoints.get(pk=checkpoint_id)
    except (Checkpoint.DoesNotExist, ValueError, TypeError):
        raise Http404("No such checkpoint.") from None


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
    user: User,
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
