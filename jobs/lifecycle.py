"""What is particular to jobs in the Slurm lifecycle (``runs.lifecycle``): the run directory
and script, the timeline, and what refusal, loss and the end of the Slurm job mean."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from controlplane.tasknames import JOB_SUBMIT
from jobs.models import Job, JobEvent
from jobs.script import job_script_spec
from nodes.access.cluster import transport_for
from runs.events import RunEventKind
from runs.lifecycle import SlurmLifecycle, WontSubmit, slurm_phase
from runs.runtime import (
    EnvironmentRefused,
    UserAreaError,
    render_sbatch,
    run_dir,
    service_read_grant,
    trainer_ensure_uploaded,
    user_area_ensure,
)
from runs.trainers import archive_current
from slurm.parsers import SlurmJob
from slurm.transport import SshTransport
from trainer.schema import Reason

_NO_NODES = ("None assigned", "(null)")
_FOLDED_STATE_REASONS = {
    "OUT_OF_MEMORY": "out of memory",
    "PREEMPTED": "preempted",
    "BOOT_FAIL": "boot failure",
    "DEADLINE": "deadline reached",
}


def job_event(
    job: Job | str, kind: str, from_state: str = "", to_state: str = "", message: str = ""
) -> None:
    """One entry on a job's timeline. ``kind`` is one of ``JobEvent.Kind``: anything else
    is a programming error, refused here rather than stored as a kind no page knows."""
    if kind not in JobEvent.Kind.values:
        raise ValueError(f"not a job event kind: {kind!r}")
    job_id = job.id if isinstance(job, Job) else job
    JobEvent.objects.create(
        job_id=job_id, kind=kind, from_state=from_state, to_state=to_state, message=message[:4000]
    )


def final_values(slurm_job: SlurmJob) -> dict[str, Any]:
    """What accounting says of a job that ended: times, exit code, nodes, why."""
    values: dict[str, Any] = {
        "ended_at": slurm_job.end_time or timezone.now(),
        "exit_code": slurm_job.exit_code,
        "submit_lease_until": None,
    }
    if slurm_job.start_time:
        values["started_at"] = slurm_job.start_time
    if slurm_job.node_list_expr and slurm_job.node_list_expr not in _NO_NODES:
        values["allocated_nodes"] = slurm_job.node_list_expr[:1024]
    reason = slurm_job.reason or ""
    # Slurm states Gantry's own states fold into (``runs.lifecycle.phases``), kept in the
    # reason: recovery reads them (a preemption names no node, a boot failure its nodes).
    folded = _FOLDED_STATE_REASONS.get(slurm_job.state.upper())
    if folded:
        reason = folded
    if slurm_job.signal:
        reason = f"{reason} (signal {slurm_job.signal})".strip()
    if reason and reason.lower() != "none":
        values["state_reason"] = reason[:512]
    return values


class JobLifecycle(SlurmLifecycle[Job]):
    model = Job
    noun = "job"
    submit_task = JOB_SUBMIT
    faultpoint_prefix = "job_submit"

    def for_submit(self) -> QuerySet[Job]:
        return Job.objects.select_related("cluster", "resume_from")

    def run_directory(self, obj: Job) -> str:
        return run_dir(obj.cluster.workdir, str(obj.id), obj.run_as)

    def run_as(self, obj: Job) -> str:
        return obj.run_as

    def cancel_was_requested(self, obj: Job) -> bool:
        return JobEvent.objects.filter(job_id=obj.id, kind=JobEvent.Kind.CANCEL).exists()

    def record(
        self,
        obj: Job,
        kind: RunEventKind,
        *,
        from_state: str = "",
        to_state: str = "",
        message: str = "",
    ) -> None:
        job_event(obj, kind, from_state, to_state, message)

    def claimed(self, obj: Job) -> None:
        if obj.submit_attempts == 1:
            job_event(obj, JobEvent.Kind.STATE, Job.State.QUEUED, Job.State.SUBMITTING)
        else:
            job_event(obj, JobEvent.Kind.SUBMIT_ATTEMPT, message=f"attempt {obj.submit_attempts}")

    def prepare(self, obj: Job, transport: SshTransport) -> str:
        """``transport``: the job's account. The trainer goes to the shared, content-
        addressed archive as the service account (read-only for users); the run
        directory (0700) and its files are written as the job's account."""
        cluster = obj.cluster
        directory = self.run_directory(obj)
        shared = transport_for(cluster)
        # Keep this trainer version (Gantry's archive and the cluster's copy): drills of
        # the job's checkpoints run the version that wrote them.
        digest = archive_current()
        trainer_path = trainer_ensure_uploaded(shared, cluster.workdir)
        if obj.trainer_digest != digest:
            Job.objects.filter(id=obj.id).update(trainer_digest=digest)
            obj.trainer_digest = digest
        resume_path = obj.resume_from.path if obj.resume_from else None
        spec = job_script_spec(obj, trainer_path=trainer_path, resume_path=resume_path)
        try:
            # The environment policy again, as it stands now: a job queued (or a template
            # saved) before it, or a name the cluster's operator took back, stops here.
            script = render_sbatch(spec)
        except EnvironmentRefused as error:
            raise WontSubmit(error.code, str(error)) from None
        if obj.run_as:
            try:
                area = user_area_ensure(
                    shared, transport, cluster.workdir, obj.run_as, service_account=cluster.ssh_user
                )
            except UserAreaError as error:
                raise WontSubmit(Reason.INFRASTRUCTURE_ERROR, str(error)) from None
        transport.makedirs(directory, mode=0o700)
        if obj.run_as:
            # Made 0700, which voids the area's default ACL for the service account: the
            # watcher reads the run directory in its one batched command (runs.rundir_batch).
            service_read_grant(
                transport, area=area, directory=directory, service_account=cluster.ssh_user
            )
        transport.put_bytes(f"{directory}/config.json", json.dumps(obj.config, indent=2).encode())
        transport.put_bytes(f"{directory}/job.sbatch", script.encode(), mode=0o755)
        return f"{directory}/job.sbatch"

    def refused(self, obj: Job, reason: str) -> None:
        obj.state = Job.State.SUBMITTING
        self.transition(
            obj,
            Job.State.FAILED,
            message=reason,
            state_reason=reason[:512],
            ended_at=timezone.now(),
            files_final=True,
            submit_lease_until=None,
        )

    def gave_up(self, obj: Job, reason: str) -> None:
        # Back to queued, visibly, not failed: the watcher re-enqueues queued jobs.
        text = f"waiting for the cluster: {reason}"
        self.transition(
            obj, Job.State.QUEUED, message=text, state_reason=text[:512], submit_lease_until=None
        )

    def lost(self, obj: Job, message: str, now: datetime) -> bool:
        return self.transition(
            obj, Job.State.LOST, message=message, state_reason=message[:512], ended_at=now
        )

    def observed(self, obj: Job, slurm_job: SlurmJob, to_state: str) -> dict[str, Any]:
        values: dict[str, Any] = {}
        if slurm_job.start_time and obj.started_at is None and to_state != Job.State.PENDING:
            values["started_at"] = slurm_job.start_time
        expression = slurm_job.node_list_expr
        if expression and expression not in _NO_NODES and expression != obj.allocated_nodes:
            values["allocated_nodes"] = expression[:1024]
        reason = "" if (slurm_job.reason or "").lower() == "none" else (slurm_job.reason or "")
        if to_state == Job.State.PENDING and reason != obj.state_reason:
            values["state_reason"] = reason[:512]
        return values

    def finished(self, obj: Job, record: SlurmJob, now: datetime) -> bool:
        phase = slurm_phase(record.state)
        assert phase is not None
        values = final_values(record)
        message = str(values.get("state_reason") or "")
        if values.get("exit_code") is not None:
            message = f"exit code {values['exit_code']}" + (f"; {message}" if message else "")
        return self.transition(obj, phase, message=message, **values)

    def ended_values(self, now: datetime) -> dict[str, Any]:
        return {"ended_at": now, "files_final": True}

    def cancel_requested(self, obj: Job, *, by: str) -> str:
        Job.objects.filter(id=obj.id).update(state_reason=f"cancel requested by {by}")
        job_event(obj, JobEvent.Kind.CANCEL, message=f"scancel {obj.slurm_job_id} by {by}")
        return "cancel requested"


JOBS = JobLifecycle()
