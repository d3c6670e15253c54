from __future__ import annotations

from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404

from controlplane.roles import is_operator
from jobs.models import Checkpoint, Job, RestoreDrill


def job_list_for_user(*, user: Any) -> QuerySet[Job]:
    """Jobs a user may see: all for operators, their own for everyone else."""
    jobs = Job.objects.select_related("cluster", "owner")
    if is_operator(user):
        return jobs
    if not getattr(user, "is_authenticated", False):
        return jobs.none()
    return jobs.filter(owner=user)


def job_get_for_user(*, user: Any, job_id: UUID | str) -> Job:
    """The one access check for a job, used by pages, API and tasks alike.

    Raises Http404 both for a missing job and for someone else's: no existence leak.
    """
    try:
        return job_list_for_user(user=user).get(id=job_id)
    except (Job.DoesNotExist, ValueError, TypeError, ValidationError):
        raise Http404("No such job.") from None


def restore_drill_list_for_user(*, user: Any) -> QuerySet[RestoreDrill]:
    drills = RestoreDrill.objects.select_related("checkpoint", "checkpoint__job")
    if is_operator(user):
        return drills
    if not getattr(user, "is_authenticated", False):
        return drills.none()
    return drills.filter(checkpoint__job__owner=user)


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
    from django.core.cache import cache

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
    from django.db.models import Avg, Count, Max, Min

    from jobs.models import MetricPoint

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
        from django.db.models import ExpressionWrapper, F, IntegerField

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


def job_throughput_now(*, job: Job) -> float | None:
    """Current samples/s: the mean of the newest logged steps, kept on the job by the
    watcher (``None`` before the first metrics)."""
    return job.throughput_now


def checkpoint_get_for_user(*, user: Any, checkpoint_id: int) -> Checkpoint:
    """A checkpoint of a job the user may see; 404 otherwise (no existence leak)."""
    checkpoints = Checkpoint.objects.select_related("job", "job__cluster", "job__owner")
    if not is_operator(user):
        if not getattr(user, "is_authenticated", False):
            raise Http404("No such checkpoint.")
        checkpoints = checkpoints.filter(job__owner=user)
    try:
        return checkpoints.get(pk=checkpoint_id)
    except (Checkpoint.DoesNotExist, ValueError, TypeError):
        raise Http404("No such checkpoint.") from None


def drill_fleet_health(*, user: Any) -> dict[str, Any]:
    """Share of running jobs whose newest checkpoint is proven, recent failures,
    the time-to-restore distribution and drills in flight."""
    from django.db.models import OuterRef, Subquery

    newest_proven = Subquery(
        Checkpoint.objects.filter(job=OuterRef("pk")).order_by("-step").values("last_proven_at")[:1]
    )
    running_jobs = job_list_for_user(user=user).filter(state=Job.State.RUNNING)
    running = running_jobs.count()
    proven = (
        running_jobs.annotate(newest_proven=newest_proven)
        .filter(newest_proven__isnull=False)
        .count()
    )
    drills = restore_drill_list_for_user(user=user)
    failures = list(
        drills.filter(verdict=RestoreDrill.Verdict.FAILED).order_by("-finished_at")[:10]
    )
    errors = list(drills.filter(verdict=RestoreDrill.Verdict.ERROR).order_by("-finished_at")[:5])
    load_times = list(
        drills.filter(verdict=RestoreDrill.Verdict.PASSED, load_s__isnull=False)
        .order_by("-finished_at")
        .values_list("load_s", flat=True)[:500]
    )
    in_flight = list(drills.filter(state__in=RestoreDrill.ACTIVE_STATES).order_by("created_at"))
    proven_checkpoints = Checkpoint.objects.filter(
        last_proven_at__isnull=False, job__in=job_list_for_user(user=user)
    ).count()
    return {
        "running_jobs": running,
        "running_jobs_proven": proven,
        "proven_share": (proven / running) if running else None,
        "recent_failures": failures,
        "recent_errors": errors,
        "load_times": sorted(load_times),
        "in_flight": in_flight,
        "proven_checkpoints": proven_checkpoints,
        "passed": drills.filter(verdict=RestoreDrill.Verdict.PASSED).count(),
        "failed": drills.filter(verdict=RestoreDrill.Verdict.FAILED).count(),
        "errored": drills.filter(verdict=RestoreDrill.Verdict.ERROR).count(),
    }
