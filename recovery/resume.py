"""Resuming on proof: the checkpoint an incident resumes from (the newest proven one; a
newer unproven one drilled first), the nodes it leaves out, the resume itself (exactly
once: the incident is claimed by a conditional update in the same transaction)."""

from __future__ import annotations

import logging
import math
from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet

from core.audit import AuditAction, audit_event_record
from core.errors import ApplicationError
from drills.models import RestoreDrill
from drills.services import restore_drill_start
from jobs import checkpoint_state
from jobs.goodput.ledger import job_gpus
from jobs.lifecycle import job_event
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint
from jobs.recovery_settings import RecoverySettings
from jobs.services import job_resume
from recovery.incidents import incident_move, lineage_jobs, lineage_suspicions
from recovery.models import Incident
from slurm.hostlist import expand, natural_key

logger = logging.getLogger(__name__)


def resume_on_proof(
    incident: Incident, job: Job, settings: RecoverySettings, now: datetime
) -> bool:
    """Resume from the newest proven checkpoint; drill a newer unproven one first."""
    choice = choose_checkpoint(incident, job, now)
    if isinstance(choice, str):
        if choice == _WAITING:
            return False
        return incident_move(incident, Incident.Outcome.NOT_RECOVERED, reason=choice)
    excluded = _exclusions(incident, settings)
    # No-progress hold: two failed attempts in a row from the same step on the same nodes.
    # A preemption is no failed attempt: it is never held for it, nor held against.
    previous = (
        Incident.objects.filter(lineage_root=incident.lineage_root, resumed_job__isnull=False)
        .exclude(pk=incident.pk)
        .exclude(signal=Incident.Signal.PREEMPTED)
        .order_by("-detected_at")
        .first()
    )
    if (
        incident.signal != Incident.Signal.PREEMPTED
        and previous is not None
        and previous.resumed_from_id is not None
        and previous.resumed_from is not None
        and previous.resumed_from.step >= choice.step
        and sorted(previous.excluded_nodes or []) == excluded
    ):
        return incident_move(
            incident,
            Incident.Outcome.HELD,
            reason=f"the last recovery resumed from step {previous.resumed_from.step} and this "
            f"one would resume from step {choice.step} on the same nodes: no progress, so "
            "recovery stops here",
        )
    return _resume(incident, job, choice, excluded, now)


_WAITING = "waiting for a drill"


def choose_checkpoint(incident: Incident, job: Job, now: datetime) -> Checkpoint | str:
    """The checkpoint to resume from, or why there is none yet (``_WAITING``) or at all.

    Candidates: the lineage's checkpoints up to the failed job's newest, still on the
    cluster, whose integrity check did not fail. The newest proven one wins, unless newer
    ones exist: the newest of those is drilled first (on an allocation like the job's),
    and used if it passes; a failed, inconclusive or erroneous drill skips it."""
    _settle_proving_drill(incident)
    lineage = lineage_jobs(incident.lineage_root)
    on_cluster = Checkpoint.objects.filter(job__in=lineage, deleted_at__isnull=True)
    _note_failed_integrity(incident, on_cluster)
    found = checkpoint_state.usable(on_cluster)
    trusted_below = divergence_bound(job, _first_bad_step(incident, job))
    if trusted_below is not None:
        # Saved at or after the last step that showed the weights finite: may hold the NaN.
        found = found.filter(step__lt=trusted_below)
    candidates = list(found.order_by("-step", "-registered_at"))
    skipped = dict(incident.skipped or {})
    proven = next((c for c in candidates if c.last_proven_at is not None), None)
    newer = [
        c
        for c in candidates
        if c.last_proven_at is None
        and str(c.step) not in skipped
        and (proven is None or c.step > proven.step)
    ]
    if newer:
        return _prove_first(incident, newer[0], skipped, now)
    if proven is not None:
        return proven
    if not candidates:
        return "no checkpoint of this run is on the cluster with an intact integrity check"
    verifier = (
        ""
        if incident.cluster.verifier_account
        else (
            "; the cluster has no verifier account, so its drills prove nothing: an operator "
            'sets one (README, "Drills that count as proof")'
        )
    )
    return (
        "no checkpoint of this run is proven to restore (drills: "
        + (", ".join(f"step {step}: {why}" for step, why in skipped.items()) or "none passed")
        + "); recovery never resumes from an unproven checkpoint"
        + verifier
    )


def _first_bad_step(incident: Incident, job: Job) -> int | None:
    """The first logged step whose loss was wrong: not finite, or a spike's first step."""
    steps = [job.nonfinite_loss_step]
    if incident.signal == Incident.Signal.LOSS_SPIKE:
        spike = (incident.evidence or {}).get("spike_step")
        steps.append(spike if isinstance(spike, int) else None)
    known = [step for step in steps if step is not None]
    return min(known) if known else None


def divergence_bound(job: Job, first_bad: int | None) -> int | None:
    """For a job whose loss went wrong at logged step ``first_bad`` (not finite, or a
    spike), the step below which its checkpoints are trusted. The weights saved at step s
    are first used by the forward pass of step s + 1, so only a sound loss logged after s
    shows them sound: the bound is the last step before ``first_bad`` that logged a finite
    loss (or, with none, the step the job resumed from, plus one: the checkpoints it
    started from)."""
    if first_bad is None:
        return None
    losses = (
        MetricPoint.objects.filter(job=job, step__lt=first_bad)
        .order_by("-step")
        .values_list("step", "loss")[:256]
    )
    for step, loss in losses:
        if isinstance(loss, float) and math.isfinite(loss):
            return int(step)
    started = job.resume_from.step if job.resume_from_id and job.resume_from else 0
    return started + 1


def _note_failed_integrity(incident: Incident, on_cluster: QuerySet[Checkpoint]) -> None:
    """Write down, among the skipped, each checkpoint of the lineage whose integrity check
    (or a drill) failed: the incident says why the newest ones were not resumed from."""
    skipped = dict(incident.skipped or {})
    added = False
    for step, detail in on_cluster.filter(integrity=Checkpoint.Integrity.FAILED).values_list(
        "step", "integrity_detail"
    ):
        if str(step) not in skipped:
            skipped[str(step)] = f"integrity check failed: {detail or 'no detail'}"[:300]
            added = True
    if added:
        Incident.objects.filter(pk=incident.pk).update(skipped=skipped)
        incident.skipped = skipped


def _proving_outcome(drill: RestoreDrill) -> str | None:
    """Why a finished proving drill does not prove its checkpoint (None: it does)."""
    drill.checkpoint.refresh_from_db()
    if drill.verdict == RestoreDrill.Verdict.PASSED and drill.checkpoint.last_proven_at:
        return None
    if drill.verdict == RestoreDrill.Verdict.PASSED:
        # Run as the checkpoint's owner (the cluster has no verifier account): the owner
        # attested it, which proves nothing (README, "Drills that count as proof").
        return "passed a self-attested drill, which is not proof (no verifier account)"
    return f"drill {drill.verdict or drill.state}: {drill.reason}"[:300]


def _settle_proving_drill(incident: Incident) -> None:
    """Record the verdict of the incident's proving drill once it finished: a failed drill
    also marks its checkpoint's integrity failed, which takes it out of the candidates,
    so the reason is written down here, before the candidates are read again."""
    if not incident.proving_drill_id:
        return
    drill = (
        RestoreDrill.objects.filter(pk=incident.proving_drill_id)
        .select_related("checkpoint")
        .first()
    )
    if drill is None or drill.is_active:
        return
    why = _proving_outcome(drill)
    skipped = dict(incident.skipped or {})
    if why is not None:
        skipped[str(drill.checkpoint.step)] = why
    Incident.objects.filter(pk=incident.pk).update(skipped=skipped, proving_drill_id=None)
    incident.skipped, incident.proving_drill_id = skipped, None


def _prove_first(
    incident: Incident, checkpoint: Checkpoint, skipped: dict[str, str], now: datetime
) -> Checkpoint | str:
    drill = (
        RestoreDrill.objects.filter(pk=incident.proving_drill_id).first()
        if incident.proving_drill_id
        else None
    )
    if drill is not None and drill.checkpoint_id == checkpoint.pk and drill.is_active:
        return _WAITING
    try:
        drill = restore_drill_start(
            actor=None, checkpoint=checkpoint, trigger=RestoreDrill.Trigger.RECOVERY
        )
    except ApplicationError as refused:
        skipped[str(checkpoint.step)] = f"could not be drilled: {refused}"[:300]
        Incident.objects.filter(pk=incident.pk).update(skipped=skipped)
        incident.skipped = skipped
        return choose_checkpoint(incident, incident.job, now)
    if Incident.objects.filter(pk=incident.pk, outcome=incident.outcome).update(
        outcome=Incident.Outcome.PROVING, proving_drill_id=drill.pk
    ):
        incident.outcome, incident.proving_drill_id = Incident.Outcome.PROVING, drill.pk
    return _WAITING


def _exclusions(incident: Incident, settings: RecoverySettings) -> list[str]:
    """The lineage's suspect nodes not cleared by an operator (sorted), when the policy
    excludes suspects: named by its incidents, or by silent data corruption in drills of
    its checkpoints."""
    if not settings.exclude_suspects:
        return []
    return sorted(
        set(lineage_suspicions(incident.lineage_root).values_list("node__name", flat=True))
    )


def _resume(
    incident: Incident, job: Job, checkpoint: Checkpoint, excluded: list[str], now: datetime
) -> bool:
    lost_steps = max(0, (job.last_step or checkpoint.step) - checkpoint.step)
    since = checkpoint.saved_at or checkpoint.registered_at
    stopped = job.ended_at or incident.stopped_at
    lost_hours = max(0.0, (stopped - since).total_seconds()) / 3600.0 if since else 0.0
    gpus = job_gpus(
        nodes=job.nodes, gpus_per_node=job.gpus_per_node, tasks_per_node=job.tasks_per_node
    )
    with transaction.atomic():
        # Claim the incident first: a second watcher resuming the same incident stops here.
        if not Incident.objects.filter(pk=incident.pk, outcome=incident.outcome).update(
            outcome=Incident.Outcome.RECOVERED
        ):
            return False
        resumed = job_resume(
            actor=job.owner,
            checkpoint=checkpoint,
            name=f"{_base_name(job)} (recovered @{checkpoint.step})",
            overrides={"exclude": _with_job_exclusions(job, excluded)} if excluded else None,
            origin={"by": "recovery", "incident": incident.pk},
        )
        reason = f"resumed from step {checkpoint.step} (proven) as job {resumed.id}" + (
            f", excluding {', '.join(excluded)}" if excluded else ""
        )
        Incident.objects.filter(pk=incident.pk).update(
            resumed_from=checkpoint,
            resumed_job=resumed,
            excluded_nodes=excluded,
            lost_steps=lost_steps,
            lost_gpu_hours=round(lost_hours * gpus, 4),
            resumed_at=now,
            closed_at=now,
            reason=reason,
        )
        audit_event_record(
            actor=None,
            action=AuditAction.RECOVERY_RESUME,
            target=resumed,
            details={"incident": incident.pk, "from_step": checkpoint.step, "excluded": excluded},
        )
        job_event(job, JobEvent.Kind.RECOVERY, message=f"recovery: {reason}"[:4000])
        why_left_out = "; ".join(
            lineage_suspicions(incident.lineage_root)
            .filter(node__name__in=excluded)
            .values_list("evidence", flat=True)
        )
        job_event(
            resumed,
            JobEvent.Kind.RECOVERY,
            message=(
                f"started by recovery after {incident.get_signal_display()} of job {job.id}: "
                f"resumes from step {checkpoint.step}, proven to restore"
                + (f"; leaves out {', '.join(excluded)} ({why_left_out})" if excluded else "")
            )[:4000],
        )
    logger.warning("job %s: %s", job.id, reason)
    return True


def _with_job_exclusions(job: Job, excluded: list[str]) -> str:
    """The suspects added to what the job already left out (its owner's ``--exclude``, or
    an earlier recovery's): a resume never puts a node back that the run kept out of."""
    try:
        kept = expand(job.exclude_nodes) if job.exclude_nodes else []
    except ValueError as error:
        raise ApplicationError(f"the job's --exclude is not a node list: {error}") from None
    return ",".join(sorted(set(kept) | set(excluded), key=natural_key))


def _base_name(job: Job) -> str:
    """The run's name without the suffixes resumes and recoveries add."""
    name = job.name
    for marker in (" (recovered @", " (resumed @"):
        if marker in name:
            name = name.split(marker, 1)[0]
    return name[:120]
