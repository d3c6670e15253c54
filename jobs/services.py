"""Writes for jobs: submit, the submit task's work, cancel, resume, and the watcher.

Every state change is a conditional update on the state the caller saw, so two workers
racing apply each change once; each applied change is one ``JobEvent`` on the timeline.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from controlplane.audit import audit_event_record
from controlplane.errors import ApplicationError, ConflictError, FieldError
from controlplane.faults import faultpoint
from controlplane.roles import is_operator, is_researcher
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint
from jobs.runtime import ScriptSpec, render_sbatch, run_dir, trainer_ensure_uploaded
from nodes.cluster_access import slurm_client_for, transport_for
from nodes.models import Cluster, Gpu, Node, Partition
from nodes.services import describe_cluster_error
from nodes.slurm import commands as slurm_commands
from nodes.slurm import errors as slurm_errors
from nodes.slurm.hostlist import expand
from nodes.slurm.parsers import SlurmJob
from trainer.config import ConfigError
from trainer.config import validate as trainer_config_validate

logger = logging.getLogger(__name__)

_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")

# Slurm's job states, as Gantry's.
SLURM_STATE_MAP: dict[str, str] = {
    "PENDING": Job.State.PENDING,
    "CONFIGURING": Job.State.PENDING,
    "REQUEUED": Job.State.PENDING,
    "REQUEUE_FED": Job.State.PENDING,
    "REQUEUE_HOLD": Job.State.PENDING,
    "RESV_DEL_HOLD": Job.State.PENDING,
    "RUNNING": Job.State.RUNNING,
    "SUSPENDED": Job.State.RUNNING,
    "STOPPED": Job.State.RUNNING,
    "RESIZING": Job.State.RUNNING,
    "SIGNALING": Job.State.RUNNING,
    "STAGE_OUT": Job.State.COMPLETING,
    "COMPLETING": Job.State.COMPLETING,
    "COMPLETED": Job.State.COMPLETED,
    "FAILED": Job.State.FAILED,
    "BOOT_FAIL": Job.State.FAILED,
    "OUT_OF_MEMORY": Job.State.FAILED,
    "PREEMPTED": Job.State.FAILED,
    "SPECIAL_EXIT": Job.State.FAILED,
    "CANCELLED": Job.State.CANCELLED,
    "REVOKED": Job.State.CANCELLED,
    "DEADLINE": Job.State.TIMEOUT,
    "TIMEOUT": Job.State.TIMEOUT,
    "NODE_FAIL": Job.State.NODE_FAIL,
}


def gantry_state(slurm_state: str) -> str | None:
    return SLURM_STATE_MAP.get(slurm_state.upper())


# ---------------------------------------------------------------- validation


@dataclass(frozen=True)
class JobRequest:
    cluster: Cluster
    name: str
    config: dict[str, Any]
    partition: str
    nodes: int
    gpus_per_node: int
    gpu_type: str
    tasks_per_node: int
    cpus_per_task: int
    memory_mb: int | None
    time_limit_minutes: int
    nodelist: str
    switches: str
    environment: dict[str, str] | None = None


_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
# Names the script itself sets, or that would change what runs.
_ENV_RESERVED = {
    "PATH",
    "PYTHONPATH",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def _validate_environment(environment: dict[str, str] | None) -> dict[str, str]:
    if not environment:
        return {}
    if not isinstance(environment, dict):
        raise FieldError("environment", "must be an object of NAME: value")
    if len(environment) > 32:
        raise FieldError("environment", "at most 32 variables")
    clean: dict[str, str] = {}
    for name, value in environment.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise FieldError("environment", f"{name!r} is not a variable name (A-Z, 0-9, _)")
        if name in _ENV_RESERVED or name.startswith("SLURM_"):
            raise FieldError("environment", f"{name} is set by Gantry or Slurm")
        if not isinstance(value, str) or len(value) > 1024 or _CONTROL_CHARACTERS.search(value):
            raise FieldError(
                "environment", f"{name}: a string of at most 1024 characters, no control characters"
            )
        clean[name] = value
    return clean


def _partition_names(cluster: Cluster) -> list[str]:
    return sorted(cluster.partitions.filter(gone=False).values_list("name", flat=True))


def job_request_validate(request: JobRequest) -> dict[str, Any]:
    """Refuse, with the field and why, what the cluster cannot run; return the full config.

    Checked against Gantry's synced inventory, before anything reaches Slurm.
    """
    name = request.name.strip()
    if not name:
        raise FieldError("name", "a name is required")
    if len(name) > 128:
        raise FieldError("name", "at most 128 characters")
    if _CONTROL_CHARACTERS.search(name):
        raise FieldError("name", "must not contain control characters such as newlines")
    try:
        config = trainer_config_validate(request.config).to_dict()
    except ConfigError as error:
        raise FieldError(f"config.{error.key}", error.why) from None

    cluster = request.cluster
    partition = Partition.objects.filter(
        cluster=cluster, name=request.partition, gone=False
    ).first()
    if partition is None:
        known = ", ".join(_partition_names(cluster)) or "none synced yet"
        raise FieldError(
            "partition", f"{request.partition!r} is not a partition of {cluster.name} ({known})"
        )
    if request.nodes < 1:
        raise FieldError("nodes", "at least 1")
    if request.tasks_per_node < 1:
        raise FieldError("tasks_per_node", "at least 1")
    if request.cpus_per_task < 1:
        raise FieldError("cpus_per_task", "at least 1")
    if request.gpus_per_node < 0:
        raise FieldError("gpus_per_node", "cannot be negative")
    if request.time_limit_minutes < 1:
        raise FieldError("time_limit_minutes", "at least 1 minute")
    if (
        partition.max_time_minutes is not None
        and request.time_limit_minutes > partition.max_time_minutes
    ):
        raise FieldError(
            "time_limit_minutes",
            f"partition {partition.name} allows at most {partition.max_time_minutes} minutes; "
            f"{request.time_limit_minutes} requested",
        )

    candidates = list(
        Node.objects.filter(cluster=cluster, partitions_text__contains=f",{partition.name},")
        .exclude(state=Node.State.GONE)
        .prefetch_related("gpus")
    )
    if not candidates:
        raise FieldError(
            "partition", f"partition {partition.name} has no nodes (sync the cluster?)"
        )
    if request.nodes > len(candidates):
        raise FieldError(
            "nodes",
            f"partition {partition.name} has {len(candidates)} node"
            f"{'s' if len(candidates) != 1 else ''}; {request.nodes} requested",
        )

    def gpus_of(node: Node) -> list[Gpu]:
        gpus = list(node.gpus.all())
        return [g for g in gpus if g.gpu_type == request.gpu_type] if request.gpu_type else gpus

    if request.gpu_type and not any(gpus_of(node) for node in candidates):
        types = sorted({g.gpu_type for node in candidates for g in node.gpus.all() if g.gpu_type})
        raise FieldError(
            "gpu_type",
            f"partition {partition.name} has no {request.gpu_type!r} GPUs"
            f" ({', '.join(types) or 'no GPUs at all'})",
        )
    if request.gpus_per_node:
        most = max(len(gpus_of(node)) for node in candidates)
        kind = f"{request.gpu_type} " if request.gpu_type else ""
        if request.gpus_per_node > most:
            raise FieldError(
                "gpus_per_node",
                f"no node in partition {partition.name} has more than {most} {kind}GPU"
                f"{'s' if most != 1 else ''}; {request.gpus_per_node} requested",
            )
        enough = [node for node in candidates if len(gpus_of(node)) >= request.gpus_per_node]
        if len(enough) < request.nodes:
            raise FieldError(
                "nodes",
                f"only {len(enough)} node{'s' if len(enough) != 1 else ''} in partition "
                f"{partition.name} have {request.gpus_per_node} {kind}GPUs; "
                f"{request.nodes} requested",
            )
    cpus = request.cpus_per_task * request.tasks_per_node
    most_cpus = max(node.cpus_total for node in candidates)
    if cpus > most_cpus:
        raise FieldError(
            "cpus_per_task",
            f"{request.tasks_per_node} task(s) × {request.cpus_per_task} CPUs = {cpus} CPUs per "
            f"node, but nodes in {partition.name} have at most {most_cpus}",
        )
    if request.memory_mb is not None:
        most_memory = max(node.memory_mb for node in candidates)
        if request.memory_mb > most_memory:
            raise FieldError(
                "memory_mb",
                f"nodes in {partition.name} have at most {most_memory} MB; "
                f"{request.memory_mb} MB requested",
            )
    if request.nodelist:
        try:
            wanted = expand(request.nodelist)
            slurm_commands.check_hostlist(request.nodelist)
        except ValueError as error:
            raise FieldError("nodelist", f"not a node list expression: {error}") from None
        names = {node.name for node in candidates}
        unknown = [node for node in wanted if node not in names]
        if unknown:
            raise FieldError(
                "nodelist", f"not nodes of partition {partition.name}: {', '.join(unknown)}"
            )
        if len(wanted) > request.nodes:
            raise FieldError(
                "nodelist", f"{len(wanted)} nodes listed but only {request.nodes} requested"
            )
    if request.switches and not re.fullmatch(r"\d+(@\d+)?", request.switches):
        raise FieldError("switches", "use COUNT or COUNT@MINUTES, e.g. 1@10")
    _validate_environment(request.environment)
    return config


def _script_spec(job: Job, *, trainer_dir: str, resume_path: str | None) -> ScriptSpec:
    directory = run_dir(job.cluster.workdir, str(job.id))
    args = ["train", "--config", f"{directory}/config.json", "--run-dir", directory]
    if resume_path:
        args += ["--resume", resume_path]
    return ScriptSpec(
        job_id=str(job.id),
        job_name=job.name,
        run_dir=directory,
        trainer_dir=trainer_dir,
        python=job.cluster.python,
        partition=job.partition,
        nodes=job.nodes,
        tasks_per_node=job.tasks_per_node,
        cpus_per_task=job.cpus_per_task,
        gpus_per_node=job.gpus_per_node,
        gpu_type=job.gpu_type,
        memory_mb=job.memory_mb,
        time_limit_minutes=job.time_limit_minutes,
        nodelist=job.nodelist_requested,
        switches=job.switches_requested,
        trainer_args=tuple(args),
        environment=tuple(sorted((job.environment or {}).items())),
    )


def job_script(job: Job) -> str:
    """The exact script this job runs (the trainer directory depends only on its version)."""
    import trainer
    from jobs.runtime import trainer_dir

    return render_sbatch(
        _script_spec(
            job,
            trainer_dir=trainer_dir(job.cluster.workdir, trainer.source_digest()),
            resume_path=job.resume_from.path if job.resume_from else None,
        )
    )


def _job_from_request(
    request: JobRequest, *, owner: Any, config: dict[str, Any], job_id: uuid.UUID | None
) -> Job:
    return Job(
        id=job_id or uuid.uuid4(),
        owner=owner,
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
        switches_requested=request.switches,
        environment=_validate_environment(request.environment),
        total_steps=config.get("steps"),
    )


def job_preview(
    *, user: Any, request: JobRequest, job_id: uuid.UUID | None = None
) -> tuple[Job, str]:
    """Validate and render the sbatch script without saving anything."""
    if not is_researcher(user):
        raise PermissionDenied("You need the researcher or operator role to submit jobs.")
    config = job_request_validate(request)
    job = _job_from_request(request, owner=user, config=config, job_id=job_id)
    return job, job_script(job)


def job_submit(
    *,
    user: Any,
    request: JobRequest,
    job_id: uuid.UUID | None = None,
    parent: Job | None = None,
    resume_from: Checkpoint | None = None,
) -> Job:
    """Validate, save the job as ``queued`` and hand it to the submit task after commit."""
    if not is_researcher(user):
        raise PermissionDenied("You need the researcher or operator role to submit jobs.")
    config = job_request_validate(request)
    if job_id is not None and Job.objects.filter(id=job_id).exists():
        raise FieldError("id", "a job with this id exists already")
    job = _job_from_request(request, owner=user, config=config, job_id=job_id)
    job.parent = parent
    job.resume_from = resume_from
    with transaction.atomic():
        job.save(force_insert=True)
        JobEvent.objects.create(
            job=job, kind="state", to_state=Job.State.QUEUED, message="submitted"
        )
        audit_event_record(
            actor=user,
            action="job.resume" if resume_from else "job.submit",
            target=job,
            details={"cluster": job.cluster.name, "partition": job.partition},
        )
        job_id_value = str(job.id)
        transaction.on_commit(lambda: _enqueue_submit(job_id_value))
    return job


def _enqueue_submit(job_id: str) -> None:
    from jobs.tasks import job_submit_task

    try:
        job_submit_task.delay(job_id)
    except Exception:  # Redis down: the reconcile loop re-enqueues queued jobs.
        logger.warning("could not enqueue the submit of job %s; the watcher will", job_id)


# ---------------------------------------------------------------- submission


def _event(
    job: Job | str, kind: str, from_state: str = "", to_state: str = "", message: str = ""
) -> None:
    job_id = job.id if isinstance(job, Job) else job
    JobEvent.objects.create(
        job_id=job_id, kind=kind, from_state=from_state, to_state=to_state, message=message[:4000]
    )


def _transition(job: Job, to_state: str, *, message: str = "", **values: Any) -> bool:
    """Move ``job`` from the state it was read in to ``to_state``; False if someone else did."""
    # Nothing got updated: another worker got there first.
    if not Job.objects.filter(id=job.id, state=job.state).update(state=to_state, **values):
        return False
    _event(job, "state", job.state, to_state, message)
    job.state = to_state
    for key, value in values.items():
        setattr(job, key, value)
    return True


def job_submit_to_slurm(*, job_id: str) -> str:
    """Put a queued job into Slurm exactly once; returns what happened, in words.

    Accepts ``queued`` (and ``submitting`` whose lease ran out: a worker died mid-way).
    Safe to re-run: before any ``sbatch`` it looks the job's tag up in squeue and sacct
    and adopts a Slurm job it finds, so a redelivered task never submits twice.
    Transient SSH errors propagate (the task retries); Slurm refusing the job fails it.
    """
    return submit_exactly_once(Job, job_id, _job_submit_claimed)


def submit_exactly_once(model: Any, object_id: str, submit: Any) -> str:
    """Claim a queued job or drill for submission, then run ``submit(object_id)``.

    The claim is a conditional update: ``queued``, or ``submitting`` whose lease ran out
    (the worker that held it died), becomes ``submitting`` with a fresh lease. A transient
    error gives the lease back at once, so the task's own retry can claim it again.
    """
    now = timezone.now()
    claimed = (
        model.objects.filter(id=object_id)
        .filter(
            Q(state=model.State.QUEUED)
            | Q(state=model.State.SUBMITTING, submit_lease_until__lt=now)
            | Q(state=model.State.SUBMITTING, submit_lease_until__isnull=True)
        )
        .update(
            state=model.State.SUBMITTING,
            submit_lease_until=now + timedelta(seconds=settings.SUBMIT_LEASE_SECONDS),
            submit_attempts=F("submit_attempts") + 1,
        )
    )
    if not claimed:
        return "not claimable (already submitted, being submitted, or ended)"
    try:
        return str(submit(object_id))
    except slurm_errors.SlurmError as error:
        if error.transient:
            model.objects.filter(id=object_id, state=model.State.SUBMITTING).update(
                submit_lease_until=None
            )
        raise


def _job_submit_claimed(job_id: str) -> str:
    faultpoint("job_submit.after_claim")
    job = Job.objects.select_related("cluster", "resume_from").get(id=job_id)
    if job.submit_attempts == 1:
        _event(job, "state", Job.State.QUEUED, Job.State.SUBMITTING)
    else:
        _event(job, "submit_attempt", message=f"attempt {job.submit_attempts}")
    cluster = job.cluster
    client = slurm_client_for(cluster)
    tag = slurm_commands.job_tag(job.id)

    existing = client.find_jobs_by_tag(tag, since=job.created_at - timedelta(minutes=5))
    if existing:
        found = existing[0]
        if len(existing) > 1:
            logger.error("job %s has %d Slurm jobs: %s", job.id, len(existing), existing)
        _adopt(job, found, message=f"found Slurm job {found.job_id} by its tag; adopted it")
        return f"adopted Slurm job {found.job_id}"

    transport = transport_for(cluster)
    directory = run_dir(cluster.workdir, str(job.id))
    trainer_path = trainer_ensure_uploaded(transport, cluster.workdir)
    transport.makedirs(directory)
    transport.put_bytes(f"{directory}/config.json", json.dumps(job.config, indent=2).encode())
    resume_path = job.resume_from.path if job.resume_from else None
    script = render_sbatch(_script_spec(job, trainer_dir=trainer_path, resume_path=resume_path))
    transport.put_bytes(f"{directory}/job.sbatch", script.encode(), mode=0o755)
    faultpoint("job_submit.before_sbatch")
    try:
        slurm_id = client.submit(f"{directory}/job.sbatch", tag=tag)
    except slurm_errors.SlurmCommandError as error:
        if error.transient:
            raise
        job.state = Job.State.SUBMITTING
        _transition(
            job,
            Job.State.FAILED,
            message=f"Slurm refused the job: {error.stderr.strip() or error}",
            state_reason=f"Slurm refused the job: {(error.stderr.strip() or str(error))[:480]}",
            ended_at=timezone.now(),
            files_final=True,
            submit_lease_until=None,
        )
        return "refused by Slurm"
    # The window a redelivery must cover: Slurm has the job, the database does not yet.
    faultpoint("job_submit.after_sbatch")
    job.state = Job.State.SUBMITTING
    if not _transition(
        job,
        Job.State.PENDING,
        message=f"sbatch accepted it as Slurm job {slurm_id}",
        slurm_job_id=slurm_id,
        submitted_at=timezone.now(),
        last_seen_in_slurm_at=timezone.now(),
        submit_lease_until=None,
    ):
        # Cancelled while we submitted: do not leave a Slurm job nobody tracks.
        _request_reconcile(job.cluster_id)
        current = Job.objects.get(id=job.id)
        if current.state == Job.State.CANCELLED:
            client.cancel(slurm_id)
            Job.objects.filter(id=job.id).update(slurm_job_id=slurm_id)
            _event(job, "cancel", message=f"cancelled Slurm job {slurm_id} submitted meanwhile")
    # Look at it soon, whatever the watcher's idle back-off was.
    _request_reconcile(job.cluster_id)
    return f"submitted as Slurm job {slurm_id}"


def _adopt(job: Job, found: SlurmJob, *, message: str) -> None:
    state = gantry_state(found.state) or Job.State.PENDING
    values: dict[str, Any] = {
        "slurm_job_id": found.job_id,
        "submitted_at": found.submit_time or timezone.now(),
        "last_seen_in_slurm_at": timezone.now(),
        "submit_lease_until": None,
    }
    job.state = Job.State.SUBMITTING
    if state in Job.FINAL_STATES:
        # Leave final states to the watcher, which reads exit codes from accounting.
        state = Job.State.PENDING
    if not _transition(job, state, message=message, **values):
        current = Job.objects.get(id=job.id)
        if current.state == Job.State.CANCELLED:
            slurm_client_for(current.cluster).cancel(found.job_id)
            Job.objects.filter(id=job.id).update(slurm_job_id=found.job_id)


def job_submit_gave_up(*, job_id: str, error: BaseException) -> None:
    """Retries ran out on a transient error: back to ``queued``, visibly, not failed.

    The cluster may only be down for a while; the watcher re-enqueues queued jobs.
    """
    reason = f"waiting for the cluster: {describe_cluster_error(error)}"
    job = Job.objects.filter(id=job_id, state=Job.State.SUBMITTING).first()
    if job is not None:
        _transition(
            job,
            Job.State.QUEUED,
            message=reason,
            state_reason=reason[:512],
            submit_lease_until=None,
        )


# ---------------------------------------------------------------- cancel and resume


def _check_can_act(actor: Any, job: Job) -> None:
    if not (
        is_operator(actor) or (getattr(actor, "pk", None) == job.owner_id and is_researcher(actor))
    ):
        raise PermissionDenied("Only the job's owner or an operator may do this.")


def job_cancel(*, actor: Any, job: Job) -> str:
    """Cancel a job; idempotent. Accepts any state; a final job is left as it is."""
    _check_can_act(actor, job)
    if job.is_final:
        return f"already {job.state}"
    job.refresh_from_db()
    if (
        job.state in (Job.State.QUEUED, Job.State.SUBMITTING, Job.State.DRAFT)
        and not job.slurm_job_id
    ):
        with transaction.atomic():
            if _transition(
                job,
                Job.State.CANCELLED,
                message=f"cancelled by {actor.get_username()} before reaching Slurm",
                ended_at=timezone.now(),
                files_final=True,
            ):
                audit_event_record(actor=actor, action="job.cancel", target=job)
                return "cancelled"
        job.refresh_from_db()
        if job.is_final:
            return f"already {job.state}"
    if not job.slurm_job_id:
        raise ConflictError("The job is being submitted right now; try again in a moment.")
    try:
        slurm_client_for(job.cluster).cancel(job.slurm_job_id)
    except slurm_errors.SlurmError as error:
        raise ApplicationError(
            f"Could not cancel: {describe_cluster_error(error)}",
            status_code=503 if error.transient else 502,
        ) from None
    with transaction.atomic():
        Job.objects.filter(id=job.id).update(
            state_reason=f"cancel requested by {actor.get_username()}"
        )
        _event(job, "cancel", message=f"scancel {job.slurm_job_id} by {actor.get_username()}")
        audit_event_record(
            actor=actor, action="job.cancel", target=job, details={"slurm_job_id": job.slurm_job_id}
        )
    _request_reconcile(job.cluster_id)
    return "cancel requested"


def _request_reconcile(cluster_id: int) -> None:
    Cluster.objects.filter(pk=cluster_id).update(next_reconcile_at=timezone.now())


def job_resume(
    *,
    actor: Any,
    checkpoint: Checkpoint,
    name: str | None = None,
    steps: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> Job:
    """A new job that continues from ``checkpoint`` (the trainer's ``--resume``), linked to
    its parent. Refused when the checkpoint failed its integrity check."""
    parent = checkpoint.job
    _check_can_act(actor, parent)
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
    }
    values.update(overrides or {})
    request = JobRequest(
        cluster=parent.cluster,
        name=name or f"{parent.name} (resumed @{checkpoint.step})",
        config=config,
        **values,
    )
    return job_submit(user=actor, request=request, parent=parent, resume_from=checkpoint)


# ---------------------------------------------------------------- watching


@dataclass
class ReconcileResult:
    commands: int = 0
    sftp_reads: int = 0
    bytes_read: int = 0
    state_changes: int = 0
    metric_points: int = 0
    checkpoints: int = 0
    requeued: int = 0
    errors: list[str] = field(default_factory=list)


def _final_values(slurm_job: SlurmJob) -> dict[str, Any]:
    values: dict[str, Any] = {
        "ended_at": slurm_job.end_time or timezone.now(),
        "exit_code": slurm_job.exit_code,
        "submit_lease_until": None,
    }
    if slurm_job.start_time:
        values["started_at"] = slurm_job.start_time
    if slurm_job.node_list_expr and slurm_job.node_list_expr not in ("None assigned", "(null)"):
        values["allocated_nodes"] = slurm_job.node_list_expr[:1024]
    reason = slurm_job.reason or ""
    if slurm_job.state.upper() == "OUT_OF_MEMORY":
        reason = "out of memory"
    elif slurm_job.state.upper() == "PREEMPTED":
        reason = "preempted"
    if slurm_job.signal:
        reason = f"{reason} (signal {slurm_job.signal})".strip()
    if reason and reason.lower() != "none":
        values["state_reason"] = reason[:512]
    return values


def _apply_slurm_view(
    job: Job, slurm_job: SlurmJob, result: ReconcileResult, *, final_from_accounting: bool
) -> None:
    new_state = gantry_state(slurm_job.state)
    # (last_seen_in_slurm_at is set for all seen jobs at once by the caller.)
    if new_state is None:
        return
    if new_state in Job.FINAL_STATES and not final_from_accounting:
        # squeue's view of a finished job lacks the true exit code: wait for sacct.
        return
    values: dict[str, Any] = {}
    if new_state in Job.FINAL_STATES:
        values.update(_final_values(slurm_job))
    else:
        if slurm_job.start_time and job.started_at is None and new_state != Job.State.PENDING:
            values["started_at"] = slurm_job.start_time
        expression = slurm_job.node_list_expr
        if (
            expression
            and expression not in ("None assigned", "(null)")
            and expression != job.allocated_nodes
        ):
            values["allocated_nodes"] = expression[:1024]
        reason = "" if (slurm_job.reason or "").lower() == "none" else (slurm_job.reason or "")
        if new_state == Job.State.PENDING and reason != job.state_reason:
            values["state_reason"] = reason[:512]
    if new_state != job.state:
        message = values.get("state_reason", "") or ""
        if new_state in Job.FINAL_STATES and values.get("exit_code") is not None:
            message = f"exit code {values['exit_code']}" + (f"; {message}" if message else "")
        if _transition(job, new_state, message=message, **values):
            result.state_changes += 1
    elif values:
        Job.objects.filter(id=job.id, state=job.state).update(**values)
        if values.get("state_reason"):
            _event(job, "reason", job.state, job.state, values["state_reason"])


_FILES_SCRIPT_ENTRY = (
    'd={dir}; printf "D %s\\n" "$d"; '
    'if [ -f "$d/metrics.jsonl" ]; then printf "M %s\\n" "$(stat -c %s "$d/metrics.jsonl")"; fi; '
    'if [ -f "$d/acceptance.json" ]; then echo A; fi; '
    'for m in "$d"/checkpoints/step-*/manifest.json; do '
    'if [ -f "$m" ]; then printf "C %s\\n" "$m"; fi; done; '
)


@dataclass
class RunFiles:
    metrics_size: int | None = None
    acceptance: bool = False
    manifests: list[str] = field(default_factory=list)


def _scan_run_dirs(transport: Any, directories: list[str]) -> dict[str, RunFiles]:
    """One remote command for all run directories: metrics size, acceptance, manifests."""
    import shlex

    script = "".join(_FILES_SCRIPT_ENTRY.format(dir=shlex.quote(d)) for d in directories)
    output = transport.exec_shell(script + "true").stdout
    found: dict[str, RunFiles] = {}
    current: RunFiles | None = None
    for line in output.splitlines():
        kind, _, value = line.partition(" ")
        if kind == "D":
            current = found.setdefault(value, RunFiles())
        elif current is None:
            continue
        elif kind == "M" and value.strip().isdigit():
            current.metrics_size = int(value)
        elif kind == "A":
            current.acceptance = True
        elif kind == "C":
            current.manifests.append(value)
    return found


def metrics_ingest(*, job: Job, data: bytes, start_offset: int) -> tuple[int, int]:
    """Store the complete lines of ``data`` (read from ``start_offset``); returns
    (points stored, new offset). A partial last line waits for the next read."""
    end = data.rfind(b"\n")
    if end < 0:
        return 0, start_offset
    complete = data[: end + 1]
    from django.db import connection

    # Rows in the database's own types, built straight from the lines: model objects and
    # per-value field preparation cost more than the parsing itself.
    job_key = MetricPoint._meta.get_field("job").get_db_prep_value(job.id, connection)
    adapt_time = connection.ops.adapt_datetimefield_value
    points: dict[int, tuple[Any, ...]] = {}
    events: list[dict[str, Any]] = []
    for raw in complete.splitlines():
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            logger.warning("job %s: unreadable metrics line skipped: %r", job.id, raw[:200])
            continue
        if not isinstance(line, dict):
            continue
        if "event" in line:
            events.append(line)
            continue
        try:
            step = int(line["step"])
            wall = datetime.fromtimestamp(float(line["time"]), tz=UTC)
        except (KeyError, TypeError, ValueError):
            continue
        get = line.get
        values = [get(key) for key in _METRIC_LINE_KEYS]
        world_size = get("world_size")
        points[step] = (
            job_key,
            step,
            adapt_time(wall),
            *(float(v) if isinstance(v, int | float) else None for v in values),
            world_size if isinstance(world_size, int) else None,
        )
    new_offset = start_offset + len(complete)
    with transaction.atomic():
        # Conditional on the offset we read from: a racing watcher cannot double-store.
        updates: dict[str, Any] = {"metrics_offset": new_offset}
        if points:
            updates["last_step"] = max(points)
            # samples_per_s is the 6th column of a row.
            newest = [points[step][5] for step in sorted(points)[-5:]]
            rates = [rate for rate in newest if rate is not None]
            if rates:
                updates["throughput_now"] = sum(rates) / len(rates)
        for event in events:
            kind = event.get("event")
            if kind == "start":
                if isinstance(event.get("optimal_loss"), int | float):
                    updates["optimal_loss"] = float(event["optimal_loss"])
                if isinstance(event.get("target_loss"), int | float):
                    updates["target_loss"] = float(event["target_loss"])
            elif kind == "target_reached" and job.target_reached_step is None:
                updates["target_reached_step"] = event.get("step")
                updates["target_reached_elapsed_s"] = event.get("elapsed")
        if not Job.objects.filter(id=job.id, metrics_offset=start_offset).update(**updates):
            return 0, start_offset
        if points:
            _metric_points_upsert(list(points.values()))
        for event in events:
            kind = str(event.get("event"))
            if kind in {"target_reached", "done", "resumed", "checkpoint_failed"}:
                _event(job, kind, message=_describe_trainer_event(event))
    job.metrics_offset = new_offset
    return len(points), new_offset


# The trainer's keys for the float columns between wall_time and world_size, in order.
_METRIC_LINE_KEYS = (
    "elapsed",
    "loss",
    "samples_per_s",
    "tokens_per_s",
    "step_time",
    "data_time",
    "checkpoint_blocking_time",
)
_METRIC_COLUMNS = (
    "job_id",
    "step",
    "wall_time",
    "elapsed_s",
    "loss",
    "samples_per_s",
    "tokens_per_s",
    "step_time_s",
    "data_time_s",
    "checkpoint_blocking_s",
    "world_size",
)


def _metric_points_upsert(rows: list[tuple[Any, ...]]) -> None:
    """Insert metric points, the last line for a step winning: one prepared statement run
    with executemany (the ORM's bulk_create spends most of its time building SQL)."""
    from django.db import connection

    table = MetricPoint._meta.db_table
    quote = connection.ops.quote_name
    columns = ", ".join(quote(column) for column in _METRIC_COLUMNS)
    updates = ", ".join(
        f"{quote(column)} = excluded.{quote(column)}" for column in _METRIC_COLUMNS[2:]
    )
    row_marks = "(" + ", ".join(["%s"] * len(_METRIC_COLUMNS)) + ")"
    conflict = f"ON CONFLICT ({quote('job_id')}, {quote('step')}) DO UPDATE SET {updates}"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # One statement per 1000 rows: executemany would be a round trip per row.
            for start in range(0, len(rows), 1000):
                chunk = rows[start : start + 1000]
                sql = (
                    f"INSERT INTO {quote(table)} ({columns}) VALUES "  # noqa: S608 - fixed names
                    + ", ".join([row_marks] * len(chunk))
                    + f" {conflict}"
                )
                cursor.execute(sql, [value for row in chunk for value in row])
        else:
            sql = f"INSERT INTO {quote(table)} ({columns}) VALUES {row_marks} {conflict}"  # noqa: S608
            for start in range(0, len(rows), 5000):
                cursor.executemany(sql, rows[start : start + 5000])


def _describe_trainer_event(event: dict[str, Any]) -> str:
    kind = event.get("event")
    if kind == "target_reached":
        return (
            f"quality target reached at step {event.get('step')} after "
            f"{float(event.get('elapsed') or 0):.1f} s (window mean loss "
            f"{event.get('window_mean_loss')}, target {event.get('target_loss')})"
        )
    if kind == "done":
        return (
            f"training finished at step {event.get('step')}: final loss {event.get('final_loss')}, "
            f"optimum {event.get('optimal_loss')}"
        )
    if kind == "resumed":
        return f"resumed from {event.get('from')} at step {event.get('step')}"
    if kind == "checkpoint_failed":
        return f"checkpoint failed: {event.get('error')}"
    return json.dumps(event)[:500]


def checkpoint_register(
    *, job: Job, manifest_path: str, manifest: dict[str, Any]
) -> Checkpoint | None:
    """Register a checkpoint once, from its manifest (written last by the trainer)."""
    try:
        step = int(manifest["step"])
        files = list(manifest.get("files") or [])
    except (KeyError, TypeError, ValueError):
        logger.warning("job %s: unreadable manifest %s", job.id, manifest_path)
        return None
    size = manifest.get("total_bytes")
    if not isinstance(size, int):
        size = sum(int(f.get("size") or 0) for f in files if isinstance(f, dict))
    created = manifest.get("created")
    saved_at = None
    if isinstance(created, int | float):
        saved_at = datetime.fromtimestamp(float(created), tz=UTC)
    elif isinstance(created, str):
        try:
            saved_at = datetime.fromisoformat(created.replace("Z", "+00:00"))
        except ValueError:
            saved_at = None
    checkpoint, created_now = Checkpoint.objects.get_or_create(
        job=job,
        step=step,
        defaults={
            "path": manifest_path.rsplit("/", 1)[0],
            "size_bytes": size,
            "file_count": len(files),
            "state_keys": list(manifest.get("state_keys") or []),
            "world_size": manifest.get("world_size"),
            "manifest": manifest,
            "saved_at": saved_at,
        },
    )
    if created_now:
        _event(
            job,
            "checkpoint",
            message=f"checkpoint at step {step} registered ({size} bytes, {len(files)} files)",
        )
        return checkpoint
    return None


def _read_run_files(
    job: Job, files: RunFiles, transport: Any, result: ReconcileResult, known_steps: set[str]
) -> None:
    directory = run_dir(job.cluster.workdir, str(job.id))
    if files.metrics_size is not None and files.metrics_size > job.metrics_offset:
        wanted = files.metrics_size - job.metrics_offset
        offset = job.metrics_offset
        while wanted > 0:
            chunk = transport.read_from(f"{directory}/metrics.jsonl", offset, min(wanted, 8 << 20))
            result.sftp_reads += 1
            result.bytes_read += len(chunk)
            if not chunk:
                break
            stored, new_offset = metrics_ingest(job=job, data=chunk, start_offset=offset)
            result.metric_points += stored
            if new_offset == offset:
                break
            wanted -= new_offset - offset
            offset = new_offset
    if files.acceptance and job.acceptance is None:
        try:
            acceptance = json.loads(transport.get_bytes(f"{directory}/acceptance.json"))
            result.sftp_reads += 1
            Job.objects.filter(id=job.id, acceptance__isnull=True).update(acceptance=acceptance)
        except (ValueError, slurm_errors.RemoteFileNotFound):
            pass
    present = {path.rsplit("/", 2)[-2] for path in files.manifests}
    for step_name in sorted(known_steps - present):
        # The trainer's retention (checkpoint_keep) deleted it: keep the row, say so.
        step_number = int(step_name.split("-")[1])
        Checkpoint.objects.filter(job=job, step=step_number, deleted_at__isnull=True).update(
            deleted_at=timezone.now()
        )
    for manifest_path in files.manifests:
        step_dir = manifest_path.rsplit("/", 2)[-2]
        if step_dir in known_steps:
            continue
        try:
            manifest = json.loads(transport.get_bytes(manifest_path))
        except (ValueError, slurm_errors.RemoteFileNotFound):
            continue
        result.sftp_reads += 1
        if checkpoint_register(job=job, manifest_path=manifest_path, manifest=manifest):
            result.checkpoints += 1


def cluster_reconcile(*, cluster_id: int) -> ReconcileResult:
    """One watcher cycle for a cluster: one squeue for all active jobs and drills, at most
    one sacct for those that left the queue (or finished), one command that lists every
    watched run directory's files; then SFTP reads of only the new bytes.

    Cost in remote commands does not grow with the number of jobs. Safe to re-run
    anytime: every change is a conditional update on the state it was read in.
    """
    from jobs.drills import drills_reconcile_states
    from jobs.models import RestoreDrill

    cluster = Cluster.objects.get(pk=cluster_id)
    result = ReconcileResult()
    now = timezone.now()
    _requeue_stalled_submits(cluster, result, now)
    active = list(
        Job.objects.filter(cluster=cluster, state__in=Job.SLURM_ACTIVE_STATES)
        .exclude(slurm_job_id="")
        .select_related("cluster")
    )
    drills = list(
        RestoreDrill.objects.filter(cluster=cluster, state__in=RestoreDrill.SLURM_ACTIVE_STATES)
        .exclude(slurm_job_id="")
        .select_related("checkpoint__job__cluster")
    )
    watch_files = list(
        Job.objects.filter(cluster=cluster, files_final=False)
        .filter(
            Q(state__in=[Job.State.RUNNING, Job.State.COMPLETING]) | Q(state__in=Job.FINAL_STATES)
        )
        .exclude(slurm_job_id="")
        .select_related("cluster")
    )
    if not active and not watch_files and not drills:
        _reconcile_done(cluster, result, now)
        return result
    client = slurm_client_for(cluster)
    transport = transport_for(cluster)
    commands_before = transport.commands_run
    try:
        if active or drills:
            ids = [job.slurm_job_id for job in active] + [drill.slurm_job_id for drill in drills]
            queue = client.jobs_in_queue(ids)
            seen_ids = [job.id for job in active if job.slurm_job_id in queue]
            need_accounting = []
            for job in active:
                seen = queue.get(job.slurm_job_id)
                if seen is None or (gantry_state(seen.state) in Job.FINAL_STATES):
                    need_accounting.append(job.slurm_job_id)
                else:
                    _apply_slurm_view(job, seen, result, final_from_accounting=False)
            for drill in drills:
                seen = queue.get(drill.slurm_job_id)
                if seen is None or (gantry_state(seen.state) in Job.FINAL_STATES):
                    need_accounting.append(drill.slurm_job_id)
            accounted: dict[str, SlurmJob] = {}
            if need_accounting:
                starts = [job.submitted_at or job.created_at for job in active] + [
                    drill.submitted_at or drill.created_at for drill in drills
                ]
                accounted = client.jobs_accounting(
                    need_accounting, start=min(starts) - timedelta(hours=1)
                )
                for job in active:
                    if job.slurm_job_id not in need_accounting:
                        continue
                    record = accounted.get(job.slurm_job_id)
                    if record is not None:
                        seen_ids.append(job.id)
                        _apply_slurm_view(job, record, result, final_from_accounting=True)
                    elif job.slurm_job_id not in queue:
                        _maybe_lost(job, result, now)
                    # else: final in squeue but not yet in sacct (it lags): next cycle.
            # One write for every job Slurm still knows, not one per job.
            Job.objects.filter(id__in=seen_ids).update(last_seen_in_slurm_at=now)
            if drills:
                result.state_changes += drills_reconcile_states(
                    drills=drills, queue=queue, accounted=accounted, transport=transport
                )
            # Jobs that just ended get their files read in this same cycle.
            watch_ids = {job.id for job in watch_files}
            # The in-memory state is the one this cycle applied (transitions update it).
            for job in active:
                if (
                    job.id not in watch_ids
                    and (job.state in (Job.State.RUNNING, Job.State.COMPLETING) or job.is_final)
                    and not job.files_final
                ):
                    watch_files.append(job)
        if watch_files:
            directories = [run_dir(cluster.workdir, str(job.id)) for job in watch_files]
            scanned = _scan_run_dirs(transport, directories)
            known: dict[Any, set[str]] = {job.id: set() for job in watch_files}
            for job_id, step in Checkpoint.objects.filter(job__in=watch_files).values_list(
                "job_id", "step"
            ):
                known[job_id].add(f"step-{step:06d}")
            fresh = Job.objects.select_related("cluster").in_bulk([job.id for job in watch_files])
            for job, directory in zip(watch_files, directories, strict=True):
                job = fresh.get(job.id, job)
                files = scanned.get(directory, RunFiles())
                _read_run_files(job, files, transport, result, known[job.id])
                if job.is_final:
                    Job.objects.filter(id=job.id).update(files_final=True)
    except slurm_errors.SlurmError as error:
        result.errors.append(describe_cluster_error(error))
        Cluster.objects.filter(pk=cluster.pk).update(
            last_reconcile_error=describe_cluster_error(error)[:2000],
            last_reconcile_at=now,
            next_reconcile_at=now
            + timedelta(seconds=min(60, settings.RECONCILE_INTERVAL_SECONDS * 4)),
        )
        result.commands = transport.commands_run - commands_before
        return result
    result.commands = transport.commands_run - commands_before
    _reconcile_done(cluster, result, now)
    return result


def _maybe_lost(job: Job, result: ReconcileResult, now: datetime) -> None:
    last_seen = job.last_seen_in_slurm_at or job.submitted_at or job.created_at
    if now - last_seen < timedelta(seconds=settings.JOB_LOST_AFTER_SECONDS):
        return
    message = (
        f"Slurm has no record of job {job.slurm_job_id} in squeue or sacct for "
        f"{int((now - last_seen).total_seconds())} s"
    )
    if _transition(job, Job.State.LOST, message=message, state_reason=message[:512], ended_at=now):
        result.state_changes += 1


def _requeue_stalled_submits(cluster: Cluster, result: ReconcileResult, now: datetime) -> None:
    """Queued jobs whose submit task was lost (Redis restarted, worker killed) go again."""
    stale = now - timedelta(seconds=settings.SUBMIT_REQUEUE_AFTER_SECONDS)
    stalled = Job.objects.filter(cluster=cluster).filter(
        Q(state=Job.State.QUEUED, updated_at__lt=stale)
        | Q(state=Job.State.SUBMITTING, submit_lease_until__lt=now)
    )
    for job_id in stalled.values_list("id", flat=True)[:100]:
        # Touch it so it is not requeued again next cycle while the task is on its way.
        Job.objects.filter(id=job_id).update(updated_at=now)
        _enqueue_submit(str(job_id))
        result.requeued += 1
    from jobs.drills import _enqueue_drill_submit
    from jobs.models import RestoreDrill

    stalled_drills = RestoreDrill.objects.filter(cluster=cluster).filter(
        Q(state=RestoreDrill.State.QUEUED, updated_at__lt=stale)
        | Q(state=RestoreDrill.State.SUBMITTING, submit_lease_until__lt=now)
    )
    for drill_id in stalled_drills.values_list("id", flat=True)[:100]:
        RestoreDrill.objects.filter(id=drill_id).update(updated_at=now)
        _enqueue_drill_submit(str(drill_id))
        result.requeued += 1


def _reconcile_done(cluster: Cluster, result: ReconcileResult, now: datetime) -> None:
    changed = bool(result.state_changes or result.metric_points or result.checkpoints)
    idle = 0 if changed else cluster.reconcile_idle_cycles + 1
    interval = settings.RECONCILE_INTERVAL_SECONDS
    from jobs.models import RestoreDrill

    has_work = (
        Job.objects.filter(cluster=cluster).exclude(state__in=Job.FINAL_STATES).exists()
        or Job.objects.filter(cluster=cluster, files_final=False).exists()
        or RestoreDrill.objects.filter(
            cluster=cluster, state__in=RestoreDrill.ACTIVE_STATES
        ).exists()
    )
    # Back off while nothing changes; with nothing to watch, look rarely.
    wait = interval * min(2 ** min(idle, 3), 4) if has_work else max(30, interval)
    Cluster.objects.filter(pk=cluster.pk).update(
        reconcile_idle_cycles=idle,
        last_reconcile_at=now,
        last_reconcile_error="",
        next_reconcile_at=now + timedelta(seconds=wait),
    )


def job_log_tail(*, job: Job, max_bytes: int = 64 * 1024) -> dict[str, Any]:
    """The end of the job's Slurm output file, read over SFTP on demand."""
    if not job.slurm_job_id:
        return {"text": "", "size": 0, "truncated": False, "path": None}
    path = f"{run_dir(job.cluster.workdir, str(job.id))}/slurm-{job.slurm_job_id}.out"
    transport = transport_for(job.cluster)
    try:
        stat = transport.stat(path)
        if stat is None:
            return {"text": "", "size": 0, "truncated": False, "path": path}
        start = max(0, stat.size - max_bytes)
        data = transport.read_from(path, start, max_bytes)
    except slurm_errors.SlurmError as error:
        raise ApplicationError(
            f"Could not read the log: {describe_cluster_error(error)}",
            status_code=503 if error.transient else 502,
        ) from None
    text = data.decode("utf-8", errors="replace")
    if start > 0 and "\n" in text:
        text = text.split("\n", 1)[1]
    return {"text": text, "size": stat.size, "truncated": start > 0, "path": path}
