"""Reads for scaling studies: access checks, steady-state figures and the study table.

Definitions (X = steady-state global samples/s, R = ranks, the baseline is the smallest
scale of the study, R₀ and X₀):

* steady state: logged steps after the first ``warmup_steps``, without the steps that
  were blocked by a checkpoint (``checkpoint_blocking_s > 0``); medians of those steps.
* speed-up = X / X₀; ideal speed-up = R / R₀.
* efficiency = speed-up / ideal = (X / R) / (X₀ / R₀): throughput per rank against the
  baseline's. For strong scaling (fixed global batch) this equals T₀·R₀ / (T·R) on step
  times; for weak scaling it is per-rank throughput against per-rank throughput at the
  smallest scale.
* compute and communication: only estimated, from a 1-rank point, where a step has no
  communication: compute per sample = median(step time − data time) / per-rank batch of
  that point; a point's compute ≈ that × its per-rank batch (assumes compute linear in the
  per-rank batch, exact for weak scaling where the batch is the same); communication ≈
  step time − data time − compute, floored at 0. Without a 1-rank point: not measurable.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404
from django.urls import reverse

from core.roles import is_operator
from core.types import User
from jobs.models import Job, MetricPoint
from studies.models import ScalingStudy, StudyPoint

WEAK_DISCLAIMER = (
    "Weak scaling grows the global batch with the ranks: more samples per second here is "
    "more data processed, not faster convergence of an unchanged objective. A larger "
    "global batch changes the optimisation (and usually needs a different learning rate), "
    "so compare time to target, not throughput, to judge training speed."
)
STRONG_NOTE = (
    "Strong scaling keeps the global batch fixed, so every point optimises the same "
    "objective with the same batch: higher throughput is faster training step for step."
)
COMPUTE_METHOD = (
    "Compute is estimated from the 1-rank point, which does no communication: its median "
    "(step time − data time), scaled by the per-rank batch. Communication ≈ step time − "
    "data time − estimated compute. Estimates, not measurements."
)
NOT_MEASURABLE = (
    "Compute and communication are not measurable for this study: it has no finished "
    "1-rank point to estimate compute from."
)


def study_list_for_user(*, user: User) -> QuerySet[ScalingStudy]:
    """Studies a user may see: all for operators, their own for everyone else."""
    studies = ScalingStudy.objects.select_related("cluster", "owner")
    if is_operator(user):
        return studies
    if not getattr(user, "is_authenticated", False):
        return studies.none()
    return studies.filter(owner=user)


def study_get_for_user(*, user: User, study_id: int | str) -> ScalingStudy:
    """The one access check for a study; 404 for a missing one and someone else's."""
    try:
        return study_list_for_user(user=user).get(pk=study_id)
    except (ScalingStudy.DoesNotExist, ValueError, TypeError, ValidationError):
        raise Http404("No such study.") from None


# --------------------------------------------------------------------------- maths


def _median(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def steady_state(rows: Sequence[Mapping[str, Any]], *, warmup_steps: int) -> dict[str, Any]:
    """Steady-state medians of logged steps (dicts with MetricPoint's field names)."""
    after_warmup = [row for row in rows if row["step"] > warmup_steps]
    measured = [row for row in after_warmup if not (row.get("checkpoint_blocking_s") or 0) > 0]
    non_data = [
        row["step_time_s"] - (row.get("data_time_s") or 0.0)
        for row in measured
        if row.get("step_time_s") is not None
    ]
    return {
        "steps_logged": len(rows),
        "steps_measured": len(measured),
        "excluded_warmup": len(rows) - len(after_warmup),
        "excluded_checkpoint": len(after_warmup) - len(measured),
        "samples_per_s": _median(row.get("samples_per_s") for row in measured),
        "tokens_per_s": _median(row.get("tokens_per_s") for row in measured),
        "step_time_s": _median(row.get("step_time_s") for row in measured),
        "data_time_s": _median(row.get("data_time_s") for row in measured),
        "non_data_time_s": _median(non_data),
    }


def point_steady_state(*, point: StudyPoint, warmup_steps: int) -> dict[str, Any]:
    if point.job_id is None:
        return steady_state([], warmup_steps=warmup_steps)
    rows = list(
        MetricPoint.objects.filter(job_id=point.job_id)
        .order_by("step")
        .values(
            "step",
            "samples_per_s",
            "tokens_per_s",
            "step_time_s",
            "data_time_s",
            "checkpoint_blocking_s",
        )
    )
    return steady_state(rows, warmup_steps=warmup_steps)


def scaling_table(points: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """Add speed-up, ideal, efficiency and the compute/communication estimate to points.

    Each point: ``ranks``, ``per_rank_batch`` and its steady state (``samples_per_s``,
    ``step_time_s``, ``data_time_s``, ``non_data_time_s``). Returns the rows and whether
    compute/communication could be estimated.
    """
    ordered = sorted(points, key=lambda p: p["ranks"])
    measured = [p for p in ordered if p.get("samples_per_s")]
    baseline = measured[0] if measured else None
    one_rank = next((p for p in measured if p["ranks"] == 1 and p.get("non_data_time_s")), None)
    compute_per_sample = (
        one_rank["non_data_time_s"] / one_rank["per_rank_batch"] if one_rank else None
    )
    rows = []
    for point in ordered:
        row = dict(point)
        throughput = point.get("samples_per_s")
        row["per_rank_samples_per_s"] = throughput / point["ranks"] if throughput else None
        if baseline is not None and throughput:
            speedup = throughput / baseline["samples_per_s"]
            ideal = point["ranks"] / baseline["ranks"]
            row.update(speedup=speedup, ideal_speedup=ideal, efficiency=speedup / ideal)
            row["ideal_samples_per_s"] = baseline["samples_per_s"] * ideal
        else:
            row.update(speedup=None, ideal_speedup=None, efficiency=None)
            row["ideal_samples_per_s"] = (
                baseline["samples_per_s"] * point["ranks"] / baseline["ranks"] if baseline else None
            )
        if compute_per_sample is not None and point.get("non_data_time_s") is not None:
            compute = compute_per_sample * point["per_rank_batch"]
            row["compute_s"] = compute
            row["communication_s"] = max(0.0, point["non_data_time_s"] - compute)
        else:
            row["compute_s"] = None
            row["communication_s"] = None
        rows.append(row)
    return rows, compute_per_sample is not None


# --------------------------------------------------------------------------- comparability

# (label, how to read it from an acceptance manifest)
_COMPARED: list[tuple[str, Any]] = [
    ("software versions", lambda a: a.get("versions")),
    ("communication backend", lambda a: a.get("backend")),
    ("devices", lambda a: sorted({str(r.get("device_name")) for r in a.get("ranks") or []})),
    ("precision", lambda a: a.get("precision")),
    ("dataset", lambda a: a.get("dataset_sha256")),
    ("seed", lambda a: a.get("seed")),
    (
        "trainer config (batch size aside)",
        lambda a: hashlib.sha256(
            json.dumps(
                {k: v for k, v in (a.get("config") or {}).items() if k != "batch_size"},
                sort_keys=True,
            ).encode()
        ).hexdigest()[:12],
    ),
]


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items()) if v is not None)
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def manifest_differences(manifests: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """What differs between the points' acceptance manifests (keyed by ranks), in words."""
    notes = []
    for label, read in _COMPARED:
        by_value: dict[str, list[int]] = {}
        shown: dict[str, str] = {}
        for ranks, manifest in sorted(manifests.items()):
            value = read(manifest)
            if value is None and label == "communication backend":
                # A single-process point has no backend: nothing to compare.
                continue
            key = json.dumps(value, sort_keys=True, default=str)
            by_value.setdefault(key, []).append(ranks)
            shown[key] = _short(value)
        if len(by_value) > 1:
            parts = [
                f"{'/'.join(str(r) for r in ranks)} rank(s): {shown[key]}"
                for key, ranks in by_value.items()
            ]
            notes.append(f"{label} differ between points — " + "; ".join(parts))
    return notes


# --------------------------------------------------------------------------- the report


def _point_status(point: StudyPoint) -> str:
    if point.submit_error:
        return "refused"
    if point.job is None:
        return "waiting"
    return str(point.job.state)


def study_report(*, study: ScalingStudy) -> dict[str, Any]:
    """The study table, chart series, status and notes; computed on read."""
    points = list(study.points.select_related("job").order_by("ranks"))
    entries = []
    manifests: dict[int, Mapping[str, Any]] = {}
    for point in points:
        job = point.job
        results = point.results or point_steady_state(point=point, warmup_steps=study.warmup_steps)
        entry: dict[str, Any] = {
            "ranks": point.ranks,
            "nodes": point.nodes,
            "tasks_per_node": point.tasks_per_node,
            "per_rank_batch": point.per_rank_batch,
            "global_batch": point.global_batch,
            "status": _point_status(point),
            "submit_error": point.submit_error,
            "job_id": str(job.id) if job else None,
            "job_url": reverse("job-detail", args=[job.id]) if job else None,
            "job_name": job.name if job else None,
            "allocated_nodes": job.allocated_nodes if job else "",
            "placement": (point.placement or {}).get("explanation", ""),
            "advised_nodelist": (point.placement or {}).get("nodelist", ""),
            "has_acceptance": bool(job and job.acceptance),
            "acceptance_url": (reverse("job-detail", args=[job.id]) + "#acceptance")
            if job and job.acceptance
            else None,
            "last_step": job.last_step if job else None,
            "total_steps": study.total_steps,
            "time_to_target_s": job.target_reached_elapsed_s if job else None,
            "target_reached_step": job.target_reached_step if job else None,
            **results,
        }
        if job and job.acceptance:
            manifests[point.ranks] = job.acceptance
        entries.append(entry)
    rows, compute_known = scaling_table(entries)
    statuses = [row["status"] for row in rows]
    # A point is settled once its job ended and its run directory was read for the last
    # time: before that its last metric lines may still be on their way.
    active = any(
        (not point.submit_error and (point.job is None or not point.job.is_final))
        or (point.job is not None and not point.job.files_final)
        for point in points
    )
    if active:
        state = "running"
    elif all(s == Job.State.COMPLETED for s in statuses):
        state = "completed"
    else:
        state = "finished with problems"
    differences = manifest_differences(manifests) if len(manifests) > 1 else []
    return {
        "id": study.pk,
        "name": study.name,
        "kind": study.kind,
        "kind_display": study.get_kind_display(),
        "state": state,
        "done": not active,
        "scales": study.scales,
        "batch_size": study.batch_size,
        "warmup_steps": study.warmup_steps,
        "measured_steps": study.measured_steps,
        "target_requested": study.target_requested,
        "rows": rows,
        "compute_estimated": compute_known,
        "compute_method": COMPUTE_METHOD if compute_known else NOT_MEASURABLE,
        "disclaimer": WEAK_DISCLAIMER if study.kind == ScalingStudy.Kind.WEAK else STRONG_NOTE,
        "comparable": not differences,
        "differences": differences,
        "manifests_compared": len(manifests),
    }


CSV_COLUMNS = [
    "ranks",
    "nodes",
    "tasks_per_node",
    "per_rank_batch",
    "global_batch",
    "status",
    "job_id",
    "allocated_nodes",
    "steps_measured",
    "samples_per_s",
    "tokens_per_s",
    "per_rank_samples_per_s",
    "ideal_samples_per_s",
    "speedup",
    "ideal_speedup",
    "efficiency",
    "step_time_s",
    "data_time_s",
    "compute_s",
    "communication_s",
    "time_to_target_s",
]
