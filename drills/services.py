"""Writes for restore drills: start, the submit task's work, cancel; integrity checks.

A drill is a Slurm job running ``python -m trainer drill`` against the original run; it
goes through the same lifecycle as jobs (``runs.lifecycle``), with the drill-specific
part in ``drills.lifecycle``. Scheduled drills are in ``drills.policies``.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.tasknames import CHECKPOINT_VERIFY, task_send
from core.access import require_can_act
from core.audit import AuditAction, audit_event_record
from core.errors import ConflictError, FieldError
from core.roles import is_operator
from core.types import Actor, User
from drills.attestation import drill_attestation, integrity_checker
from drills.budgets import counts_against_owner, drill_budget_reserve, drill_partition_check
from drills.lifecycle import DRILLS
from drills.models import RestoreDrill
from drills.reference import has_fingerprint, losses_logged, next_checkpoint_step
from drills.verdicts import registration_mismatch
from jobs import checkpoint_state
from jobs.models import Checkpoint, Job, MetricPoint, StateFingerprint
from jobs.validation import JobRequest, job_request_validate
from nodes.access.cluster import transport_for
from runs.runtime import trainer_ensure_uploaded
from trainer.schema import Reason

ALLOCATION_KEYS = (
    "partition",
    "nodes",
    "tasks_per_node",
    "gpus_per_node",
    "gpu_type",
    "cpus_per_task",
)
# The longest a drill's Slurm job may run (it loads a checkpoint and replays a few steps).
DRILL_MAX_MINUTES = 30


def allocation_for(job: Job, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The drill's allocation: the original job's shape unless overridden."""
    allocation = {key: getattr(job, key) for key in ALLOCATION_KEYS}
    for key, value in (overrides or {}).items():
        if key in allocation and value not in (None, ""):
            allocation[key] = value
    return allocation


def drill_time_limit(job: Job) -> int:
    """A drill's time limit in minutes: the job's, at most ``DRILL_MAX_MINUTES``."""
    return min(job.time_limit_minutes, DRILL_MAX_MINUTES)


def allocation_gpus(allocation: dict[str, Any]) -> int:
    """GPUs of an allocation, all nodes together."""
    return int(allocation["nodes"]) * int(allocation["gpus_per_node"] or 0)


def allocation_key(allocation: dict[str, Any]) -> str:
    exclude = allocation.get("exclude") or ""
    return (
        f"{allocation['partition']}:{allocation['nodes']}x{allocation['tasks_per_node']}"
        f":gpu{allocation['gpus_per_node']}{allocation['gpu_type'] or ''}"
        f":cpu{allocation['cpus_per_task']}"
    ) + (f":x{exclude}" if exclude else "")


def _check_allocation(job: Job, allocation: dict[str, Any]) -> None:
    """The cluster must be able to give the allocation: the same checks as a job's."""
    request = JobRequest(
        cluster=job.cluster,
        name=f"drill of {job.name}",
        config=job.config,
        partition=str(allocation["partition"]),
        nodes=int(allocation["nodes"]),
        gpus_per_node=int(allocation["gpus_per_node"]),
        gpu_type=str(allocation["gpu_type"] or ""),
        tasks_per_node=int(allocation["tasks_per_node"]),
        cpus_per_task=int(allocation["cpus_per_task"]),
        memory_mb=job.memory_mb,
        time_limit_minutes=drill_time_limit(job),
        nodelist="",
        switches="",
        exclude=str(allocation.get("exclude") or ""),
    )
    try:
        job_request_validate(request)
    except FieldError as error:
        raise FieldError(f"allocation.{error.field}", error.why) from None


def _check_reference(checkpoint: Checkpoint, steps: int) -> None:
    """The original run must have logged the steps a drill compares with."""
    logged_after = losses_logged(checkpoint, steps)
    if logged_after < steps:
        raise FieldError(
            "steps",
            f"the original run logged {logged_after} step(s) after step {checkpoint.step}; "
            f"a drill compares against them, so at most {logged_after} can be checked",
        )


def consecutive_losses_logged(checkpoint: Checkpoint, most: int) -> int:
    """How many steps right after ``checkpoint`` (up to ``most``) the run logged a loss for,
    without a gap: what a drill at the level state-exact can still replay and compare."""
    logged = set(
        MetricPoint.objects.filter(
            job_id=checkpoint.job_id,
            step__gt=checkpoint.step,
            step__lte=checkpoint.step + most,
            loss__isnull=False,
        ).values_list("step", flat=True)
    )
    count = 0
    while checkpoint.step + count + 1 in logged:
        count += 1
    return count


def drill_plan(checkpoint: Checkpoint, steps: int | None, fallback: int) -> tuple[int, int | None]:
    """How far a drill replays: (steps, the step whose state it compares at the end).

    Without ``steps``: to the original run's next checkpoint (bounded by
    ``GANTRY_DRILL_MAX_REPLAY_STEPS``), comparing its state; without one, ``fallback``
    steps compared by loss. With ``steps``: that many, and the state at the end too when
    a checkpoint of the run is exactly there."""
    start = checkpoint.step
    if steps is None:
        target = next_checkpoint_step(checkpoint)
        if target is not None and losses_logged(checkpoint, target - start) == target - start:
            return target - start, target
        steps = fallback
    end = start + steps
    held = StateFingerprint.objects.filter(job_id=checkpoint.job_id, step=end).exists()
    return steps, end if held else None


def _check_drillable(checkpoint: Checkpoint, *, steps: int | None, trainer: str) -> None:
    """Refuse a checkpoint that is gone or that Gantry could not judge, and bad arguments."""
    job = checkpoint.job
    if checkpoint.deleted_at is not None:
        raise FieldError(
            "checkpoint",
            f"step {checkpoint.step} was removed from the cluster by the trainer's retention "
            f"(checkpoint_keep={job.config.get('checkpoint_keep')}); nothing left to drill",
        )
    if trainer not in RestoreDrill.Trainer.values:
        raise FieldError("trainer", f"one of {', '.join(RestoreDrill.Trainer.values)}")
    if steps is not None and steps < 1:
        raise FieldError("steps", "at least 1")
    if not has_fingerprint(checkpoint):
        raise FieldError(
            "checkpoint",
            f"Gantry holds no state fingerprint of step {checkpoint.step} (a trainer without "
            "fingerprints wrote it), so a drill could not judge it",
        )


def _drill_shape(
    checkpoint: Checkpoint,
    *,
    steps: int | None,
    allocation: dict[str, Any] | None,
    trainer: str,
    fallback: int | None,
    level: str = RestoreDrill.Level.REPLAY,
    exclude: str = "",
) -> tuple[int, int | None, dict[str, Any], str]:
    """(steps, replay-to step, allocation, allocation key) of a drill of ``checkpoint``;
    refused (FieldError) when it cannot be judged or the cluster cannot give it. At the
    level state-exact: the steps the run logged right after the checkpoint (zero or more,
    at most what a full drill would replay), compared; the state at load, always."""
    _check_drillable(checkpoint, steps=steps, trainer=trainer)
    if level not in RestoreDrill.Level.values:
        raise FieldError("level", f"one of {', '.join(RestoreDrill.Level.values)}")
    if level == RestoreDrill.Level.STATE_EXACT:
        wanted, _ = drill_plan(checkpoint, steps, fallback or settings.DRILL_DEFAULT_STEPS)
        steps = consecutive_losses_logged(checkpoint, wanted)
        end = checkpoint.step + steps
        held = (
            steps > 0
            and StateFingerprint.objects.filter(job_id=checkpoint.job_id, step=end).exists()
        )
        replay_to = end if held else None
    else:
        steps, replay_to = drill_plan(checkpoint, steps, fallback or settings.DRILL_DEFAULT_STEPS)
    chosen = allocation_for(checkpoint.job, allocation)
    if exclude:
        chosen["exclude"] = exclude
    _check_allocation(checkpoint.job, chosen)
    if level != RestoreDrill.Level.STATE_EXACT:
        _check_reference(checkpoint, steps)
    key = allocation_key(chosen) + (
        ":state-exact" if level == RestoreDrill.Level.STATE_EXACT else ""
    )
    if trainer == RestoreDrill.Trainer.CURRENT:
        key = f"{key}:trainer-current"
    return steps, replay_to, chosen, key


def restore_drill_start(
    *,
    actor: Actor,
    checkpoint: Checkpoint,
    steps: int | None = None,
    allocation: dict[str, Any] | None = None,
    trigger: str = RestoreDrill.Trigger.MANUAL,
    trainer: str = RestoreDrill.Trainer.RECORDED,
    fallback_steps: int | None = None,
    level: str = RestoreDrill.Level.REPLAY,
    exclude: str = "",
) -> RestoreDrill:
    """Create a drill and hand it to the submit task after commit.

    ``steps`` None: replay to the original run's next checkpoint (``drill_plan``).
    ``trainer``: ``recorded`` (the version that wrote the checkpoint) or ``current`` (a
    compatibility drill). ``actor`` None means Gantry itself (a scheduled policy). Refused,
    with the reason: a checkpoint whose state Gantry never recorded, an allocation the
    cluster cannot give, a partition the owner's account is not known to be allowed on
    (``partition``), more steps than the original run logged after the checkpoint, a drill
    people asked for that takes the checkpoint's owner over the cluster's drill budget
    (``budget``; ``drills.budgets``), or the same checkpoint, allocation and trainer
    already being drilled. Runs as the cluster's verifier where it has a usable one (its
    pass is proof), else as the owner (self-attested: never proof); see
    ``drills.attestation``.

    ``level`` ``state_exact``: see ``_drill_shape`` (its pass is recorded apart, as
    ``Checkpoint.state_proven_at``). ``exclude``: nodes left out (recovery's suspects).
    """
    job = checkpoint.job
    if actor is not None:
        require_can_act(actor, owner_id=job.owner_id, what="run drills on this job")
    steps, replay_to, chosen, key = _drill_shape(
        checkpoint,
        steps=steps,
        allocation=allocation,
        trainer=trainer,
        fallback=fallback_steps,
        level=level,
        exclude=exclude,
    )
    drill_partition_check(job=job, partition=str(chosen["partition"]))
    conflict = ConflictError(
        f"A drill of step {checkpoint.step} on this allocation ({key}) is already running; "
        "wait for its verdict or cancel it."
    )
    if RestoreDrill.objects.filter(
        checkpoint=checkpoint, allocation_key=key, state__in=RestoreDrill.ACTIVE_STATES
    ).exists():
        raise conflict
    drill = RestoreDrill(
        checkpoint=checkpoint,
        cluster=job.cluster,
        requested_by=actor,
        steps=steps,
        level=level,
        replay_to_step=replay_to,
        trainer=trainer,
        allocation=chosen,
        allocation_key=key,
        trigger=trigger,
        gpus=allocation_gpus(chosen),
        time_limit_minutes=drill_time_limit(job),
    )
    try:
        with transaction.atomic():
            if counts_against_owner(trigger):
                drill_budget_reserve(
                    owner_id=job.owner_id,
                    cluster=job.cluster,
                    gpus=drill.gpus,
                    time_limit_minutes=drill.time_limit_minutes,
                    now=timezone.now(),
                )
            _drill_create(drill, actor=actor)
    except IntegrityError:
        # The unique constraint caught a race the check above could not.
        raise conflict from None
    return drill


def _drill_create(drill: RestoreDrill, *, actor: Actor) -> None:
    """Save the new drill with its audit event; submit it once the transaction commits."""
    job = drill.checkpoint.job
    # Fixed now: a drill in flight keeps its account if the cluster's verifier changes.
    attested, self_attested_why = drill_attestation(cluster=job.cluster, owner_account=job.run_as)
    drill.attestation = attested["attestation"]
    drill.verifier_account = attested["verifier_account"]
    drill.save(force_insert=True)
    audit_event_record(
        actor=actor,
        action=AuditAction.DRILL_START,
        target=drill,
        details={
            "checkpoint_step": drill.checkpoint.step,
            "allocation": drill.allocation_key,
            "trigger": drill.trigger,
            "steps": drill.steps,
            "level": drill.level,
            "replay_to_step": drill.replay_to_step,
            "trainer": drill.trainer,
            "gpus": drill.gpus,
            "time_limit_minutes": drill.time_limit_minutes,
            # The verifier, or else the checkpoint's account, whoever asked.
            "run_as": attested["verifier_account"] or job.run_as or job.cluster.ssh_user,
            **attested,
            "self_attested_because": self_attested_why,
        },
    )
    drill_id = str(drill.id)
    transaction.on_commit(lambda: DRILLS.enqueue_submit(drill_id))


def restore_drill_submit_to_slurm(*, drill_id: str) -> str:
    """Submit the drill's Slurm job exactly once (tag lookup first, like jobs).

    Accepts ``queued`` and ``submitting`` with an expired lease; anything else is left.
    """
    return DRILLS.submit_exactly_once(drill_id)


def restore_drill_submit_gave_up(*, drill_id: str, error: BaseException) -> None:
    """The cluster stayed unreachable: the drill ends ``error`` (it could not run)."""
    DRILLS.submit_gave_up(drill_id, error)


def restore_drill_cancel(*, actor: User, drill: RestoreDrill) -> str:
    """Cancel a drill (the job's owner or an operator); idempotent. A finished drill is
    left as it is; no command runs here: a worker sends ``scancel`` (``runs.lifecycle``)."""
    require_can_act(actor, owner_id=drill.checkpoint.job.owner_id, what="cancel this drill")

    def audit(cancelled: RestoreDrill) -> None:
        audit_event_record(actor=actor, action=AuditAction.DRILL_CANCEL, target=cancelled)

    return DRILLS.cancel_request(drill, by=actor.get_username(), audit=audit)


def restore_drill_delete(*, actor: User, drill: RestoreDrill) -> None:
    """Delete a finished drill's record (operators only), audited; an active one is
    cancelled instead, so no Slurm job is left untracked."""
    if not is_operator(actor):
        raise PermissionDenied("Only operators may delete drills.")
    drill.refresh_from_db()
    if not drill.is_final:
        raise FieldError("drill", f"it is {drill.state}; cancel it first")
    with transaction.atomic():
        audit_event_record(
            actor=actor,
            action=AuditAction.DRILL_DELETE,
            target=drill,
            details={"verdict": drill.verdict, "checkpoint": drill.checkpoint_id},
        )
        drill.delete()


def checkpoint_verify(*, checkpoint_id: int) -> Checkpoint:
    """Integrity only: run the trainer's ``verify --json`` on the login node over SSH, as
    the cluster's verifier (given read access as the owner) where it has one, else as the
    checkpoint's account, whose OK never clears a failed check; the trainer is shipped
    to the shared archive as the service account. The directory is held to the checkpoint
    as Gantry registered it (its step and manifest digest): another checkpoint in its
    place fails (``not_as_registered``), and a failure blocks resuming from it.

    Read-only on the cluster, so safe to repeat."""
    checkpoint = Checkpoint.objects.select_related("job__cluster").get(pk=checkpoint_id)
    cluster = checkpoint.job.cluster
    trainer_path = trainer_ensure_uploaded(transport_for(cluster), cluster.workdir)
    # As the cluster's verifier where it has one; the owner's own check clears nothing.
    transport, attested = integrity_checker(checkpoint)
    registered = ["--registered-step", str(checkpoint.step)]
    if checkpoint.manifest_digest:
        registered += ["--registered-manifest-digest", checkpoint.manifest_digest]
    result = transport.exec(
        [
            "env",
            f"PYTHONPATH={trainer_path}",
            cluster.python,
            "-m",
            "trainer",
            "verify",
            "--checkpoint",
            checkpoint.path,
            "--json",
            *registered,
        ],
        check=False,
        timeout=600,
    )
    try:
        report = json.loads(result.stdout)
    except ValueError:
        report = None
    if not isinstance(report, dict):
        report = {"ok": False, "reason": (result.stderr or result.stdout).strip()[:2000]}
    # Held to what Gantry registered whatever the trainer on the cluster says.
    swapped = registration_mismatch(checkpoint, report)
    ok = swapped is None and result.rc == 0 and bool(report.get("ok", result.rc == 0))
    reason = report.get("reason") or report.get("error") or ""
    if report.get("reason_code") == Reason.NOT_AS_REGISTERED:
        reason = f"[{Reason.NOT_AS_REGISTERED}] {reason}"
    elif swapped is not None:
        reason = f"[{Reason.NOT_AS_REGISTERED}] {swapped}"
    # A failed check stays failed on the owner's word (drills.attestation).
    checkpoint_state.checkpoint_integrity_record(
        checkpoint_id=checkpoint.pk,
        ok=ok,
        detail=str(reason),
        report=report,
        attested=attested,
        now=timezone.now(),
    )
    checkpoint.refresh_from_db()
    return checkpoint


def checkpoint_verify_request(*, actor: User, checkpoint: Checkpoint) -> None:
    """Ask for an integrity check of ``checkpoint`` (owner or operator), after commit."""
    require_can_act(actor, owner_id=checkpoint.job.owner_id, what="check this checkpoint")
    with transaction.atomic():
        audit_event_record(actor=actor, action=AuditAction.CHECKPOINT_VERIFY, target=checkpoint)
        checkpoint_id = checkpoint.pk
        transaction.on_commit(lambda: task_send(CHECKPOINT_VERIFY, checkpoint_id))
