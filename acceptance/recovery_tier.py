"""The recovery tier: a real training job on the set, one rank killed mid-run, Gantry's own
automatic recovery (``recovery``) left to do its work, then a restore drill of what the
recovered run wrote; it measures whether the run recovered, the time to recover and the
work lost.

The job goes through the jobs app like any other (``jobs.services.job_submit``): owned by
the operator who started the acceptance run and run as that operator's account on the
cluster (``nodes.access.identities.cluster_account_for``, the same path as every job they submit),
so its run directory, its checkpoints, the resume recovery makes of it (which runs as the
checkpoint's account) and the audit trail are those of a person who asked for it. Not the
service account: a job owned by one person and run as another account would break the
resume, which runs as its owner's account.

The job: every node of the set (``--nodelist``, and the partition's other nodes left out
with ``--exclude``, which a resume keeps, so the recovered run stays on the set), one rank
per GPU (one per node without GPUs), the ``tiny`` model in fp32 with deterministic kernels,
a synchronous checkpoint every ``CHECKPOINT_EVERY`` steps, every step logged (a drill
compares losses step by step), the trainer fault ``TRAINER_FAULT=exit_rank@FAULT_STEP``:
the last rank exits with 42 right after that step's update, only in a run that did not
resume, so the recovered run goes on past it. Recovery settings for this job: on, at most
one attempt, suspects not left out (the rank died of Gantry's own fault, which is no
evidence against its node; the suspicion it records is cleared when the tier ends).

Each watcher cycle the tier looks at what happened (it never waits): the job's incident
(``recovery.models.Incident``), its outcome, the resumed job's first logged step, and then
asks the drills service for a drill of the first checkpoint the resumed job wrote after the
one it resumed from. Recovery's own proving drill (of the checkpoint it resumed from, before
the resume) is recorded too, but it is not this drill: it ran before the resume and says
nothing of what the recovered run wrote.

Criteria: recovered (passed, or failed with recovery's reason when held or not
recovered); the time to recover (the incident's detection, on Gantry's clock, to the
resumed job's first logged step, on the node's clock) and the steps lost (the failed job's
last logged step to the checkpoint resumed from; the GPU-hours recovery counted are shown
with it) against the run's options ``recovery_max_seconds`` and
``recovery_max_lost_steps`` (inconclusive without them); the drill's verdict (a pass counts
only when the drill ran as the cluster's verifier). ``recovery_minutes`` bounds the tier
(the job's time limit too): past it, inconclusive. When the tier ends, and when the run is
cancelled, what is left of the lineage is cancelled, an open incident is held and the
tier's drill cancelled.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction

from acceptance.models import AcceptanceRun, RecoveryTrial
from acceptance.results import tier_verdict
from acceptance.thresholds import FAILED, INCONCLUSIVE, PASSED
from core.audit import AuditAction, audit_event_record
from core.errors import ApplicationError
from core.types import User
from drills.lifecycle import DRILLS
from drills.models import RestoreDrill
from drills.services import restore_drill_start
from jobs.lifecycle import JOBS
from jobs.models import Checkpoint, Job, MetricPoint
from jobs.services import job_submit
from jobs.validation import JobRequest
from nodes.models import Node
from recovery.incidents import incident_move, lineage_jobs
from recovery.models import Incident, SuspectNode
from slurm.hostlist import compress
from trainer.schema import EXIT_RANK_FAULT

logger = logging.getLogger(__name__)

FAULT_STEP = 50
CHECKPOINT_EVERY = 20
# The recovered run ends by itself a few checkpoints after the fault.
TOTAL_STEPS = 120
DEFAULT_MINUTES = 30
# After the job failed, how long recovery has to open its incident.
DETECT_WAIT = timedelta(minutes=10)
JOB_SETTINGS = {"enabled": True, "exclude_suspects": False, "max_attempts": 1}
EXCLUDE_MAX = 1024
TRAINER_CONFIG: dict[str, Any] = {
    "preset": "tiny",
    "steps": TOTAL_STEPS,
    "checkpoint_every": CHECKPOINT_EVERY,
    # Every checkpoint stays: the drilled one must not be removed by retention.
    "checkpoint_keep": TOTAL_STEPS // CHECKPOINT_EVERY + 1,
    # Synchronous: the save of a step is complete before the next one starts.
    "checkpoint_async": False,
    "log_every": 1,
    "deterministic": True,
    "seed": 0,
    "precision": "fp32",
    "strategy": "ddp",
    "device": "auto",
    "data": {"kind": "markov", "order": 2, "seed": 1234, "branching": 4},
}


@dataclass
class RecoveryDone:
    verdict: str
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)


def _fault() -> str:
    return f"exit_rank@{FAULT_STEP}"


def _minutes(run: AcceptanceRun) -> int:
    return int((run.options or {}).get("recovery_minutes", DEFAULT_MINUTES))


def _job_request(run: AcceptanceRun, gpus: int) -> JobRequest | str:
    others = (
        Node.objects.filter(cluster=run.cluster, partitions_text__contains=f",{run.partition},")
        .exclude(state=Node.State.GONE)
        .exclude(name__in=run.nodes)
        .values_list("name", flat=True)
    )
    exclude = compress(list(others))
    if len(exclude) > EXCLUDE_MAX:
        return (
            f"the partition's nodes outside the set do not fit one --exclude ({len(exclude)} "
            "characters), so a resume could not be kept on the set"
        )
    return JobRequest(
        cluster=run.cluster,
        name=f"acceptance {str(run.id)[:8]} recovery",
        config=dict(TRAINER_CONFIG),
        partition=run.partition,
        nodes=len(run.nodes),
        gpus_per_node=gpus,
        gpu_type="",
        tasks_per_node=max(1, gpus),
        cpus_per_task=1,
        memory_mb=None,
        time_limit_minutes=_minutes(run),
        nodelist=compress(run.nodes),
        switches="",
        environment={"TRAINER_FAULT": _fault()},
        exclude=exclude,
        recovery=dict(JOB_SETTINGS),
    )


def _start(run: AcceptanceRun, gpus: int, now: datetime) -> RecoveryDone | int:
    """Submit the tier's job (once: the trial row is made in the same transaction)."""
    owner = run.requested_by
    if owner is None:
        return RecoveryDone(INCONCLUSIVE, "the operator who started the run is gone: no owner")
    if not run.cluster.verifier_account:
        return RecoveryDone(
            INCONCLUSIVE,
            f"{run.cluster.name} has no verifier account, so no drill proves a checkpoint and "
            "recovery never resumes: nothing of the set was measured",
        )
    request = _job_request(run, gpus)
    if isinstance(request, str):
        return RecoveryDone(INCONCLUSIVE, request)
    try:
        with transaction.atomic():
            job = job_submit(
                user=owner,
                request=request,
                origin={"by": "acceptance", "acceptance_run": str(run.id)},
            )
            RecoveryTrial.objects.create(
                run=run,
                job=job,
                fault=_fault(),
                fault_step=FAULT_STEP,
                created_at=now,
                stage=f"the training job to reach step {FAULT_STEP}, where a rank is killed",
            )
    except (ApplicationError, PermissionDenied) as refused:
        return RecoveryDone(INCONCLUSIVE, f"the training job could not be submitted: {refused}")
    return 1


def recovery_advance(run: AcceptanceRun, gpus: int, now: datetime) -> RecoveryDone | int:
    """The tier's next move: its outcome once known (the lineage is then cleaned up), 1
    when the job was just submitted, 0 while it waits."""
    trial = RecoveryTrial.objects.filter(run=run).select_related("job", "drill").first()
    if trial is None:
        return _start(run, gpus, now)
    found = _judge(trial, run, now)
    if isinstance(found, str) and now >= trial.created_at + timedelta(minutes=_minutes(run)):
        found = RecoveryDone(
            INCONCLUSIVE,
            f"timed out after {_minutes(run)} minutes waiting for {found}",
            _figures(trial),
        )
    if isinstance(found, RecoveryDone):
        found.extra.setdefault("job", str(trial.job_id) if trial.job_id else None)
        found.extra["fault"] = trial.fault
        problems = recovery_cleanup(run=run, actor=None, now=now)
        if problems:
            found.extra["cleanup_problems"] = problems
        return found
    if trial.stage != found:
        RecoveryTrial.objects.filter(pk=trial.pk).update(stage=found[:200])
    return 0


def _no_incident(job: Job, now: datetime) -> RecoveryDone | str:
    if not job.is_final:
        return f"the training job to reach step {FAULT_STEP}, where a rank is killed"
    if not job.slurm_job_id:
        return RecoveryDone(
            INCONCLUSIVE, f"the training job never ran: {job.state} {job.state_reason}".strip()
        )
    if job.state == Job.State.COMPLETED:
        return RecoveryDone(
            INCONCLUSIVE,
            f"the training job completed: the rank fault at step {FAULT_STEP} "
            "never fired, so there was nothing to recover",
        )
    if job.state == Job.State.CANCELLED:
        return RecoveryDone(INCONCLUSIVE, "the training job was cancelled before it crashed")
    ended = job.ended_at or now
    if now - ended > DETECT_WAIT:
        return RecoveryDone(
            FAILED,
            f"the training job ended {job.state} (exit code {job.exit_code}) and recovery "
            f"opened no incident within {DETECT_WAIT.total_seconds() / 60:.0f} minutes",
        )
    return "recovery to notice the crash"


def _judge(trial: RecoveryTrial, run: AcceptanceRun, now: datetime) -> RecoveryDone | str:
    """The tier's outcome, or what it waits for."""
    job = Job.objects.filter(id=trial.job_id).first() if trial.job_id else None
    if job is None:
        return RecoveryDone(INCONCLUSIVE, "the tier's training job was deleted")
    incident = Incident.objects.filter(job=job).select_related("resumed_job").first()
    if incident is None:
        return _no_incident(job, now)
    if incident.is_active:
        return f"recovery to settle its incident ({incident.get_outcome_display()})"
    figures = _figures(trial, incident)
    if incident.outcome != Incident.Outcome.RECOVERED:
        criteria = [_criterion("recovered", False, None, FAILED, incident.reason)]
        return RecoveryDone(
            FAILED,
            f"not recovered ({incident.get_outcome_display()}): {incident.reason}",
            {**figures, "criteria": criteria},
        )
    resumed = incident.resumed_job
    if resumed is None:
        return RecoveryDone(FAILED, "recovery says it resumed, but no resumed job is recorded")
    first = (
        MetricPoint.objects.filter(job=resumed).order_by("step").values_list("wall_time").first()
    )
    if first is None:
        if resumed.is_final:
            return RecoveryDone(
                FAILED,
                f"the resumed job ended {resumed.state} before its first step "
                f"({resumed.state_reason or 'no reason given'})",
                figures,
            )
        return "the resumed job's first step"
    drill = RestoreDrill.objects.filter(pk=trial.drill_id).first() if trial.drill_id else None
    if drill is None:
        return _drill_start(trial, run, incident, resumed, figures)
    if drill.is_active:
        return f"the verdict of the restore drill of step {drill.checkpoint.step}"
    return _verdict(run, incident, first[0], drill, figures)


def _drill_start(
    trial: RecoveryTrial,
    run: AcceptanceRun,
    incident: Incident,
    resumed: Job,
    figures: dict[str, Any],
) -> RecoveryDone | str:
    """Ask for a drill of the resumed job's first checkpoint after the one it resumed from,
    once the job has written the checkpoint after it (the drill replays to it and compares
    the state there too) or has ended."""
    above = incident.resumed_from.step if incident.resumed_from else 0
    checkpoints = list(
        Checkpoint.objects.filter(job=resumed, step__gt=above, deleted_at__isnull=True)
        .order_by("step")
        .only("id", "step", "job_id")[:2]
    )
    resumed.refresh_from_db()
    if not checkpoints or (len(checkpoints) < 2 and not resumed.is_final):
        if resumed.is_final and not checkpoints:
            return RecoveryDone(
                INCONCLUSIVE,
                f"the resumed job ended {resumed.state} without a checkpoint to drill",
                figures,
            )
        return "a checkpoint of the resumed job to drill"
    checkpoint = Checkpoint.objects.select_related("job", "job__cluster").get(pk=checkpoints[0].pk)
    try:
        drill = restore_drill_start(actor=run.requested_by, checkpoint=checkpoint)
    except (ApplicationError, PermissionDenied) as refused:
        why = f"{getattr(refused, 'message', None) or refused}"[:2000]
        RecoveryTrial.objects.filter(pk=trial.pk).update(drill_refused=why)
        if resumed.is_final:
            return RecoveryDone(
                INCONCLUSIVE, f"the drill of step {checkpoint.step} was refused: {why}", figures
            )
        return f"a drill of step {checkpoint.step} the drills service accepts ({why})"
    RecoveryTrial.objects.filter(pk=trial.pk).update(drill=drill, drill_refused="")
    return f"the verdict of the restore drill of step {checkpoint.step}"


def _criterion(
    name: str, measured: Any, threshold: Any, verdict: str, detail: str, **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "measured": measured,
        "threshold": threshold,
        "verdict": verdict,
        "detail": detail,
        **extra,
    }


def _at_most(name: str, measured: float | None, limit: Any, what: str, **extra: Any) -> dict:
    if measured is None:
        return _criterion(name, None, limit, INCONCLUSIVE, f"{what}: not measured", **extra)
    if limit is None:
        why = f"{what}: no threshold in the run's options"
        return _criterion(name, measured, None, INCONCLUSIVE, why, **extra)
    verdict = PASSED if measured <= limit else FAILED
    return _criterion(
        name, measured, limit, verdict, f"{what}: {measured:g} (at most {limit})", **extra
    )


def _drill_criterion(drill: RestoreDrill) -> dict[str, Any]:
    step = drill.checkpoint.step
    what = f"drill of step {step} of the resumed run ({drill.get_verdict_display() or drill.state})"
    if drill.verdict == RestoreDrill.Verdict.PASSED and drill.is_attested:
        verdict = PASSED
    elif drill.verdict == RestoreDrill.Verdict.PASSED:
        verdict, what = INCONCLUSIVE, f"{what}: self-attested, which is not proof"
    elif drill.verdict == RestoreDrill.Verdict.FAILED:
        verdict, what = FAILED, f"{what}: {drill.reason}"
    else:
        verdict, what = INCONCLUSIVE, f"{what}: {drill.reason or 'no verdict'}"
    return _criterion(
        "restore_drill",
        drill.verdict or drill.state,
        None,
        verdict,
        what[:1000],
        drill=str(drill.id),
    )


def _verdict(
    run: AcceptanceRun,
    incident: Incident,
    first_step_at: datetime,
    drill: RestoreDrill,
    figures: dict[str, Any],
) -> RecoveryDone:
    options = run.options or {}
    to_recover = max(0.0, (first_step_at - incident.detected_at).total_seconds())
    criteria = [
        _criterion("recovered", True, None, PASSED, incident.reason),
        _at_most(
            "time_to_recover_s",
            round(to_recover, 3),
            options.get("recovery_max_seconds"),
            "seconds from the incident's detection to the resumed job's first step",
        ),
        _at_most(
            "lost_steps",
            incident.lost_steps,
            options.get("recovery_max_lost_steps"),
            "steps lost (the failed job's last logged step to the checkpoint resumed from)",
            lost_gpu_hours=incident.lost_gpu_hours,
        ),
        _drill_criterion(drill),
    ]
    verdict = tier_verdict([c["verdict"] for c in criteria])
    reason = (
        f"recovered from step {figures.get('resumed_from_step')}: {to_recover:.0f} s from "
        f"detection to the resumed job's first step, {incident.lost_steps} steps "
        f"({incident.lost_gpu_hours} GPU-hours) lost; {criteria[-1]['detail']}"
    )
    unjudged = [c["name"] for c in criteria if c["verdict"] == INCONCLUSIVE]
    if unjudged:
        reason += f"; not judged: {', '.join(unjudged)}"
    return RecoveryDone(
        verdict,
        reason[:4000],
        {**figures, "criteria": criteria, "time_to_recover_s": round(to_recover, 3)},
    )


def _figures(trial: RecoveryTrial, incident: Incident | None = None) -> dict[str, Any]:
    if incident is None:
        incident = Incident.objects.filter(job_id=trial.job_id).first() if trial.job_id else None
    if incident is None:
        return {}
    proving = (
        RestoreDrill.objects.filter(
            checkpoint_id=incident.resumed_from_id, trigger=RestoreDrill.Trigger.RECOVERY
        )
        .order_by("-created_at")
        .first()
        if incident.resumed_from_id
        else None
    )
    return {
        "incident": incident.pk,
        "signal": incident.signal,
        "outcome": incident.outcome,
        "time_to_detect_s": round(incident.time_to_detect_s, 3),
        "resumed_job": str(incident.resumed_job_id) if incident.resumed_job_id else None,
        "resumed_from_step": incident.resumed_from.step if incident.resumed_from else None,
        "lost_steps": incident.lost_steps,
        "lost_gpu_hours": incident.lost_gpu_hours,
        "proving_drill": {"id": str(proving.id), "verdict": proving.verdict} if proving else None,
    }


def recovery_cleanup(*, run: AcceptanceRun, actor: User | None, now: datetime) -> list[str]:
    """End what is left of the tier (once): an open incident held, the tier's drill and
    every unfinished job of the lineage cancelled, the suspicion the injected fault put on
    a node cleared. Returns what could not be done now (each job also has the tier's time
    limit, so Slurm ends one that cannot be reached)."""
    trial = RecoveryTrial.objects.filter(run=run, cleaned_up_at__isnull=True).first()
    if trial is None:
        return []
    if not RecoveryTrial.objects.filter(pk=trial.pk, cleaned_up_at__isnull=True).update(
        cleaned_up_at=now
    ):
        return []
    by = actor.get_username() if actor is not None else "acceptance"
    problems: list[str] = []
    root = Job.objects.filter(id=trial.job_id).first() if trial.job_id else None
    if root is not None:
        for incident in Incident.objects.filter(
            lineage_root=root, outcome__in=list(Incident.ACTIVE_OUTCOMES)
        ).select_related("job"):
            incident_move(
                incident,
                Incident.Outcome.HELD,
                reason=f"acceptance run {str(run.id)[:8]} ended its recovery tier",
            )
    drill = RestoreDrill.objects.filter(pk=trial.drill_id).first() if trial.drill_id else None
    if drill is not None and drill.is_active:
        problems += _cancel(
            DRILLS, drill, by, lambda d: _audit(actor, AuditAction.DRILL_CANCEL, d, run)
        )
    if root is not None:
        for job in lineage_jobs(root):
            if not job.is_final:
                problems += _cancel(
                    JOBS, job, by, lambda j: _audit(actor, AuditAction.JOB_CANCEL, j, run)
                )
        _clear_injected_suspicions(root, run, now)
    if problems:
        RecoveryTrial.objects.filter(pk=trial.pk).update(cleanup_problems="; ".join(problems))
    return problems


def _cancel(lifecycle: Any, obj: Any, by: str, audit: Any) -> list[str]:
    try:
        lifecycle.cancel(obj, by=by, audit=audit)
    except Exception as error:  # best effort; the time limit ends it otherwise
        logger.warning("acceptance recovery tier: cancelling %s failed: %s", obj, error)
        return [f"{obj}: {getattr(error, 'message', None) or error}"[:300]]
    return []


def _audit(actor: User | None, action: str, target: Any, run: AcceptanceRun) -> None:
    audit_event_record(
        actor=actor, action=action, target=target, details={"acceptance_run": str(run.id)}
    )


def _clear_injected_suspicions(root: Job, run: AcceptanceRun, now: datetime) -> None:
    """The node named by the injected crash (srun reported the rank Gantry's fault ended)
    is not suspect: clear that suspicion, audited."""
    marker = f"exit code {EXIT_RANK_FAULT}"
    for suspicion in SuspectNode.objects.filter(
        incident__job=root,
        incident__signal=Incident.Signal.CRASH,
        cleared_at__isnull=True,
        evidence__contains=marker,
    ).select_related("node"):
        with transaction.atomic():
            if not SuspectNode.objects.filter(pk=suspicion.pk, cleared_at__isnull=True).update(
                cleared_at=now
            ):
                continue
            audit_event_record(
                actor=None,
                action=AuditAction.SUSPECT_NODE_CLEAR,
                target=suspicion.node,
                details={
                    "node": suspicion.node.name,
                    "cleared": 1,
                    "why": f"acceptance run {run.id} killed the rank itself "
                    f"(TRAINER_FAULT={_fault()}): no evidence against the node",
                },
            )
