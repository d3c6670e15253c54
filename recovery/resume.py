"""Resuming on proof: the checkpoint an incident resumes from (the newest proven one; a
newer unproven one drilled first), the nodes it leaves out, the resume itself (exactly
once: the incident is claimed by a conditional update in the same transaction)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import QuerySet

from core.audit import AuditAction, audit_event_record
from core.errors import ApplicationError, FieldError
from drills.lifecycle import DRILLS
from drills.models import RestoreDrill
from drills.services import restore_drill_start
from jobs import checkpoint_state
from jobs.goodput.ledger import job_gpus
from jobs.lifecycle import job_event
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint
from jobs.recovery_settings import RecoverySettings
from jobs.services import job_resume
from jobs.validation import node_fits
from nodes.models import Node
from recovery.detect import policy_for
from recovery.evidence import node_is_faulty
from recovery.incidents import incident_move, lineage_jobs, lineage_suspicions
from recovery.models import Incident, RecoveryPolicy
from recovery.steps import deadline_passed, past_deadline, step_begin, step_end
from slurm.hostlist import expand, natural_key

logger = logging.getLogger(__name__)


def resume_on_proof(
    incident: Incident,
    job: Job,
    settings: RecoverySettings,
    now: datetime,
    policy: RecoveryPolicy | None = None,
) -> bool:
    """Resume from the newest proven checkpoint; drill a newer unproven one first (on an
    allocation without the suspects). Held at once when the partition cannot host the
    job's shape without them."""
    policy = policy or policy_for(job.cluster)
    excluded = _exclusions(incident, settings)
    no_room = cannot_host(job, excluded)
    if no_room:
        return incident_move(incident, Incident.Outcome.HELD, reason=no_room)
    choice = choose_checkpoint(incident, job, now, policy=policy, excluded=excluded)
    if isinstance(choice, str):
        if choice == _WAITING:
            return False
        return incident_move(incident, Incident.Outcome.NOT_RECOVERED, reason=choice)
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


def cannot_host(job: Job, excluded: list[str]) -> str:
    """Why the job's partition cannot host its shape without the ``excluded`` nodes now
    (nodes that fit its GPUs, CPUs and memory per node, not down, drained or failing), or
    "": neither a proving drill nor the resume could run there."""
    if not excluded:
        return ""
    nodes = (
        Node.objects.filter(cluster=job.cluster, partitions_text__contains=f",{job.partition},")
        .exclude(state=Node.State.GONE)
        .prefetch_related("gpus")
    )
    fit = [
        node
        for node in nodes
        if node.name not in excluded
        and node_fits(job, node)
        and not node_is_faulty(
            state=node.state, flags={str(flag).lower() for flag in node.state_flags or []}
        )
    ]
    if len(fit) >= job.nodes:
        return ""
    return (
        f"partition {job.partition} has {len(fit)} node(s) that fit the job's shape "
        f"({job.gpus_per_node} GPU(s), {job.tasks_per_node} × {job.cpus_per_task} CPUs per "
        f"node) without the suspects {', '.join(excluded)} and nodes down or drained; it needs "
        f"{job.nodes}: held at once (an operator clears a suspect or returns a node, or the "
        "owner resumes on another partition)"
    )


def choose_checkpoint(
    incident: Incident,
    job: Job,
    now: datetime,
    *,
    policy: RecoveryPolicy | None = None,
    excluded: list[str] | None = None,
) -> Checkpoint | str:
    """The checkpoint to resume from, or why there is none yet (``_WAITING``) or at all.

    Candidates: the lineage's checkpoints up to the failed job's newest, still on the
    cluster, whose integrity check did not fail. The newest proven one wins, unless newer
    ones exist: the newest of those is drilled first (on an allocation like the job's,
    without ``excluded``), and used if it passes; a failed, inconclusive or erroneous
    drill, or one that misses its deadline, skips it. The failed run's newest checkpoint,
    when the run logged too few steps after it to replay, is drilled at the level
    state-exact, no replay, which is enough where the policy says so
    (``RecoveryPolicy.state_exact_resume``)."""
    policy = policy or policy_for(job.cluster)
    excluded = excluded or []
    _settle_proving_drill(incident, now)
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
    # The failed run's newest checkpoint on the cluster (usable or not): the one a crash
    # right after a save leaves with nothing logged after it.
    newest_of_run = on_cluster.filter(job=job).order_by("-step").first()
    state_exact_ok = policy.state_exact_resume and newest_of_run is not None

    def enough(c: Checkpoint) -> bool:
        if c.last_proven_at is not None:
            return True
        return state_exact_ok and c.state_proven_at is not None and c == newest_of_run

    proven = next((c for c in candidates if enough(c)), None)
    newer = [
        c
        for c in candidates
        if not enough(c) and str(c.step) not in skipped and (proven is None or c.step > proven.step)
    ]
    if newer:
        prove = _Proving(
            policy=policy,
            excluded=excluded,
            state_exact=state_exact_ok and newer[0] == newest_of_run,
        )
        return _prove_first(incident, newer[0], skipped, now, prove)
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
    if (
        drill.verdict == RestoreDrill.Verdict.PASSED
        and drill.level == RestoreDrill.Level.STATE_EXACT
        and drill.checkpoint.state_proven_at
    ):
        return None
    if drill.verdict == RestoreDrill.Verdict.PASSED:
        # Run as the checkpoint's owner (the cluster has no verifier account): the owner
        # attested it, which proves nothing (README, "Drills that count as proof").
        return "passed a self-attested drill, which is not proof (no verifier account)"
    return f"drill {drill.verdict or drill.state}: {drill.reason}"[:300]


def _settle_proving_drill(incident: Incident, now: datetime) -> None:
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
    step_end(
        incident,
        _prove_step(drill.checkpoint),
        now=now,
        outcome=why or f"proven ({drill.get_level_display()}) by drill {drill.pk}",
    )
    Incident.objects.filter(pk=incident.pk).update(skipped=skipped, proving_drill_id=None)
    incident.skipped, incident.proving_drill_id = skipped, None


@dataclass(frozen=True)
class _Proving:
    """How a proving drill is started: the policy (its deadline), the nodes it leaves out,
    and whether the level state-exact, no replay may prove the checkpoint."""

    policy: RecoveryPolicy
    excluded: list[str]
    state_exact: bool


def _prove_step(checkpoint: Checkpoint) -> str:
    return f"prove step {checkpoint.step}"


def _skip(incident: Incident, skipped: dict[str, str], step: int, why: str) -> None:
    skipped[str(step)] = why[:300]
    Incident.objects.filter(pk=incident.pk).update(skipped=skipped, proving_drill_id=None)
    incident.skipped, incident.proving_drill_id = skipped, None


def _late(incident: Incident, drill: RestoreDrill, now: datetime, prove: _Proving) -> str:
    """Why the proving drill ran out of time ("" while it has some): not running by the
    start deadline, or running past its own time limit (plus two minutes for Slurm)."""
    name = _prove_step(drill.checkpoint)
    if drill.state != RestoreDrill.State.RUNNING and past_deadline(incident, name, now):
        return (
            f"the proving drill did not start within "
            f"{prove.policy.proving_start_deadline_seconds} s (it was {drill.state}); cancelled"
        )
    started = drill.started_at
    if started is not None and now > started + timedelta(
        minutes=drill.time_limit_minutes, seconds=120
    ):
        return (
            f"the proving drill ran past its time limit of {drill.time_limit_minutes} min; "
            "cancelled"
        )
    return ""


def _start_drill(checkpoint: Checkpoint, prove: _Proving) -> RestoreDrill:
    """A proving drill of ``checkpoint`` without the suspects: a full one, or, where the
    run logged too few steps after it to replay and the policy allows, state-exact."""
    exclude = ",".join(prove.excluded)
    try:
        return restore_drill_start(
            actor=None,
            checkpoint=checkpoint,
            trigger=RestoreDrill.Trigger.RECOVERY,
            exclude=exclude,
        )
    except FieldError as refused:
        if refused.field != "steps" or not prove.state_exact:
            raise
    return restore_drill_start(
        actor=None,
        checkpoint=checkpoint,
        trigger=RestoreDrill.Trigger.RECOVERY,
        level=RestoreDrill.Level.STATE_EXACT,
        exclude=exclude,
    )


def _prove_first(
    incident: Incident,
    checkpoint: Checkpoint,
    skipped: dict[str, str],
    now: datetime,
    prove: _Proving,
) -> Checkpoint | str:
    drill = (
        RestoreDrill.objects.filter(pk=incident.proving_drill_id)
        .select_related("checkpoint")
        .first()
        if incident.proving_drill_id
        else None
    )
    if drill is not None and drill.checkpoint_id == checkpoint.pk and drill.is_active:
        late = _late(incident, drill, now, prove)
        if not late:
            return _WAITING
        try:
            DRILLS.cancel(drill, by="recovery", audit=lambda _drill: None)
        except ApplicationError as error:
            # Its verdict no longer counts either way; the incident moves on.
            late = f"{late} (the cancel was refused: {error})"
        deadline_passed(incident, _prove_step(checkpoint), now=now, outcome=late)
        _skip(incident, skipped, checkpoint.step, late)
        return choose_checkpoint(
            incident, incident.job, now, policy=prove.policy, excluded=prove.excluded
        )
    try:
        drill = _start_drill(checkpoint, prove)
    except ApplicationError as refused:
        _skip(incident, skipped, checkpoint.step, f"could not be drilled: {refused}")
        return choose_checkpoint(
            incident, incident.job, now, policy=prove.policy, excluded=prove.excluded
        )
    if Incident.objects.filter(pk=incident.pk, outcome=incident.outcome).update(
        outcome=Incident.Outcome.PROVING, proving_drill_id=drill.pk
    ):
        incident.outcome, incident.proving_drill_id = Incident.Outcome.PROVING, drill.pk
        step_begin(
            incident,
            _prove_step(checkpoint),
            now=now,
            seconds=prove.policy.proving_start_deadline_seconds,
            detail=f"drill {drill.pk} ({drill.get_level_display()}, {drill.steps} step(s))"
            + (f", leaving out {', '.join(prove.excluded)}" if prove.excluded else ""),
        )
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
    level = "replay" if checkpoint.last_proven_at is not None else "state_exact"
    proof = "proven" if level == "replay" else "proven: state-exact, no replay"
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
        reason = f"resumed from step {checkpoint.step} ({proof}) as job {resumed.id}" + (
            f", excluding {', '.join(excluded)}" if excluded else ""
        )
        Incident.objects.filter(pk=incident.pk).update(
            resumed_from=checkpoint,
            resumed_proof=level,
            resumed_job=resumed,
            excluded_nodes=excluded,
            lost_steps=lost_steps,
            lost_gpu_hours=round(lost_hours * gpus, 4),
            resumed_at=now,
            closed_at=now,
            reason=reason,
        )
        step_begin(incident, "resume", now=now, seconds=None)
        step_end(incident, "resume", now=now, outcome=f"job {resumed.id} submitted ({proof})")
        audit_event_record(
            actor=None,
            action=AuditAction.RECOVERY_RESUME,
            target=resumed,
            details={
                "incident": incident.pk,
                "from_step": checkpoint.step,
                "proof": level,
                "excluded": excluded,
            },
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
                f"resumes from step {checkpoint.step}, "
                + (
                    "proven to restore"
                    if level == "replay"
                    else "proven state-exact, no replay (its files and loaded state bit for bit; "
                    "the run logged too few steps after it to replay)"
                )
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
