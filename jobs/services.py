"""Writes for jobs: submit (and preview), the submit task's work, cancel, resume, logs.

Validation lives in ``jobs.validation``, the Slurm lifecycle in ``runs.lifecycle`` (with
the job-specific part in ``jobs.lifecycle``), the watcher's reading of run
directories in ``jobs.rundir`` and ``jobs.ingest``.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction

from core.access import require_can_act
from core.audit import AuditAction, audit_event_record
from core.errors import FieldError
from core.roles import is_operator, is_researcher
from core.types import User
from jobs.lifecycle import JOBS, job_event
from jobs.models import Checkpoint, Job, JobEvent
from jobs.recovery_settings import recovery_overrides_validate
from jobs.script import job_script
from jobs.validation import JobRequest, job_request_validate, validate_environment
from nodes.access.cluster import transport_as
from nodes.access.identities import cluster_account_for
from runs.lifecycle import slurm_error_as_application_error
from runs.runtime import run_dir
from slurm import errors as slurm_errors


def _job_from_request(
    request: JobRequest,
    *,
    owner: User,
    config: dict[str, Any],
    job_id: uuid.UUID | None,
    run_as: str,
) -> Job:
    return Job(
        id=job_id or uuid.uuid4(),
        owner=owner,
        run_as=run_as,
        cluster=request.cluster,
        name=request.name.strip(),
        config=config,
        partition=request.partition,
        nodes=request.nodes,
        gpus_per_node=request.gpus_per_node,
        gpu_type=request.gpu_type,
        tasks_per_node=request.tasks_per_node,
        cpus_per_task=request.cpus_per_task,
        memory_mb=request.memory_mb,
        time_limit_minutes=request.time_limit_minutes,
        nodelist_requested=request.nodelist,
        exclude_nodes=request.exclude,
        recovery=recovery_overrides_validate(request.recovery),
        switches_requested=request.switches,
        environment=validate_environment(request.environment, cluster=request.cluster),
        total_steps=config.get("steps"),
    )


def _require_submitter(user: User) -> None:
    if not is_researcher(user):
        raise PermissionDenied("You need the researcher or operator role to submit jobs.")


def job_preview(
    *, user: User, request: JobRequest, job_id: uuid.UUID | None = None
) -> tuple[Job, str]:
    """Validate and render the sbatch script without saving anything."""
    _require_submitter(user)
    run_as = cluster_account_for(cluster=request.cluster, user=user)
    config = job_request_validate(request)
    job = _job_from_request(request, owner=user, config=config, job_id=job_id, run_as=run_as)
    return job, job_script(job)


def job_submit(
    *,
    user: User,
    request: JobRequest,
    job_id: uuid.UUID | None = None,
    parent: Job | None = None,
    resume_from: Checkpoint | None = None,
    run_as: str | None = None,
    origin: dict[str, Any] | None = None,
) -> Job:
    """Validate, save the job as ``queued`` and hand it to the submit task after commit.
    ``origin`` goes into the audit event (the template or job it was made from).

    It runs as the submitter's account on the cluster (``run_as`` None; a 400 on the
    ``cluster`` field, naming the fix, when they have none there), or as ``run_as`` (a
    resume runs as the account of the checkpoint it continues)."""
    _require_submitter(user)
    if run_as is None:
        run_as = cluster_account_for(cluster=request.cluster, user=user)
    config = job_request_validate(request)
    if job_id is not None and Job.objects.filter(id=job_id).exists():
        raise FieldError("id", "a job with this id exists already")
    job = _job_from_request(request, owner=user, config=config, job_id=job_id, run_as=run_as)
    job.parent = parent
    job.resume_from = resume_from
    with transaction.atomic():
        job.save(force_insert=True)
        job_event(job, JobEvent.Kind.STATE, to_state=Job.State.QUEUED, message="submitted")
        audit_event_record(
            actor=user,
            action=AuditAction.JOB_RESUME if resume_from else AuditAction.JOB_SUBMIT,
            target=job,
            details={
                "cluster": job.cluster.name,
                "partition": job.partition,
                "run_as": job.run_as or job.cluster.ssh_user,
                **(origin or {}),
            },
        )
        job_id_value = str(job.id)
        transaction.on_commit(lambda: JOBS.enqueue_submit(job_id_value))
    return job


def job_submit_to_slurm(*, job_id: str) -> str:
    """Put a queued job into Slurm exactly once; returns what happened, in words.

    Accepts ``queued`` (and ``submitting`` whose lease ran out: a worker died mid-way).
    Safe to re-run: before any ``sbatch`` it looks the job's tag up in squeue and sacct
    and adopts a Slurm job it finds, so a redelivered task never submits twice.
    Transient SSH errors propagate (the task retries); Slurm refusing the job fails it.
    """
    return JOBS.submit_exactly_once(job_id)


def job_submit_gave_up(*, job_id: str, error: BaseException) -> None:
    """Retries ran out on a transient error: back to ``queued``, visibly, not failed.

    The cluster may only be down for a while; the watcher re-enqueues queued jobs.
    """
    JOBS.submit_gave_up(job_id, error)


def job_cancel(*, actor: User, job: Job) -> str:
    """Cancel a job (owner or operator); idempotent. Accepts any state; a final job is left
    as it is. Before Slurm has it, the job ends at once; after, ``scancel`` is sent and the
    watcher records the final state."""
    require_can_act(actor, owner_id=job.owner_id, what="cancel this job")

    def audit(cancelled: Job) -> None:
        details = {"slurm_job_id": cancelled.slurm_job_id} if cancelled.slurm_job_id else {}
        audit_event_record(
            actor=actor, action=AuditAction.JOB_CANCEL, target=cancelled, details=details
        )

    return JOBS.cancel(job, by=actor.get_username(), audit=audit)


def job_delete(*, actor: User, job: Job) -> None:
    """Delete a job's record (operators only), audited. Refused for a job that has, or may
    still get, a Slurm job: its record is what keeps that Slurm job tracked."""
    if not is_operator(actor):
        raise PermissionDenied("Only operators may delete jobs.")
    job.refresh_from_db()
    if job.slurm_job_id:
        raise FieldError(
            "job", f"it has Slurm job {job.slurm_job_id}; cancel it instead (its record stays)"
        )
    if not job.is_final or job.sbatch_sent_at is not None:
        raise FieldError("job", f"it is {job.state}; only a job that never reached Slurm can go")
    with transaction.atomic():
        audit_event_record(
            actor=actor,
            action=AuditAction.JOB_DELETE,
            target=job,
            details={"name": job.name, "state": job.state, "owner": job.owner.get_username()},
        )
        job.delete()


def job_resume(
    *,
    actor: User,
    checkpoint: Checkpoint,
    name: str | None = None,
    steps: int | None = None,
    overrides: dict[str, Any] | None = None,
    environment: dict[str, str] | None = None,
    origin: dict[str, Any] | None = None,
) -> Job:
    """A new job that continues from ``checkpoint`` (the trainer's ``--resume``), linked to
    its parent, with the parent's resources and environment unless overridden. Refused
    when the checkpoint failed its integrity check."""
    parent = checkpoint.job
    require_can_act(actor, owner_id=parent.owner_id, what="resume this job")
    if checkpoint.deleted_at is not None:
        raise FieldError(
            "checkpoint",
            f"step {checkpoint.step} was removed from the cluster by the trainer's retention",
        )
    if checkpoint.integrity == Checkpoint.Integrity.FAILED:
        raise FieldError(
            "checkpoint",
            f"step {checkpoint.step} failed its integrity check ({checkpoint.integrity_detail}); "
            "resuming from it is blocked",
        )
    config = dict(parent.config)
    if steps is not None:
        if steps <= checkpoint.step:
            raise FieldError("steps", f"must be more than the checkpoint's step {checkpoint.step}")
        config["steps"] = steps
    values: dict[str, Any] = {
        "partition": parent.partition,
        "nodes": parent.nodes,
        "gpus_per_node": parent.gpus_per_node,
        "gpu_type": parent.gpu_type,
        "tasks_per_node": parent.tasks_per_node,
        "cpus_per_task": parent.cpus_per_task,
        "memory_mb": parent.memory_mb,
        "time_limit_minutes": parent.time_limit_minutes,
        "nodelist": "",
        "switches": parent.switches_requested,
        "exclude": parent.exclude_nodes,
        "recovery": dict(parent.recovery or {}),
    }
    values.update(overrides or {})
    request = JobRequest(
        cluster=parent.cluster,
        name=name or f"{parent.name} (resumed @{checkpoint.step})",
        config=config,
        environment=dict(parent.environment or {}) if environment is None else environment,
        **values,
    )
    return job_submit(
        user=actor,
        request=request,
        parent=parent,
        resume_from=checkpoint,
        run_as=_resume_account(parent),
        origin=origin,
    )


def _resume_account(parent: Job) -> str:
    """The account a resume of ``parent`` runs as, whoever asks: the one whose area holds
    the checkpoint, as long as it is still its owner's (a resume by an operator runs as the
    researcher, audited as the operator's). A job from before per-user identities resumes
    as its owner's current account (it can read the old, world-readable run directory)."""
    cluster = parent.cluster
    current = cluster_account_for(cluster=cluster, user=parent.owner)
    if parent.run_as and current != parent.run_as:
        raise FieldError(
            "checkpoint",
            f"the job ran as {parent.run_as}, which is no longer {parent.owner}'s account on "
            f"{cluster.name} ({current or 'the service account'} is); an operator maps "
            f"{parent.owner} back to {parent.run_as} to resume it",
        )
    return current


def job_log_tail(*, job: Job, max_bytes: int = 64 * 1024) -> dict[str, Any]:
    """The end of the job's Slurm output file, read over SFTP on demand."""
    if not job.slurm_job_id:
        return {"text": "", "size": 0, "truncated": False, "path": None}
    path = f"{run_dir(job.cluster.workdir, str(job.id), job.run_as)}/slurm-{job.slurm_job_id}.out"
    try:
        # As the job's account: its run directory is readable by it alone.
        transport = transport_as(job.cluster, job.run_as)
        stat = transport.stat(path)
        if stat is None:
            return {"text": "", "size": 0, "truncated": False, "path": path}
        start = max(0, stat.size - max_bytes)
        data = transport.read_from(path, start, max_bytes)
    except slurm_errors.SlurmError as error:
        raise slurm_error_as_application_error("Could not read the log", error) from None
    text = data.decode("utf-8", errors="replace")
    if start > 0 and "\n" in text:
        text = text.split("\n", 1)[1]
    return {"text": text, "size": stat.size, "truncated": start > 0, "path": path}
