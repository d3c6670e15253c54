"""What is particular to restore drills in the Slurm lifecycle (``runs.lifecycle``): the drill
script, and what refusal, loss and the end of the drill's Slurm job mean (read
``drill.json`` and store the verdict). ``error`` means the drill could not run; it is
never a verdict on the checkpoint."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

import trainer
from controlplane.tasknames import DRILL_SUBMIT
from drills.attestation import (
    VerifierAccessError,
    open_to_verifier,
    unseen_by_verifier,
    verifier_drill_dir,
)
from drills.models import RestoreDrill
from drills.reference import drill_reference, recorded_trainer_digest
from drills.verdicts import (
    Judgement,
    report_evidence,
    report_timings,
    verdict_of_code,
    verdict_of_report,
)
from jobs import checkpoint_state
from nodes.access.cluster import transport_as, transport_for
from runs.lifecycle import Phase, SlurmLifecycle, WontSubmit, slurm_phase
from runs.runtime import (
    EnvironmentRefused,
    ScriptSpec,
    drill_dir,
    render_sbatch,
    service_read_grant,
    user_area,
)
from runs.trainers import TrainerUnavailable, trainer_version_ensure
from slurm import errors as slurm_errors
from slurm.parsers import SlurmJob
from slurm.transport import SshTransport
from trainer.schema import Reason, json_digest

REFERENCE_NAME = "reference.json"


def drill_output_dir(drill: RestoreDrill) -> str:
    """Where the drill writes: a verifier's drill in the verifier's own area (the owner
    cannot write there), a self-attested one in the run directory."""
    job = drill.checkpoint.job
    if drill.is_attested:
        return verifier_drill_dir(job.cluster.workdir, drill.verifier_account, str(drill.id))
    return drill_dir(job.cluster.workdir, str(job.id), str(drill.id), job.run_as)


def drill_script_spec(drill: RestoreDrill, *, trainer_path: str) -> ScriptSpec:
    """The drill's batch script: the trainer version chosen for it, Gantry's reference
    (written next to it), K steps on the drill's allocation; the job's environment only
    for a self-attested drill (nothing the owner sets reaches a verifier's drill)."""
    job = drill.checkpoint.job
    cluster = job.cluster
    out_dir = drill_output_dir(drill)
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
        time_limit_minutes=drill.time_limit_minutes,
        nodelist="",
        switches="",
        # Recovery's proving drill leaves out the incident's suspects.
        exclude=str(allocation.get("exclude") or ""),
        trainer_args=(
            "drill",
            "--checkpoint",
            drill.checkpoint.path,
            "--reference",
            f"{out_dir}/{REFERENCE_NAME}",
            "--steps",
            str(drill.steps),
            "--out",
            f"{out_dir}/drill.json",
        ),
        environment=() if drill.is_attested else tuple(sorted((job.environment or {}).items())),
        allowed_environment=tuple(job.cluster.extra_allowed_environment or ()),
    )


def drill_trainer_digest(drill: RestoreDrill) -> str:
    """The trainer version a drill runs: the one that wrote the checkpoint, or the current
    one for a compatibility drill."""
    if drill.trainer == RestoreDrill.Trainer.CURRENT:
        return trainer.source_digest()
    digest = recorded_trainer_digest(drill.checkpoint)
    if not digest:
        raise WontSubmit(
            Reason.TRAINER_UNAVAILABLE,
            "Gantry did not record which trainer version wrote this checkpoint; a "
            "compatibility drill (trainer: current) can still test it",
        )
    return digest


class DrillLifecycle(SlurmLifecycle[RestoreDrill]):
    model = RestoreDrill
    noun = "drill job"
    submit_task = DRILL_SUBMIT
    faultpoint_prefix = "drill_submit"
    # The verdict is in drill.json; a person clicked and waits for it.
    FINISH_FROM_EXIT_RECORD = True
    LATENCY_SENSITIVE = True

    def for_submit(self) -> QuerySet[RestoreDrill]:
        return RestoreDrill.objects.select_related("cluster", "checkpoint__job__cluster")

    def run_directory(self, obj: RestoreDrill) -> str:
        return drill_output_dir(obj)

    def run_as(self, obj: RestoreDrill) -> str:
        # As the cluster's verifier for a drill that counts (drills.attestation); else as
        # the checkpoint's owner, whoever asked (an operator's drill is audited as theirs).
        return obj.verifier_account if obj.is_attested else obj.checkpoint.job.run_as

    def owner_transport(self, obj: RestoreDrill) -> SshTransport:
        """As the checkpoint's owner, who sees its files whoever runs the drill."""
        job = obj.checkpoint.job
        return transport_as(job.cluster, job.run_as)

    def prepare(self, obj: RestoreDrill, transport: SshTransport) -> str:
        """The trainer version (shipped again from Gantry's archive if the cluster lost
        it), Gantry's reference, the script. What cannot be judged is decided here,
        before any Slurm job: ``WontSubmit`` ends the drill inconclusive."""
        checkpoint = obj.checkpoint
        cluster = checkpoint.job.cluster
        digest = drill_trainer_digest(obj)
        try:
            # The shared trainer archive is written as the service account.
            trainer_path = trainer_version_ensure(transport_for(cluster), cluster.workdir, digest)
        except TrainerUnavailable as error:
            raise WontSubmit(
                Reason.TRAINER_UNAVAILABLE,
                f"the trainer version that wrote this checkpoint ({digest[:12]}) is gone: "
                f"{error}; a compatibility drill (trainer: current) can still test it",
            ) from None
        reference = drill_reference(checkpoint, obj.steps)
        if str(checkpoint.step) not in reference["fingerprints"]:
            raise WontSubmit(
                Reason.REFERENCE_INCOMPLETE,
                f"Gantry holds no state fingerprint of step {checkpoint.step} (a trainer "
                "without fingerprints wrote it)",
            )
        if obj.is_attested:
            try:
                open_to_verifier(
                    cluster=cluster,
                    owner_account=checkpoint.job.run_as,
                    checkpoint=checkpoint,
                    verifier=transport,
                )
            except VerifierAccessError as error:
                raise WontSubmit(Reason.INFRASTRUCTURE_ERROR, str(error)) from None
        reference_bytes = json.dumps(reference, sort_keys=True).encode()
        spec = drill_script_spec(obj, trainer_path=trainer_path)
        try:
            # Rendered before anything is written: an environment the policy now refuses
            # (a job saved before it) ends the drill with the reason, not the task.
            rendered = render_sbatch(spec)
        except EnvironmentRefused as refused:
            raise WontSubmit(Reason.INFRASTRUCTURE_ERROR, str(refused)) from None
        transport.makedirs(spec.run_dir, mode=0o700)
        account = self.run_as(obj)
        if account:
            # The watcher lists the drill's directory as the service account, in one
            # batched command for every account (runs.rundir_batch).
            service_read_grant(
                transport,
                area=user_area(cluster.workdir, account),
                directory=spec.run_dir,
                service_account=cluster.ssh_user,
            )
        transport.put_bytes(f"{spec.run_dir}/{REFERENCE_NAME}", reference_bytes)
        values = {"trainer_digest": digest, "reference_digest": json_digest(reference)}
        RestoreDrill.objects.filter(id=obj.id).update(**values)
        for key, value in values.items():
            setattr(obj, key, value)
        script = f"{spec.run_dir}/drill.sbatch"
        transport.put_bytes(script, rendered.encode(), mode=0o755)
        return script

    def declined(self, obj: RestoreDrill, stop: WontSubmit) -> None:
        self.end_with(obj, verdict_of_code(stop.code, stop.reason))

    def end_with(
        self, drill: RestoreDrill, verdict: Judgement, exit_code: int | None = None
    ) -> bool:
        """End a drill that produced no report, with ``verdict`` (inconclusive or error)."""
        drill.refresh_from_db()
        if drill.is_final:
            return False
        return self.transition(
            drill,
            RestoreDrill.State.FINISHED,
            verdict=verdict.verdict,
            reason=verdict.reason[:4000],
            reason_code=verdict.reason_code[:64],
            finished_at=timezone.now(),
            exit_code=exit_code,
            submit_lease_until=None,
        )

    def end_with_error(
        self, drill: RestoreDrill, *, reason: str, exit_code: int | None = None
    ) -> bool:
        """End a drill with ``error``: it could not run. Says so in plain words."""
        return self.end_with(
            drill, verdict_of_code(Reason.INFRASTRUCTURE_ERROR, reason), exit_code=exit_code
        )

    def apply_report(
        self, drill: RestoreDrill, *, report: dict[str, Any], exit_code: int | None
    ) -> bool:
        """Store the verdict from ``drill.json``: only a verifier-attested pass proves the
        checkpoint restorable and clears a failed integrity check (a self-attested pass is
        the owner's own word: stored, shown, never proof); a failure (the checkpoint is at
        fault) blocks resuming from it, whoever attested it."""
        verdict = verdict_of_report(report, drill)
        now = timezone.now()
        values: dict[str, Any] = {
            "verdict": verdict.verdict,
            "reason": verdict.reason[:4000],
            "reason_code": verdict.reason_code[:64],
            # Strict JSON: jsonb refuses the bare NaN a diverged loss is written as.
            "evidence": report_evidence(report),
            "finished_at": now,
            "exit_code": exit_code,
            **report_timings(report),
        }
        with transaction.atomic():
            if not self.transition(drill, RestoreDrill.State.FINISHED, **values):
                return False
            if verdict.proves and drill.is_attested:
                if drill.level == RestoreDrill.Level.STATE_EXACT:
                    checkpoint_state.checkpoint_state_proof_record(
                        checkpoint_id=drill.checkpoint_id, now=now
                    )
                else:
                    checkpoint_state.checkpoint_proof_record(
                        checkpoint_id=drill.checkpoint_id, now=now
                    )
            elif verdict.blocks_resume:
                checkpoint_state.checkpoint_proof_void(
                    checkpoint_id=drill.checkpoint_id,
                    detail=f"drill failed [{verdict.reason_code}]: {verdict.reason}",
                    now=now,
                )
        return True

    def refused(self, obj: RestoreDrill, reason: str) -> None:
        self.end_with_error(obj, reason=reason)

    def gave_up(self, obj: RestoreDrill, reason: str) -> None:
        self.end_with_error(obj, reason=f"could not reach the cluster to start the drill: {reason}")

    def lost(self, obj: RestoreDrill, message: str, now: datetime) -> bool:
        return self.end_with_error(obj, reason=f"Slurm lost the drill job: {message}")

    def state_for(self, phase: str) -> str:
        return RestoreDrill.State.PENDING if phase == Phase.PENDING else RestoreDrill.State.RUNNING

    def observed(self, obj: RestoreDrill, slurm_job: SlurmJob, to_state: str) -> dict[str, Any]:
        if to_state != RestoreDrill.State.RUNNING:
            return {}
        values = _nodes_values(obj, slurm_job)
        if obj.started_at is None:
            values.update(_started_values(obj, slurm_job.start_time or timezone.now()))
        return values

    def ended_values(self, now: datetime) -> dict[str, Any]:
        return {"finished_at": now}

    def cancel_requested(self, obj: RestoreDrill, *, by: str) -> str:
        for _ in range(3):
            if self.transition(obj, RestoreDrill.State.CANCELLED, finished_at=timezone.now()):
                break
            obj.refresh_from_db()
            if not obj.is_active:
                break
        return "cancelled"

    def finished(self, obj: RestoreDrill, record: SlurmJob, now: datetime) -> bool:
        if slurm_phase(record.state) == Phase.CANCELLED:
            return self.transition(obj, RestoreDrill.State.CANCELLED, finished_at=now)
        ran = _nodes_values(obj, record)
        if obj.started_at is None and record.start_time:
            # It ran and ended between two cycles: fill in when it started.
            ran.update(_started_values(obj, record.start_time))
        if ran:
            RestoreDrill.objects.filter(id=obj.id).update(**ran)
            for key, value in ran.items():
                setattr(obj, key, value)
        transport = self.transport_of(obj)
        report = _read_report(obj, transport)
        owner = self.owner_transport(obj) if obj.is_attested else transport
        if _retention_removed_it(obj, report, owner):
            # The whole directory is gone: the trainer's retention rotated the checkpoint
            # out while the drill ran. That says nothing about the checkpoint itself.
            checkpoint_state.checkpoint_retire(checkpoint_id=obj.checkpoint_id, now=now)
            return self.end_with_error(
                obj,
                reason="the checkpoint was removed by the trainer's retention "
                "(checkpoint_keep) while the drill ran",
                exit_code=record.exit_code,
            )
        unseen = (
            unseen_by_verifier(report, obj.checkpoint, verifier=transport, owner=owner)
            if obj.is_attested
            else None
        )
        if unseen is not None:
            return self.end_with_error(obj, reason=unseen, exit_code=record.exit_code)
        if isinstance(report, dict) and report.get("schema"):
            return self.apply_report(obj, report=report, exit_code=record.exit_code)
        if isinstance(report, str):
            # A drill.json that is no file to read (a link, a device, too large).
            return self.end_with_error(obj, reason=report, exit_code=record.exit_code)
        return self.end_with_error(
            obj,
            reason=f"the drill job ended {record.state} (exit code {record.exit_code}) "
            "without writing drill.json",
            exit_code=record.exit_code,
        )


# What Slurm shows for a job that holds no nodes.
_NO_NODES = ("None assigned", "(null)")


def _nodes_values(drill: RestoreDrill, slurm_job: SlurmJob) -> dict[str, Any]:
    """The nodes Slurm gave the drill (squeue's or sacct's node list; never the report's)."""
    expression = slurm_job.node_list_expr
    if not expression or expression in _NO_NODES or expression == drill.allocated_nodes:
        return {}
    return {"allocated_nodes": expression[:1024]}


def _started_values(drill: RestoreDrill, started: datetime) -> dict[str, Any]:
    values: dict[str, Any] = {"started_at": started}
    if drill.submitted_at:
        values["queue_wait_s"] = max(0.0, (started - drill.submitted_at).total_seconds())
    return values


# The most of a drill report the worker reads (an honest one is a few kilobytes per step).
DRILL_REPORT_MAX_BYTES = 8 << 20


def _read_report(drill: RestoreDrill, transport: SshTransport) -> Any:
    """The drill's report, read bounded (a regular file, no link, at most
    ``DRILL_REPORT_MAX_BYTES``). Missing: None (no report yet). Refused or not JSON: a
    string saying why (the drill ends in ``error``: nothing was reported that can judge)."""
    path = f"{DRILLS.run_directory(drill)}/drill.json"
    try:
        data = transport.read_bounded(path, DRILL_REPORT_MAX_BYTES)
    except slurm_errors.RemoteFileNotFound:
        return None
    except slurm_errors.RemoteFileRefused as refused:
        return f"drill.json refused: {refused}"
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _retention_removed_it(drill: RestoreDrill, report: Any, transport: SshTransport) -> bool:
    return (
        isinstance(report, dict)
        and report.get("verdict") == "failed"
        and report.get("reason_code") in {Reason.MISSING_FILE, Reason.MISSING_MANIFEST}
        and not transport.exists(drill.checkpoint.path)
    )


DRILLS = DrillLifecycle()
