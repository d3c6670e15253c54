"""Restore drills: prove that a checkpoint resumes training, on a real allocation.

A drill is a Slurm job running ``python -m trainer drill`` against the original run's
metrics; the watcher follows it like a job and stores the verdict from ``drill.json``.
``error`` means the drill could not run; it is never a verdict on the checkpoint.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.audit import audit_event_record
from controlplane.errors import ApplicationError, ConflictError, FieldError
from controlplane.roles import is_operator, is_researcher
from jobs.models import Checkpoint, DrillPolicy, Job, MetricPoint, RestoreDrill
from jobs.runtime import ScriptSpec, drill_dir, render_sbatch, run_dir, trainer_ensure_uploaded
from jobs.services import (
    JobRequest,
    _request_reconcile,
    describe_cluster_error,
    gantry_state,
    job_request_validate,
    submit_exactly_once,
)
from nodes.cluster_access import slurm_client_for, transport_for
from nodes.slurm import commands as slurm_commands
from nodes.slurm import errors as slurm_errors
from nodes.slurm.parsers import SlurmJob

logger = logging.getLogger(__name__)

NOT_A_VERDICT = "this is not a verdict on the checkpoint"
INTEGRITY_CODES = {
    "integrity_hash_mismatch",
    "integrity_size_mismatch",
    "missing_file",
    "missing_manifest",
    "missing_state",
}


def allocation_for(job: Job, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The drill's allocation: the original job's shape unless overridden."""
    allocation = {
        "partition": job.partition,
        "nodes": job.nodes,
        "tasks_per_node": job.tasks_per_node,
        "gpus_per_node": job.gpus_per_node,
        "gpu_type": job.gpu_type,
        "cpus_per_task": job.cpus_per_task,
    }
    for key, value in (overrides or {}).items():
        if key in allocation and value not in (None, ""):
            allocation[key] = value
    return allocation


def allocation_key(allocation: dict[str, Any]) -> str:
    return (
        f"{allocation['partition']}:{allocation['nodes']}x{allocation['tasks_per_node']}"
        f":gpu{allocation['gpus_per_node']}{allocation['gpu_type'] or ''}"
        f":cpu{allocation['cpus_per_task']}"
    )


def _check_can_drill(actor: Any, job: Job) -> None:
    if actor is None:  # the scheduled policy
        return
    if not (is_operator(actor) or (job.owner_id == actor.pk and is_researcher(actor))):
        raise PermissionDenied("Only the job's owner or an operator may run drills on it.")


def restore_drill_start(
    *,
    actor: Any,
    checkpoint: Checkpoint,
    steps: int | None = None,
    allocation: dict[str, Any] | None = None,
    trigger: str = RestoreDrill.Trigger.MANUAL,
) -> RestoreDrill:
    """Create a drill and hand it to the submit task after commit.

    Refused, with the reason: an allocation the cluster cannot give, more steps than the
    original run logged after the checkpoint, or the same checkpoint and allocation already
    being drilled.
    """
    job = checkpoint.job
    _check_can_drill(actor, job)
    if checkpoint.deleted_at is not None:
        raise FieldError(
            "checkpoint",
            f"step {checkpoint.step} was removed from the cluster by the trainer's retention "
            f"(checkpoint_keep={job.config.get('checkpoint_keep')}); nothing left to drill",
        )
    steps = steps or settings.DRILL_DEFAULT_STEPS
    if steps < 1:
        raise FieldError("steps", "at least 1")
    chosen = allocation_for(job, allocation)
    request = JobRequest(
        cluster=job.cluster,
        name=f"drill of {job.name}",
        config=job.config,
        partition=str(chosen["partition"]),
        nodes=int(chosen["nodes"]),
        gpus_per_node=int(chosen["gpus_per_node"]),
        gpu_type=str(chosen["gpu_type"] or ""),
        tasks_per_node=int(chosen["tasks_per_node"]),
        cpus_per_task=int(chosen["cpus_per_task"]),
        memory_mb=job.memory_mb,
        time_limit_minutes=min(job.time_limit_minutes, 30),
        nodelist="",
        switches="",
    )
    try:
        job_request_validate(request)
    except FieldError as error:
        raise FieldError(f"allocation.{error.field}", error.why) from None
    logged_after = MetricPoint.objects.filter(
        job=job, step__gt=checkpoint.step, step__lte=checkpoint.step + steps
    ).count()
    if logged_after < steps:
        raise FieldError(
            "steps",
            f"the original run logged {logged_after} step(s) after step {checkpoint.step}; "
            f"a drill compares against them, so at most {logged_after} can be checked",
        )
    key = allocation_key(chosen)
    if RestoreDrill.objects.filter(
        checkpoint=checkpoint, allocation_key=key, state__in=RestoreDrill.ACTIVE_STATES
    ).exists():
        raise ConflictError(
            f"A drill of step {checkpoint.step} on this allocation ({key}) is already running; "
            "wait for its verdict or cancel it."
        )
    try:
        with transaction.atomic():
            drill = RestoreDrill.objects.create(
                checkpoint=checkpoint,
                cluster=job.cluster,
                requested_by=actor if actor is not None else None,
                steps=steps,
                allocation=chosen,
                allocation_key=key,
                trigger=trigger,
            )
            audit_event_record(
                actor=actor,
                action="drill.start",
                target=drill,
                details={"checkpoint_step": checkpoint.step, "allocation": key, "trigger": trigger},
            )
            drill_id = str(drill.id)
            transaction.on_commit(lambda: _enqueue_drill_submit(drill_id))
    except IntegrityError:
        # The unique constraint caught a race the check above could not.
        raise ConflictError(
            f"A drill of step {checkpoint.step} on this allocation is already running."
        ) from None
    return drill


def _enqueue_drill_submit(drill_id: str) -> None:
    from jobs.tasks import restore_drill_submit_task

    try:
        restore_drill_submit_task.delay(drill_id)
    except Exception:  # Redis down: the watcher re-enqueues queued drills.
        logger.warning("could not enqueue drill %s; the watcher will", drill_id)


def _drill_transition(drill: RestoreDrill, to_state: str, **values: Any) -> bool:
    # Nothing got updated: another worker got there first.
    if not RestoreDrill.objects.filter(id=drill.id, state=drill.state).update(
        state=to_state, **values
    ):
        return False
    drill.state = to_state
    for key, value in values.items():
        setattr(drill, key, value)
    return True


def _drill_spec(drill: RestoreDrill, *, trainer_path: str) -> ScriptSpec:
    job = drill.checkpoint.job
    cluster = job.cluster
    out_dir = drill_dir(cluster.workdir, str(job.id), str(drill.id))
    allocation = drill.allocation
    return ScriptSpec(
        job_id=str(drill.id),
        job_name=f"restore drill of {job.name} step {drill.checkpoint.step}",
        run_dir=out_dir,
        trainer_dir=trainer_path,
        python=cluster.python,
        partition=allocation["partition"],
        nodes=int(allocation["nodes"]),
        tasks_per_node=int(allocation["tasks_per_node"]),
        cpus_per_task=int(allocation["cpus_per_task"]),
        gpus_per_node=int(allocation["gpus_per_node"]),
        gpu_type=allocation.get("gpu_type") or "",
        memory_mb=job.memory_mb,
        time_limit_minutes=min(job.time_limit_minutes, 30),
        nodelist="",
        switches="",
        trainer_args=(
            "drill",
            "--checkpoint",
            drill.checkpoint.path,
            "--reference",
            f"{run_dir(cluster.workdir, str(job.id))}/metrics.jsonl",
            "--steps",
            str(drill.steps),
            "--out",
            f"{out_dir}/drill.json",
        ),
    )


def restore_drill_submit_to_slurm(*, drill_id: str) -> str:
    """Submit the drill's Slurm job exactly once (tag lookup first, like jobs).

    Accepts ``queued`` and ``submitting`` with an expired lease; anything else is left.
    """
    return submit_exactly_once(RestoreDrill, drill_id, _drill_submit_claimed)


def _drill_submit_claimed(drill_id: str) -> str:
    drill = RestoreDrill.objects.select_related("checkpoint__job__cluster").get(id=drill_id)
    cluster = drill.checkpoint.job.cluster
    client = slurm_client_for(cluster)
    tag = slurm_commands.job_tag(drill.id)
    existing = client.find_jobs_by_tag(tag, since=drill.created_at - timedelta(minutes=5))
    if existing:
        _drill_transition(
            drill,
            RestoreDrill.State.PENDING,
            slurm_job_id=existing[0].job_id,
            submitted_at=existing[0].submit_time or timezone.now(),
            last_seen_in_slurm_at=timezone.now(),
            submit_lease_until=None,
        )
        return f"adopted Slurm job {existing[0].job_id}"
    transport = transport_for(cluster)
    trainer_path = trainer_ensure_uploaded(transport, cluster.workdir)
    spec = _drill_spec(drill, trainer_path=trainer_path)
    transport.makedirs(spec.run_dir)
    transport.put_bytes(f"{spec.run_dir}/drill.sbatch", render_sbatch(spec).encode(), mode=0o755)
    try:
        slurm_id = client.submit(f"{spec.run_dir}/drill.sbatch", tag=tag)
    except slurm_errors.SlurmCommandError as error:
        if error.transient:
            raise
        restore_drill_error(
            drill=drill, reason=f"Slurm refused the drill job: {error.stderr.strip() or error}"
        )
        return "refused by Slurm"
    if not _drill_transition(
        drill,
        RestoreDrill.State.PENDING,
        slurm_job_id=slurm_id,
        submitted_at=timezone.now(),
        last_seen_in_slurm_at=timezone.now(),
        submit_lease_until=None,
    ):
        current = RestoreDrill.objects.get(id=drill.id)
        if current.state == RestoreDrill.State.CANCELLED:
            client.cancel(slurm_id)
    # Look at it soon, whatever the watcher's idle back-off was.
    _request_reconcile(cluster.pk)
    return f"submitted as Slurm job {slurm_id}"


def restore_drill_error(*, drill: RestoreDrill, reason: str, exit_code: int | None = None) -> None:
    """End a drill with ``error``: it could not run. Says so in plain words."""
    drill.refresh_from_db()
    if drill.state in (RestoreDrill.State.FINISHED, RestoreDrill.State.CANCELLED):
        return
    text = reason if NOT_A_VERDICT in reason else f"{reason} ({NOT_A_VERDICT})"
    _drill_transition(
        drill,
        RestoreDrill.State.FINISHED,
        verdict=RestoreDrill.Verdict.ERROR,
        reason=text[:4000],
        reason_code="infrastructure_error",
        finished_at=timezone.now(),
        exit_code=exit_code,
        submit_lease_until=None,
    )


def restore_drill_submit_gave_up(*, drill_id: str, error: BaseException) -> None:
    drill = RestoreDrill.objects.filter(id=drill_id).first()
    if drill is not None:
        restore_drill_error(
            drill=drill,
            reason="could not reach the cluster to start the drill: "
            + describe_cluster_error(error),
        )


def restore_drill_cancel(*, actor: Any, drill: RestoreDrill) -> str:
    """Cancel a drill; idempotent. A finished drill is left as it is."""
    _check_can_drill(actor, drill.checkpoint.job)
    drill.refresh_from_db()
    if not drill.is_active:
        return f"already {drill.state}"
    if drill.slurm_job_id:
        try:
            slurm_client_for(drill.checkpoint.job.cluster).cancel(drill.slurm_job_id)
        except slurm_errors.SlurmError as error:
            raise ApplicationError(
                f"Could not cancel: {describe_cluster_error(error)}",
                status_code=503 if error.transient else 502,
            ) from None
    with transaction.atomic():
        for _ in range(3):
            if _drill_transition(drill, RestoreDrill.State.CANCELLED, finished_at=timezone.now()):
                break
            drill.refresh_from_db()
            if not drill.is_active:
                break
        audit_event_record(actor=actor, action="drill.cancel", target=drill)
    return "cancelled"


# ---------------------------------------------------------------- results


def restore_drill_apply_report(
    *, drill: RestoreDrill, report: dict[str, Any], exit_code: int | None
) -> None:
    """Store the verdict from ``drill.json``; a pass proves the checkpoint restorable."""
    verdict = report.get("verdict")
    reason_code = str(report.get("reason_code") or "")
    timings = report.get("timings") or {}
    now = timezone.now()
    if verdict == "passed":
        stored_verdict = RestoreDrill.Verdict.PASSED
    elif verdict == "failed" and reason_code != "infrastructure_error":
        stored_verdict = RestoreDrill.Verdict.FAILED
    else:
        stored_verdict = RestoreDrill.Verdict.ERROR
    reason = str(report.get("reason") or "")
    if stored_verdict == RestoreDrill.Verdict.ERROR:
        reason = f"{reason or 'the drill could not complete'} ({NOT_A_VERDICT})"

    def number(key: str) -> float | None:
        value = timings.get(key)
        return float(value) if isinstance(value, int | float) else None

    with transaction.atomic():
        if not _drill_transition(
            drill,
            RestoreDrill.State.FINISHED,
            verdict=stored_verdict,
            reason=reason[:4000],
            reason_code=reason_code[:64],
            evidence=report,
            integrity_s=number("integrity_s"),
            load_s=number("load_s"),
            steps_s=number("steps_s"),
            finished_at=now,
            exit_code=exit_code,
        ):
            return
        checkpoint = drill.checkpoint
        if stored_verdict == RestoreDrill.Verdict.PASSED:
            Checkpoint.objects.filter(pk=checkpoint.pk).update(
                last_proven_at=now,
                integrity=Checkpoint.Integrity.OK,
                integrity_detail="",
                integrity_checked_at=now,
            )
        elif stored_verdict == RestoreDrill.Verdict.FAILED and reason_code in INTEGRITY_CODES:
            Checkpoint.objects.filter(pk=checkpoint.pk).update(
                integrity=Checkpoint.Integrity.FAILED,
                integrity_detail=reason[:2000],
                integrity_checked_at=now,
            )


def drills_reconcile_states(
    *,
    drills: list[RestoreDrill],
    queue: dict[str, SlurmJob],
    accounted: dict[str, SlurmJob],
    transport: Any,
) -> int:
    """Apply squeue/sacct views to active drills (fetched by the job watcher in the same
    commands); read ``drill.json`` of those that ended. Returns the number of changes."""
    changes = 0
    now = timezone.now()
    for drill in drills:
        seen = accounted.get(drill.slurm_job_id) or queue.get(drill.slurm_job_id)
        if seen is None:
            last = drill.last_seen_in_slurm_at or drill.submitted_at or drill.created_at
            if now - last > timedelta(seconds=settings.JOB_LOST_AFTER_SECONDS):
                restore_drill_error(
                    drill=drill, reason=f"Slurm lost the drill job {drill.slurm_job_id}"
                )
                changes += 1
            continue
        RestoreDrill.objects.filter(id=drill.id).update(last_seen_in_slurm_at=now)
        state = gantry_state(seen.state)
        if (
            state in (Job.State.RUNNING, Job.State.COMPLETING)
            and drill.state == RestoreDrill.State.PENDING
        ):
            values: dict[str, Any] = {"started_at": seen.start_time or now}
            if drill.submitted_at and seen.start_time:
                values["queue_wait_s"] = max(
                    0.0, (seen.start_time - drill.submitted_at).total_seconds()
                )
            if _drill_transition(drill, RestoreDrill.State.RUNNING, **values):
                changes += 1
            continue
        if state not in Job.FINAL_STATES or drill.slurm_job_id not in accounted:
            continue
        if state == Job.State.CANCELLED:
            if _drill_transition(drill, RestoreDrill.State.CANCELLED, finished_at=now):
                changes += 1
            continue
        if drill.started_at is None and seen.start_time:
            # It ran and ended between two cycles: fill in when it started.
            values = {"started_at": seen.start_time}
            if drill.submitted_at:
                waited = (seen.start_time - drill.submitted_at).total_seconds()
                values["queue_wait_s"] = max(0.0, waited)
            RestoreDrill.objects.filter(id=drill.id).update(**values)
        job = drill.checkpoint.job
        path = f"{drill_dir(job.cluster.workdir, str(job.id), str(drill.id))}/drill.json"
        try:
            report = json.loads(transport.get_bytes(path))
        except slurm_errors.RemoteFileNotFound:
            report = None
        except ValueError:
            report = None
        if (
            isinstance(report, dict)
            and report.get("verdict") == "failed"
            and report.get("reason_code") in {"missing_file", "missing_manifest"}
            and not transport.exists(drill.checkpoint.path)
        ):
            # The whole directory is gone: the trainer's retention rotated the checkpoint
            # out while the drill ran. That says nothing about the checkpoint itself.
            Checkpoint.objects.filter(pk=drill.checkpoint_id, deleted_at__isnull=True).update(
                deleted_at=now
            )
            restore_drill_error(
                drill=drill,
                reason="the checkpoint was removed by the trainer's retention "
                "(checkpoint_keep) while the drill ran",
                exit_code=seen.exit_code,
            )
        elif isinstance(report, dict) and report.get("verdict"):
            restore_drill_apply_report(drill=drill, report=report, exit_code=seen.exit_code)
        else:
            restore_drill_error(
                drill=drill,
                reason=f"the drill job ended {seen.state} (exit code {seen.exit_code}) "
                "without writing drill.json",
                exit_code=seen.exit_code,
            )
        changes += 1
    return changes


# ---------------------------------------------------------------- verify and policies


def checkpoint_verify(*, checkpoint_id: int) -> Checkpoint:
    """Integrity only: run the trainer's ``verify --json`` on the login node over SSH."""
    checkpoint = Checkpoint.objects.select_related("job__cluster").get(pk=checkpoint_id)
    cluster = checkpoint.job.cluster
    transport = transport_for(cluster)
    trainer_path = trainer_ensure_uploaded(transport, cluster.workdir)
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
        ],
        check=False,
        timeout=600,
    )
    try:
        report = json.loads(result.stdout)
    except ValueError:
        report = {"ok": False, "reason": (result.stderr or result.stdout).strip()[:2000]}
    ok = result.rc == 0 and bool(report.get("ok", result.rc == 0))
    now = timezone.now()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        integrity=Checkpoint.Integrity.OK if ok else Checkpoint.Integrity.FAILED,
        integrity_detail=""
        if ok
        else str(report.get("reason") or report.get("error") or "")[:2000],
        integrity_checked_at=now,
        integrity_report=report,
    )
    checkpoint.refresh_from_db()
    return checkpoint


def checkpoint_verify_request(*, actor: Any, checkpoint: Checkpoint) -> None:
    _check_can_drill(actor, checkpoint.job)
    with transaction.atomic():
        audit_event_record(actor=actor, action="checkpoint.verify", target=checkpoint)
        checkpoint_id = checkpoint.pk

        def enqueue() -> None:
            from jobs.tasks import checkpoint_verify_task

            checkpoint_verify_task.delay(checkpoint_id)

        transaction.on_commit(enqueue)


def drill_policy_update(*, actor: Any, cluster: Any, **values: Any) -> DrillPolicy:
    if not is_operator(actor):
        raise PermissionDenied("Only operators may change drill policies.")
    with transaction.atomic():
        policy, _ = DrillPolicy.objects.get_or_create(cluster=cluster)
        before = {
            key: getattr(policy, key)
            for key in (
                "enabled",
                "running_every_hours",
                "drill_final_checkpoint",
                "max_in_flight",
                "steps",
            )
        }
        for key, value in values.items():
            setattr(policy, key, value)
        if policy.enabled and policy.drill_final_checkpoint and policy.final_since is None:
            policy.final_since = timezone.now()
        if not (policy.enabled and policy.drill_final_checkpoint):
            policy.final_since = None
        policy.updated_by = actor
        policy.full_clean()
        policy.save()
        after = {key: getattr(policy, key) for key in before}
        audit_event_record(
            actor=actor,
            action="drill_policy.update",
            target=policy,
            details={"before": before, "after": after},
        )
    return policy


def drill_policies_apply() -> int:
    """Beat: start the drills the policies ask for, at most ``max_in_flight`` per cluster."""
    started = 0
    for policy in DrillPolicy.objects.filter(enabled=True).select_related("cluster"):
        in_flight = RestoreDrill.objects.filter(
            cluster=policy.cluster, state__in=RestoreDrill.ACTIVE_STATES
        ).count()
        room = policy.max_in_flight - in_flight
        if room <= 0:
            continue
        for checkpoint, trigger in _policy_candidates(policy):
            if room <= 0:
                break
            try:
                restore_drill_start(
                    actor=None,
                    checkpoint=checkpoint,
                    steps=policy.steps,
                    trigger=trigger,
                )
            except ApplicationError as error:
                logger.info("policy drill of %s skipped: %s", checkpoint, error.message)
                continue
            room -= 1
            started += 1
    return started


def _newest_drillable_checkpoint(job: Job, steps: int) -> Checkpoint | None:
    """The newest checkpoint still on the cluster that the original run logged ``steps``
    steps after: a drill compares against those. (The final checkpoint of a run has no
    steps after it, so the last drillable one is the one before it.)"""
    last_step = job.last_step or 0
    return (
        job.checkpoints.filter(deleted_at__isnull=True, step__lte=last_step - steps)
        .order_by("-step")
        .first()
    )


def _policy_candidates(policy: DrillPolicy) -> list[tuple[Checkpoint, str]]:
    now = timezone.now()
    candidates: list[tuple[Checkpoint, str]] = []
    if policy.running_every_hours:
        since = now - timedelta(hours=policy.running_every_hours)
        for job in Job.objects.filter(cluster=policy.cluster, state=Job.State.RUNNING).order_by(
            "created_at"
        ):
            checkpoint = _newest_drillable_checkpoint(job, policy.steps)
            if checkpoint is None:
                continue
            recent = RestoreDrill.objects.filter(
                checkpoint__job=job, created_at__gte=since
            ).exists()
            if not recent:
                candidates.append((checkpoint, RestoreDrill.Trigger.POLICY_RUNNING))
    if policy.drill_final_checkpoint and policy.final_since is not None:
        for job in Job.objects.filter(
            cluster=policy.cluster,
            state=Job.State.COMPLETED,
            files_final=True,
            ended_at__gte=policy.final_since,
        ).order_by("ended_at"):
            checkpoint = _newest_drillable_checkpoint(job, policy.steps)
            if checkpoint is None:
                continue
            if not RestoreDrill.objects.filter(
                checkpoint__job=job, trigger=RestoreDrill.Trigger.POLICY_FINAL
            ).exists():
                candidates.append((checkpoint, RestoreDrill.Trigger.POLICY_FINAL))
    return candidates
