"""Writes for jobs: submit (and preview), the submit task's work, cancel, resume, logs.

Validation lives in ``jobs.validation``, the Slurm lifecycle in ``runs.lifecycle`` (with
the job-specific part in ``jobs.lifecycle``), the watcher's reading of run
directories in ``jobs.rundir`` and ``jobs.ingest``.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.tasknames import JOB_LOG_TAIL_READ, task_send
from core.access import require_can_act
from core.audit import AuditAction, audit_event_record
from core.errors import FieldError
from core.roles import is_operator, is_researcher
from core.types import User
from jobs.lifecycle import JOBS, job_event
from jobs.models import Checkpoint, Job, JobEvent, JobLogTail
from jobs.recovery_settings import recovery_overrides_validate
from jobs.script import job_script
from jobs.validation import JobRequest, job_request_validate, validate_environment
from nodes.access.identities import cluster_account_for
from slurm import errors as slurm_errors
from slurm.errors import describe_cluster_error


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
    """Cancel a job (owner or operator); idempotent, and no command runs here. Accepts any
    state; a final job is left as it is. Before Slurm has it, the job ends at once; after,
    the request is recorded ("cancel requested by …" on the timeline, audited) and a
    worker sends ``scancel`` as the job's account (``runs.lifecycle.requests``); the
    watcher records the final state."""
    require_can_act(actor, owner_id=job.owner_id, what="cancel this job")

    def audit(cancelled: Job) -> None:
        details = {"slurm_job_id": cancelled.slurm_job_id} if cancelled.slurm_job_id else {}
        audit_event_record(
            actor=actor, action=AuditAction.JOB_CANCEL, target=cancelled, details=details
        )

    return JOBS.cancel_request(job, by=actor.get_username(), audit=audit)


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


# The most of a job's Slurm output the log tail keeps (the whole file streams from
# ``jobs.output``), and how old a read may be before asking for it starts a new one.
LOG_TAIL_BYTES = 256 * 1024
LOG_TAIL_FRESH_SECONDS = 5


def job_log_tail(*, job: Job, max_bytes: int = 64 * 1024) -> dict[str, Any]:
    """The end of the job's Slurm output as a worker last read it (no command runs
    here): at most ``max_bytes`` of it, with ``read_at`` and ``age_s``. A read older than
    ``LOG_TAIL_FRESH_SECONDS`` (or none yet) asks a worker for a new one (``reading``:
    poll again); ``error`` says why the last read failed."""
    now = timezone.now()
    tail = JobLogTail.objects.filter(job=job).first()
    fresh = (
        tail is not None
        and tail.read_at is not None
        and ((now - tail.read_at).total_seconds() <= LOG_TAIL_FRESH_SECONDS)
    )
    if job.slurm_job_id and not fresh:
        job_log_tail_request(job=job, now=now)
        tail = JobLogTail.objects.filter(job=job).first()
    if tail is None:
        tail = JobLogTail(job=job)
    text, truncated = tail.text, tail.truncated
    data = text.encode()
    if len(data) > max_bytes:
        text = data[-max_bytes:].decode("utf-8", errors="replace").split("\n", 1)[-1]
        truncated = True
    read_at, asked = tail.read_at, tail.requested_at
    return {
        "text": text,
        "size": tail.size or 0,
        "truncated": truncated,
        "path": tail.path or None,
        "read_at": read_at,
        "age_s": None if read_at is None else max(0.0, (now - read_at).total_seconds()),
        "reading": asked is not None and (read_at is None or asked > read_at),
        "error": tail.error,
    }


def job_log_tail_request(*, job: Job, now: datetime | None = None) -> bool:
    """Ask a worker to read the job's log tail; False when a read was asked for moments
    ago (asking again is the same read) or the job has no Slurm job yet."""
    if not job.slurm_job_id:
        return False
    now = now or timezone.now()
    JobLogTail.objects.get_or_create(job=job)
    recent = now - timedelta(seconds=LOG_TAIL_FRESH_SECONDS)
    # Nothing got updated: another request asked for a read just now.
    if not (
        JobLogTail.objects.filter(job=job)
        .filter(Q(requested_at__isnull=True) | Q(requested_at__lt=recent))
        .update(requested_at=now)
    ):
        return False
    job_id = str(job.id)
    transaction.on_commit(lambda: task_send(JOB_LOG_TAIL_READ, job_id))
    return True


def job_log_tail_read(*, job_id: str) -> str:
    """The worker's read of a job's log tail as the job's account: one stat and one read
    of at most ``LOG_TAIL_BYTES`` from the end (the task's time limit bounds the wait a
    login file can cause). Safe to re-run: it overwrites the tail with a newer read. A
    failure is stored with the tail (the page shows it), never raised."""
    job = Job.objects.select_related("cluster").filter(id=job_id).first()
    if job is None or not job.slurm_job_id:
        return "nothing to read"
    path = f"{JOBS.run_directory(job)}/slurm-{job.slurm_job_id}.out"
    try:
        # As the job's account: its run directory is readable by it alone.
        transport = JOBS.transport_of(job)
        stat = transport.stat(path)
        size = stat.size if stat is not None else 0
        start = max(0, size - LOG_TAIL_BYTES)
        data = transport.read_from(path, start, LOG_TAIL_BYTES) if stat is not None else b""
    except slurm_errors.SlurmError as error:
        reason = f"could not read the log: {describe_cluster_error(error)}"
        JobLogTail.objects.update_or_create(job=job, defaults={"error": reason[:1024]})
        return reason
    text = data[:LOG_TAIL_BYTES].decode("utf-8", errors="replace").replace("\x00", "")
    if start > 0 and "\n" in text:
        text = text.split("\n", 1)[1]
    values = {
        "text": text,
        "size": size,
        "truncated": start > 0,
        "path": path,
        "read_at": timezone.now(),
        "error": "",
    }
    JobLogTail.objects.update_or_create(job=job, defaults=values)
    return f"read {len(data)} bytes"
