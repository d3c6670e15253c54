"""Reads for goodput: a job's lineage ledger and checkpoint-interval advice (``job_goodput``),
and the pieces the fleet views share (``jobs.goodput.fleet``). Formulas in ``jobs.goodput.ledger``.

Every read here runs a fixed number of queries: metric points are never loaded; their sums
come from the job row where ingest keeps them (``Job.points_*``), else from the database.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import (
    Avg,
    BooleanField,
    Case,
    Count,
    DurationField,
    Exists,
    F,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.utils import timezone

from core import cache
from health.models import HealthEvent
from jobs.goodput import ledger as goodput
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint, MetricRollup
from nodes.models import Cluster, HealthState
from slurm.hostlist import expand
from trainer.config import DEFAULTS as TRAINER_DEFAULTS


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


def _lost_case(ranges: dict[str, goodput.StepRanges], step_field: str) -> Any:
    """True for a step after its job's cutoff (only jobs with a cutoff get a CASE arm)."""
    lost_when = [
        When(Q(job_id=job_id, **{f"{step_field}__gt": ranges[job_id].cutoff}), then=Value(True))
        for job_id in ranges
        if ranges[job_id].cutoff is not None
    ]
    if not lost_when:
        return Value(False, output_field=BooleanField())
    return Case(*lost_when, default=Value(False), output_field=BooleanField())


def _rollup_step_rows(
    ranges: dict[str, goodput.StepRanges], rolled_up: list[str]
) -> list[dict[str, Any]]:
    """``step_totals_by_job``'s rows for the roll-ups of the jobs in ``rolled_up`` (one
    query). Metric retention keeps the steps after a resumed checkpoint raw, so no roll-up
    straddles a cutoff: its first step places it."""
    return list(
        MetricRollup.objects.filter(job_id__in=rolled_up)
        .annotate(lost=_lost_case(ranges, "first_step"))
        .values("job_id", "lost")
        .annotate(
            points=Sum("count"),
            last=Max("last_step"),
            step_time=Sum("step_time_sum"),
            data_time=Sum("data_time_sum"),
            blocking=Sum("checkpoint_blocking_sum"),
        )
        .order_by()
    )


def _add_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the same job and side added up (points and roll-ups)."""
    added: dict[tuple[str, bool], dict[str, Any]] = {}
    for row in rows:
        key = (str(row["job_id"]), bool(row["lost"]))
        into = added.get(key)
        if into is None:
            added[key] = dict(row)
            continue
        into["points"] += row["points"]
        into["last"] = max(into["last"], row["last"])
        for name in ("step_time", "data_time", "blocking"):
            into[name] = (into[name] or 0.0) + (row[name] or 0.0)
    return list(added.values())


def step_totals_by_job(
    ranges: dict[str, goodput.StepRanges],
    *,
    points: QuerySet[MetricPoint] | None = None,
    rolled_up: list[str] | None = None,
) -> dict[str, dict[bool, goodput.StepTotals]]:
    """Each job's step sums, preserved (False) and lost (True), summed in the database:
    one query whatever the number of metric points, and one more for the roll-ups of the
    jobs in ``rolled_up`` (``jobs.metric_retention``). ``points`` narrows the points read
    (default: those of the jobs in ``ranges``)."""
    if points is None:
        points = MetricPoint.objects.filter(job_id__in=list(ranges))
    rows = list(
        points.annotate(lost=_lost_case(ranges, "step"))
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
    if rolled_up:
        rows = _add_rows(rows + _rollup_step_rows(ranges, rolled_up))
    totals: dict[str, dict[bool, goodput.StepTotals]] = {}
    for row in rows:
        job_id, is_lost = str(row["job_id"]), bool(row["lost"])
        steps_range = ranges.get(job_id)
        if steps_range is None:
            continue
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


# What the ledger reads of each job, as ``values()`` keys (see ``with_ledger_inputs``).
LEDGER_FIELDS = ("id", "created_at", "submitted_at", "started_at", "ended_at", "parent_id")
# The point sums ingest keeps on the job (``Job.points_*``), and the offset they hold at.
POINT_TOTALS = (
    "metrics_offset",
    "points_totals_offset",
    "points_count",
    "points_last_step",
    "points_step_time_s",
    "points_data_time_s",
    "points_blocking_s",
    "metrics_rolled_up_to",
)
LEDGER_INPUTS = (
    *LEDGER_FIELDS,
    *POINT_TOTALS,
    "resume_step",
    "resume_source",
    "first_wall",
    "first_elapsed",
    "last_wall",
    "had_incident",
)


def with_ledger_inputs(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """``jobs`` annotated with what the ledger needs beyond the job's own columns: the
    resumed checkpoint's step and job, the first logged step's wall time and elapsed
    seconds (the training loop's start) and the last logged step's wall time. From the
    job's kept sums where they hold, else subqueries in the one query that reads the jobs
    (the database runs a subquery only for the rows that need it)."""
    points = MetricPoint.objects.filter(job=OuterRef("pk"))
    first_point = points.order_by("step")
    kept = Q(points_totals_offset=F("metrics_offset"))

    def kept_or(field: str, subquery: Subquery) -> Case:
        return Case(When(kept, then=F(field)), default=subquery)

    return jobs.annotate(
        resume_step=F("resume_from__step"),
        resume_source=F("resume_from__job_id"),
        first_wall=kept_or("points_first_wall", Subquery(first_point.values("wall_time")[:1])),
        first_elapsed=kept_or(
            "points_first_elapsed_s", Subquery(first_point.values("elapsed_s")[:1])
        ),
        last_wall=kept_or(
            "points_last_wall", Subquery(points.order_by("-step").values("wall_time")[:1])
        ),
        had_incident=Exists(
            JobEvent.objects.filter(job=OuterRef("pk"), kind=JobEvent.Kind.INCIDENT)
        ),
    )


def _kept_totals(
    row: dict[str, Any], steps_range: goodput.StepRanges
) -> dict[bool, goodput.StepTotals] | None:
    """A job's step totals from the sums ingest keeps on it (a ``with_ledger_inputs`` row),
    when they hold and none of its steps were redone; None: sum its points instead."""
    offset = row["points_totals_offset"]
    if offset is None or offset != row["metrics_offset"] or steps_range.cutoff is not None:
        return None
    if not row["points_count"]:
        return {}
    return {
        False: goodput.StepTotals(
            points=row["points_count"],
            steps=max(0, (row["points_last_step"] or 0) - steps_range.start),
            step_time_s=row["points_step_time_s"],
            data_time_s=row["points_data_time_s"],
            checkpoint_blocking_s=row["points_blocking_s"],
        )
    }


def step_totals(
    rows: list[dict[str, Any]],
    ranges: dict[str, goodput.StepRanges],
    *,
    points: QuerySet[MetricPoint] | None = None,
) -> dict[str, dict[bool, goodput.StepTotals]]:
    """Each job's step totals (see ``step_totals_by_job``) for ``with_ledger_inputs`` rows:
    from the sums kept on the job where they hold and all its steps are preserved, summed
    in the database (one query, narrowed by ``points``) for the rest."""
    totals: dict[str, dict[bool, goodput.StepTotals]] = {}
    rest: dict[str, goodput.StepRanges] = {}
    for row in rows:
        job_id = str(row["id"])
        steps_range = ranges.get(job_id)
        if steps_range is None:
            continue
        kept = _kept_totals(row, steps_range)
        if kept is None:
            rest[job_id] = steps_range
        elif kept:
            totals[job_id] = kept
    if rest:
        rolled_up = [
            str(row["id"])
            for row in rows
            if str(row["id"]) in rest and row.get("metrics_rolled_up_to") is not None
        ]
        totals.update(step_totals_by_job(rest, points=points, rolled_up=rolled_up))
    return totals


def _lineage_step_totals(
    rows: list[dict[str, Any]], ranges: dict[str, goodput.StepRanges]
) -> dict[str, dict[bool, goodput.StepTotals]]:
    """``step_totals`` for one lineage. The split sums of a job whose steps were redone
    are cached under its offset and step range, which change with its points (jobs whose
    sums ingest does not keep are summed each time, in the same query as the rest)."""
    keys = {
        str(row["id"]): cache.key_goodput_step_totals(
            job_id=row["id"],
            metrics_offset=row["metrics_offset"],
            step_start=ranges[str(row["id"])].start,
            step_cutoff=ranges[str(row["id"])].cutoff,
        )
        for row in rows
        if str(row["id"]) in ranges
        and ranges[str(row["id"])].cutoff is not None
        and row["points_totals_offset"] == row["metrics_offset"]
    }
    never_kept = [row for row in rows if str(row["id"]) not in keys]

    def sum_missing(missing: list[str]) -> dict[str, dict[bool, goodput.StepTotals]]:
        wanted = set(missing)
        totals = step_totals([row for row in rows if str(row["id"]) in wanted] + never_kept, ranges)
        # A job without totals is kept as such: it is not summed again either.
        return {**totals, **{job_id: totals.get(job_id, {}) for job_id in missing}}

    return cache.get_many_or_set(cache.GOODPUT_STEP_TOTALS, keys, sum_missing)


def lineage_link(row: dict[str, Any]) -> goodput.LineageLink:
    """A ``with_ledger_inputs`` row (``values()``) as a lineage link."""
    source = row["resume_source"] or row["parent_id"]
    return goodput.LineageLink(
        job_id=str(row["id"]),
        created_at=row["created_at"],
        source_id=str(source) if source else None,
        resume_step=row["resume_step"],
    )


def job_times(
    row: dict[str, Any], link: goodput.LineageLink, totals: dict[bool, goodput.StepTotals]
) -> goodput.JobTimes:
    """A ``with_ledger_inputs`` row with its step totals, as the ledger's input."""
    loop_started_at = None
    if row["first_wall"] is not None:
        elapsed = row["first_elapsed"] or 0.0
        loop_started_at = row["first_wall"] - timedelta(seconds=max(0.0, elapsed))
    return goodput.JobTimes(
        job_id=link.job_id,
        submitted_at=row["submitted_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        loop_started_at=loop_started_at,
        resumed=link.resume_step is not None,
        preserved=totals.get(False, goodput.StepTotals()),
        lost=totals.get(True, goodput.StepTotals()),
        source_id=link.source_id,
        last_step_at=row["last_wall"],
        incident=bool(row.get("had_incident")),
    )


def cluster_failure_history(*, cluster: Cluster) -> goodput.FailureHistory:
    """``_failure_history`` of ``cluster``, reused for up to a minute: an interruption rate
    over the cluster's whole history moves slowly, and summing it takes the longest of
    the ledger's reads. The key names the cluster row (id and creation time)."""
    return cache.get_or_set(
        cache.CLUSTER_FAILURE_HISTORY,
        cache.key_cluster_failure_history(
            cluster_id=cluster.pk, cluster_created_at=cluster.created_at
        ),
        lambda: _failure_history(cluster_id=cluster.pk),
    )


# Endings Slurm itself reports as an interruption: a node failure, and the preemptions and
# boot failures Gantry's ``failed`` folds in (``jobs.lifecycle`` keeps Slurm's state as the
# reason). Nothing a job writes moves these.
_SLURM_INTERRUPTIONS = (
    Q(state=Job.State.NODE_FAIL)
    | Q(state=Job.State.FAILED, state_reason__startswith="preempted")
    | Q(state=Job.State.FAILED, state_reason__startswith="boot failure")
)
# A health probe that finds a node critical this long after a job on it ended still speaks
# of the job's end (the probe runs on its own schedule, after the node went bad).
HEALTH_EVIDENCE_GRACE = timedelta(minutes=15)


def _failure_history(*, cluster_id: int) -> goodput.FailureHistory:
    """Interruptions and GPU-hours of the cluster's ended jobs: one query, grouped by job
    shape (few groups), the runtimes summed in the database.

    An interruption is one that Slurm or Gantry's health checks evidence: Slurm's own
    node failure, preemption or boot failure, or a job that failed (or that recovery
    stopped) while Gantry's health probe found one of its nodes turning critical
    (``_health_evidenced``). A failure only the job's own files or exit code claim (a crash
    of its program, a hang, a straggler, a diverged loss) is not counted: the rate is every
    researcher's checkpoint advice, and one researcher's jobs must not move it."""
    rows = (
        _ended_jobs(cluster_id)
        .values("nodes", "gpus_per_node", "tasks_per_node")
        .annotate(
            runtime=Sum(F("ended_at") - F("started_at"), output_field=DurationField()),
            interruptions=Count("id", filter=_SLURM_INTERRUPTIONS),
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
    interruptions += _health_evidenced(cluster_id)
    return goodput.FailureHistory(interruptions=interruptions, gpu_hours=gpu_hours)


def _ended_jobs(cluster_id: int) -> QuerySet[Job]:
    return Job.objects.filter(
        cluster_id=cluster_id,
        state__in=Job.FINAL_STATES,
        started_at__isnull=False,
        ended_at__isnull=False,
    )


def _health_evidenced(cluster_id: int) -> int:
    """Jobs that failed, were lost or were stopped by recovery (and are not counted as
    Slurm's already) while Gantry's health probe saw one of their nodes turn critical,
    from their start to ``HEALTH_EVIDENCE_GRACE`` after their end. Two queries; none of
    the jobs' rows is read when the probe never saw a node of the cluster turn critical."""
    changes: dict[str, list[datetime]] = {}
    for name, at in HealthEvent.objects.filter(
        node__cluster_id=cluster_id, to_state=HealthState.CRITICAL
    ).values_list("node__name", "at"):
        changes.setdefault(name, []).append(at)
    if not changes:
        return 0
    first = min(min(times) for times in changes.values())
    last = max(max(times) for times in changes.values())
    candidates = (
        _ended_jobs(cluster_id)
        .filter(Q(state__in=[Job.State.FAILED, Job.State.LOST]) | Q(incidents__isnull=False))
        .exclude(_SLURM_INTERRUPTIONS)
        .filter(started_at__lte=last, ended_at__gte=first - HEALTH_EVIDENCE_GRACE)
        .exclude(allocated_nodes="")
        .values_list("id", "allocated_nodes", "started_at", "ended_at")
        .distinct()
    )
    counted = set()
    for job_id, allocated, started_at, ended_at in candidates:
        # Both set (``_ended_jobs``); checked again for the type checker.
        if started_at is None or ended_at is None:
            continue
        until = ended_at + HEALTH_EVIDENCE_GRACE
        try:
            names = expand(allocated)
        except ValueError:
            continue
        if any(started_at <= at <= until for name in names for at in changes.get(name, ())):
            counted.add(job_id)
    return len(counted)


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
    (formulas in ``jobs.goodput.ledger``). A fixed number of queries: the metric points are
    summed in the database, never loaded."""
    now = now or timezone.now()
    lineage_ids = _lineage_job_ids(job=job)
    rows = list(
        with_ledger_inputs(Job.objects.filter(id__in=lineage_ids))
        .values(*LEDGER_INPUTS)
        .order_by("created_at", "id")
    )
    links = [lineage_link(row) for row in rows]
    ranges = goodput.lineage_step_ranges(links)
    totals = _lineage_step_totals(rows, ranges)
    times = [
        job_times(row, link, totals.get(link.job_id, {}))
        for row, link in zip(rows, links, strict=True)
    ]
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
        history=cluster_failure_history(cluster=job.cluster),
        gpus=goodput.job_gpus(
            nodes=job.nodes, gpus_per_node=job.gpus_per_node, tasks_per_node=job.tasks_per_node
        ),
        step_time_s=step_time,
        interval_steps=interval_steps,
        restore_s=restore_s,
        restore_source=restore_source,
    )
