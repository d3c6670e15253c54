"""What a drill compares with, written by Gantry from its own database (never from the
cluster's files): the checkpoint as Gantry registered it (its step and its manifest's
digest), the original run's losses, the state fingerprints at the drilled checkpoint and
at the step the drill replays to, and the dataset definition's hash.

Damage to the cluster's files (the checkpoint *and* metrics.jsonl) cannot make a bad
checkpoint pass: the reference does not come from them. Nor can another complete checkpoint
put in the checkpoint's place: the drill holds the directory to the registered step and
manifest digest first (``not_as_registered``, a failure).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from jobs.ingest import nonfinite_restored
from jobs.models import Checkpoint, MetricPoint, StateFingerprint
from trainer.schema import DRILL_REFERENCE_SCHEMA


def has_fingerprint(checkpoint: Checkpoint) -> bool:
    return StateFingerprint.objects.filter(job_id=checkpoint.job_id, step=checkpoint.step).exists()


def next_checkpoint_step(checkpoint: Checkpoint) -> int | None:
    """The original run's next checkpoint after ``checkpoint`` whose state Gantry holds,
    within the replay bound (``GANTRY_DRILL_MAX_REPLAY_STEPS``); None when there is none
    (the newest checkpoint of a running job, the final one, or a next one too far)."""
    step = (
        StateFingerprint.objects.filter(
            job_id=checkpoint.job_id,
            step__gt=checkpoint.step,
            step__lte=checkpoint.step + settings.DRILL_MAX_REPLAY_STEPS,
        )
        .order_by("step")
        .values_list("step", flat=True)
        .first()
    )
    return int(step) if step is not None else None


def losses_logged(checkpoint: Checkpoint, steps: int) -> int:
    """How many of the steps after ``checkpoint`` (up to ``steps``) the run logged a loss for."""
    return MetricPoint.objects.filter(
        job_id=checkpoint.job_id,
        step__gt=checkpoint.step,
        step__lte=checkpoint.step + steps,
        loss__isnull=False,
    ).count()


def drill_reference(checkpoint: Checkpoint, steps: int) -> dict[str, Any]:
    """The reference of a drill of ``checkpoint`` over ``steps`` steps
    (``gantry-drill-reference/1``, ``trainer/SCHEMA.md``)."""
    job = checkpoint.job
    start, end = checkpoint.step, checkpoint.step + steps
    losses = {
        str(step): float(loss)  # type: ignore[arg-type]  # filtered: not null
        for step, loss in MetricPoint.objects.filter(
            job_id=job.id, step__gt=start, step__lte=end, loss__isnull=False
        )
        .order_by("step")
        .values_list("step", "loss")
    }
    fingerprints = {
        str(step): nonfinite_restored(data)
        for step, data in StateFingerprint.objects.filter(
            job_id=job.id, step__in=[start, end]
        ).values_list("step", "data")
    }
    dataset = (job.acceptance or {}).get("dataset_sha256")
    return {
        "schema": DRILL_REFERENCE_SCHEMA,
        "job": str(job.id),
        "checkpoint_step": start,
        # Null for a checkpoint registered before digests: then only its step is held.
        "manifest_digest": checkpoint.manifest_digest or None,
        "losses": losses,
        "fingerprints": fingerprints,
        "dataset_sha256": dataset if isinstance(dataset, str) else None,
    }


def recorded_trainer_digest(checkpoint: Checkpoint) -> str:
    """The trainer version that wrote ``checkpoint``, as Gantry recorded it when it shipped
    the job (else as the run reported it at start); empty when unknown."""
    job = checkpoint.job
    if job.trainer_digest:
        return str(job.trainer_digest)
    versions = (job.acceptance or {}).get("versions") or {}
    digest = versions.get("trainer_digest")
    return digest if isinstance(digest, str) else ""
