"""Writes for scaling studies: create a study, submit its points one after another.

Points run one at a time, smallest scale first: two points sharing nodes would measure
each other. ``study_advance`` submits the next point once no point of the study is
active; it is called on create and by beat, and is safe to re-run (a point is claimed
with a conditional update, inside the transaction that saves its job).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction

from core.audit import audit_event_record
from core.errors import ApplicationError, FieldError
from core.roles import is_researcher
from core.types import User
from jobs.placement import job_request_with_advice
from jobs.services import job_submit
from jobs.validation import JobRequest, job_request_validate
from nodes.access.identities import cluster_account_for
from nodes.models import Cluster
from nodes.placement_service import placement_as_dict
from studies.models import ScalingStudy, StudyPoint
from trainer.config import ConfigError
from trainer.config import validate as trainer_config_validate

logger = logging.getLogger(__name__)

MAX_POINTS = 12
_SCALES = re.compile(r"^\s*\d+(\s*,\s*\d+)*\s*$")


def parse_scales(raw: str | list[Any]) -> list[int]:
    """``"1,2,4"`` or ``[1, 2, 4]`` → ``[1, 2, 4]``; refuses duplicates, zero and junk."""
    if isinstance(raw, str):
        if not _SCALES.match(raw):
            raise FieldError("scales", "rank counts separated by commas, e.g. 1,2,4")
        values = [int(part) for part in raw.split(",")]
    else:
        if not all(isinstance(value, int) and not isinstance(value, bool) for value in raw):
            raise FieldError("scales", "a list of whole rank counts, e.g. [1, 2, 4]")
        values = list(raw)
    if len(values) < 2:
        raise FieldError("scales", "a study needs at least two scales to compare")
    if len(values) > MAX_POINTS:
        raise FieldError("scales", f"at most {MAX_POINTS} scales")
    if any(value < 1 for value in values):
        raise FieldError("scales", "every rank count must be at least 1")
    if len(set(values)) != len(values):
        raise FieldError("scales", "each rank count once")
    return sorted(values)


def point_shape(*, ranks: int, ranks_per_node: int) -> tuple[int, int]:
    """(nodes, tasks per node) for R ranks: fill nodes with up to ``ranks_per_node``."""
    if ranks <= ranks_per_node:
        return 1, ranks
    if ranks % ranks_per_node:
        raise FieldError(
            "scales",
            f"{ranks} ranks do not fill whole nodes of {ranks_per_node} ranks each; use a "
            f"multiple of {ranks_per_node} or set ranks per node to 1",
        )
    return ranks // ranks_per_node, ranks_per_node


def point_batches(*, kind: str, batch_size: int, ranks: int) -> tuple[int, int]:
    """(per-rank batch, global batch) of a point."""
    if kind == ScalingStudy.Kind.STRONG:
        if batch_size % ranks:
            raise FieldError(
                "batch_size",
                f"strong scaling keeps the global batch {batch_size} fixed, so each of the "
                f"{ranks} ranks would get {batch_size / ranks:g} samples; choose a global batch "
                f"divisible by every scale",
            )
        return batch_size // ranks, batch_size
    return batch_size, batch_size * ranks


def _point_request(study: ScalingStudy, point: StudyPoint) -> JobRequest:
    config = dict(study.config)
    config["batch_size"] = point.per_rank_batch
    config["steps"] = study.total_steps
    return JobRequest(
        cluster=study.cluster,
        name=f"{study.name} · {point.ranks} rank{'s' if point.ranks != 1 else ''}",
        config=config,
        partition=study.partition,
        nodes=point.nodes,
        gpus_per_node=study.gpus_per_rank * point.tasks_per_node,
        gpu_type=study.gpu_type,
        tasks_per_node=point.tasks_per_node,
        cpus_per_task=1,
        memory_mb=None,
        time_limit_minutes=study.time_limit_minutes,
        nodelist="",
        switches="",
    )


def _check_study_input(
    *,
    kind: str,
    name: str,
    scales: str | list[Any],
    ranks_per_node: int,
    gpus_per_rank: int,
    measured_steps: int,
    warmup_steps: int,
) -> list[int]:
    """Refuse, with the field and why, what no study can be; returns the rank counts."""
    if kind not in ScalingStudy.Kind.values:
        raise FieldError("kind", "strong or weak")
    if not name.strip():
        raise FieldError("name", "a name is required")
    ranks_list = parse_scales(scales)
    if ranks_per_node < 1:
        raise FieldError("ranks_per_node", "at least 1")
    if gpus_per_rank not in (0, 1):
        raise FieldError("gpus_per_rank", "0 (CPU ranks) or 1")
    if measured_steps < 1:
        raise FieldError("measured_steps", "at least 1")
    if warmup_steps < 0:
        raise FieldError("warmup_steps", "cannot be negative")
    return ranks_list


def _study_batch_size(base: dict[str, Any], batch_size: int | None) -> int:
    """The study's batch size: as given, else the trainer config's (preset) batch."""
    if batch_size is None:
        try:
            batch_size = trainer_config_validate(base).batch_size
        except ConfigError:
            batch_size = 16
    if batch_size < 1:
        raise FieldError("batch_size", "at least 1")
    return batch_size


def _study_point(study: ScalingStudy, ranks: int) -> StudyPoint:
    """One point of the study, checked against the cluster like a job would be."""
    nodes, tasks = point_shape(ranks=ranks, ranks_per_node=study.ranks_per_node)
    per_rank, global_batch = point_batches(
        kind=study.kind, batch_size=study.batch_size, ranks=ranks
    )
    point = StudyPoint(
        ranks=ranks,
        nodes=nodes,
        tasks_per_node=tasks,
        per_rank_batch=per_rank,
        global_batch=global_batch,
    )
    try:
        job_request_validate(_point_request(study, point))
    except FieldError as error:
        raise FieldError(error.field, f"at {ranks} ranks: {error.why}") from None
    return point


def study_create(
    *,
    user: User,
    cluster: Cluster,
    name: str,
    kind: str,
    scales: str | list[Any],
    config: dict[str, Any],
    batch_size: int | None,
    warmup_steps: int,
    measured_steps: int,
    partition: str,
    ranks_per_node: int = 1,
    gpus_per_rank: int = 1,
    gpu_type: str = "",
    time_limit_minutes: int = 15,
    use_placement: bool = True,
    target_requested: bool = False,
) -> ScalingStudy:
    """Validate every point up front (refusing with the field and why), save the study
    and its points, and submit the first point after commit."""
    if not is_researcher(user):
        raise PermissionDenied("You need the researcher or operator role to run studies.")
    # Its jobs run as the owner's account there: refuse now rather than at the first point.
    cluster_account_for(cluster=cluster, user=user)
    ranks_list = _check_study_input(
        kind=kind,
        name=name,
        scales=scales,
        ranks_per_node=ranks_per_node,
        gpus_per_rank=gpus_per_rank,
        measured_steps=measured_steps,
        warmup_steps=warmup_steps,
    )
    base = {k: v for k, v in (config or {}).items() if k not in {"batch_size", "steps"}}
    batch_size = _study_batch_size(base, batch_size)
    study = ScalingStudy(
        owner=user,
        cluster=cluster,
        name=name.strip()[:128],
        kind=kind,
        scales=ranks_list,
        config=base,
        batch_size=batch_size,
        warmup_steps=warmup_steps,
        measured_steps=measured_steps,
        partition=partition or cluster.default_partition,
        ranks_per_node=ranks_per_node,
        gpus_per_rank=gpus_per_rank,
        gpu_type=gpu_type,
        time_limit_minutes=time_limit_minutes,
        use_placement=use_placement,
        target_requested=target_requested,
    )
    points = [_study_point(study, ranks) for ranks in ranks_list]
    with transaction.atomic():
        study.save(force_insert=True)
        for point in points:
            point.study = study
            point.save(force_insert=True)
        audit_event_record(
            actor=user,
            action="study.create",
            target=study,
            details={"kind": kind, "scales": ranks_list, "cluster": cluster.name},
        )
        study_id = study.pk
        transaction.on_commit(lambda: study_advance(study_id=study_id))
    return study


def study_advance(*, study_id: int) -> str:
    """Submit the study's next point when none of its points is active.

    Accepts any study; re-running is safe: a point is taken only while it has no job,
    by a conditional update in the same transaction that saves the job.
    """
    study = ScalingStudy.objects.select_related("cluster", "owner").filter(pk=study_id).first()
    if study is None:
        return "no such study"
    points = list(study.points.select_related("job").order_by("ranks"))
    if any(p.job is not None and not p.job.is_final for p in points):
        return "a point is running"
    waiting = [p for p in points if p.job_id is None and not p.submit_error]
    if not waiting:
        return "nothing to submit"
    point = waiting[0]
    request = _point_request(study, point)
    placement: dict[str, Any] | None = None
    try:
        with transaction.atomic():
            if study.use_placement:
                request, advice = job_request_with_advice(request)
                placement = placement_as_dict(advice)
            job = job_submit(user=study.owner, request=request)
            claimed = StudyPoint.objects.filter(pk=point.pk, job__isnull=True).update(
                job=job, placement=placement
            )
            if not claimed:
                # Another advance got there first: undo this job.
                raise _AlreadyClaimed
    except _AlreadyClaimed:
        return "taken by another worker"
    except FieldError as error:
        if error.field == "use_placement_advice":
            # No placement possible right now (nodes busy): try again on the next cycle.
            return f"waiting: {error.why}"
        StudyPoint.objects.filter(pk=point.pk, job__isnull=True).update(submit_error=error.message)
        return f"point {point.ranks} refused: {error.message}"
    except ApplicationError as error:
        StudyPoint.objects.filter(pk=point.pk, job__isnull=True).update(submit_error=error.message)
        return f"point {point.ranks} refused: {error.message}"
    return f"submitted {point.ranks} ranks as job {job.id}"


class _AlreadyClaimed(Exception):
    pass


def studies_advance_all() -> int:
    """Advance every study with a point still to submit; returns how many were looked at."""
    ids = list(
        ScalingStudy.objects.filter(points__job__isnull=True, points__submit_error="")
        .values_list("pk", flat=True)
        .distinct()
    )
    for study_id in ids:
        try:
            study_advance(study_id=study_id)
        except Exception:
            logger.exception("advancing study %s failed", study_id)
    return len(ids)


def study_results_freeze(*, study: ScalingStudy) -> int:
    """Store the steady-state figures of points whose job ended and was read for the last
    time (so later reads need no metric scan). Safe to re-run; returns how many froze."""
    from studies.selectors import point_steady_state

    frozen = 0
    for point in study.points.select_related("job").filter(results__isnull=True):
        job = point.job
        if job is None or not (job.is_final and job.files_final):
            continue
        results = point_steady_state(point=point, warmup_steps=study.warmup_steps)
        frozen += StudyPoint.objects.filter(pk=point.pk, results__isnull=True).update(
            results=results
        )
    return frozen
