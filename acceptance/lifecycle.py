"""What is particular to acceptance steps in the one Slurm lifecycle (``runs.lifecycle``):
the step's batch script (the node probe, or one collective over a group of nodes: srun over
the group's nodes), and what the end of its Slurm job means (read the result it wrote,
bounded, and store the step's verdict). A step that could not run (refused, lost, given up)
ends ``inconclusive``: nothing was measured, which is never a verdict on the nodes.

Steps run as the cluster's service account (an operator's action on the fleet, not a
researcher's job) in ``<workdir>/acceptance/<run>/<step>``; the run directory is Gantry's.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from acceptance.models import AcceptanceStep, Tier
from acceptance.results import (
    InventoryNode,
    StepOutcome,
    judge_collectives,
    judge_inventory,
    probe_documents,
)
from acceptance.selectors import certified_stacks
from acceptance.sustained import MARGIN_MINUTES, THREADS_PER_RANK, expected_of, reference_of
from acceptance.sustained_judge import judge_sustained
from acceptance.thresholds import INCONCLUSIVE
from controlplane.tasknames import ACCEPTANCE_STEP_SUBMIT
from health.services import probe_record
from nodes.models import Node
from runs.lifecycle import Phase, SlurmLifecycle, slurm_phase
from runs.runtime import ScriptSpec, render_sbatch, trainer_ensure_uploaded
from slurm import errors as slurm_errors
from slurm.hostlist import compress
from slurm.parsers import SlurmJob
from slurm.transport import SshTransport

logger = logging.getLogger(__name__)

RESULT_NAME = "collectives.json"
# A collectives document is a few hundred kilobytes at most; a probe's output holds
# nvidia-smi's XML (bounded to 3 MiB per command by the probe itself).
RESULT_MAX_BYTES = 4 << 20
PROBE_OUTPUT_MAX_BYTES = 16 << 20
PROBE_MINUTES = 10
DEFAULT_COLLECTIVE_MINUTES = 20
# The sustained run's files: metrics.jsonl grows with the time asked for (at most 60
# minutes, a line per 5 or 50 steps); acceptance.json is a few kilobytes per rank.
METRICS_NAME = "metrics.jsonl"
TRAINER_ACCEPTANCE_NAME = "acceptance.json"
METRICS_MAX_BYTES = 64 << 20
TRAINER_ACCEPTANCE_MAX_BYTES = 8 << 20
CONFIG_NAME = "config.json"


def step_directory(step: AcceptanceStep) -> str:
    workdir = step.cluster.workdir.rstrip("/")
    return f"{workdir}/acceptance/{step.run_id}/{step.id}"


def collectives_args(step: AcceptanceStep, out_dir: str) -> tuple[str, ...]:
    options = step.run.options or {}
    return (
        "collectives",
        "--ops",
        ",".join(options.get("ops") or ["all_reduce"]),
        "--min-bytes",
        str(options.get("min_bytes", "1MiB")),
        "--max-bytes",
        str(options.get("max_bytes", "64MiB")),
        "--warmup",
        str(int(options.get("warmup", 3))),
        "--iters",
        str(int(options.get("iters", 10))),
        "--out",
        f"{out_dir}/{RESULT_NAME}",
    )


def sustained_args(step: AcceptanceStep, out_dir: str) -> tuple[str, ...]:
    seconds = int((step.configuration or {}).get("seconds") or 60)
    return (
        "train",
        "--config",
        f"{out_dir}/{CONFIG_NAME}",
        "--run-dir",
        out_dir,
        "--max-seconds",
        str(seconds),
    )


def _time_limit(step: AcceptanceStep) -> int:
    if step.tier == Tier.INVENTORY:
        return PROBE_MINUTES
    if step.tier == Tier.SUSTAINED:
        seconds = int((step.configuration or {}).get("seconds") or 60)
        return -(-seconds // 60) + MARGIN_MINUTES
    return max(1, int((step.run.options or {}).get("minutes", DEFAULT_COLLECTIVE_MINUTES)))


def step_script_spec(step: AcceptanceStep, *, trainer_path: str) -> ScriptSpec:
    """One task per node for the probe; for a collective or the sustained run, one per GPU
    of each node (one per node without GPUs), srun over exactly the group's nodes."""
    out_dir = step_directory(step)
    probe = step.tier == Tier.INVENTORY
    if probe:
        args: tuple[str, ...] = ("probe",)
    elif step.tier == Tier.SUSTAINED:
        args = sustained_args(step, out_dir)
    else:
        args = collectives_args(step, out_dir)
    return ScriptSpec(
        job_id=str(step.id),
        job_name=f"acceptance {step.tier} {step.level or ''} {compress(step.nodes)}".strip(),
        run_dir=out_dir,
        trainer_dir=trainer_path,
        python=step.cluster.python,
        partition=step.run.partition,
        nodes=len(step.nodes),
        tasks_per_node=1 if probe else max(1, step.tasks_per_node),
        cpus_per_task=1,
        gpus_per_node=step.gpus_per_node,
        gpu_type="",
        memory_mb=None,
        time_limit_minutes=_time_limit(step),
        nodelist=compress(step.nodes),
        switches="",
        trainer_args=args,
        environment=(
            (("TRAINER_NUM_THREADS", str(THREADS_PER_RANK)),) if step.tier == Tier.SUSTAINED else ()
        ),
        # The probe prints its document on stdout: each rank's output in its own file.
        rank_output=probe,
        # Whatever else runs on the judged nodes would be measured as theirs.
        exclusive=True,
    )


class StepLifecycle(SlurmLifecycle[AcceptanceStep]):
    model = AcceptanceStep
    noun = "acceptance step"
    submit_task = ACCEPTANCE_STEP_SUBMIT
    faultpoint_prefix = "acceptance_submit"
    # The outcome is in the step's own files; an operator waits for the run.
    FINISH_FROM_EXIT_RECORD = True
    LATENCY_SENSITIVE = True

    def for_submit(self) -> QuerySet[AcceptanceStep]:
        return AcceptanceStep.objects.select_related("cluster", "run")

    def run_directory(self, obj: AcceptanceStep) -> str:
        return step_directory(obj)

    def run_as(self, obj: AcceptanceStep) -> str:
        return ""

    def prepare(self, obj: AcceptanceStep, transport: SshTransport) -> str:
        trainer_path = trainer_ensure_uploaded(transport, obj.cluster.workdir)
        spec = step_script_spec(obj, trainer_path=trainer_path)
        transport.makedirs(spec.run_dir, mode=0o700)
        if obj.tier == Tier.SUSTAINED:
            config = (obj.configuration or {}).get("trainer_config") or {}
            transport.put_bytes(
                f"{spec.run_dir}/{CONFIG_NAME}", json.dumps(config).encode(), mode=0o644
            )
        script = f"{spec.run_dir}/step.sbatch"
        transport.put_bytes(script, render_sbatch(spec).encode(), mode=0o755)
        return script

    def end_with(self, step: AcceptanceStep, outcome: StepOutcome, exit_code: int | None) -> bool:
        step.refresh_from_db()
        if step.is_final:
            return False
        return self.transition(
            step,
            AcceptanceStep.State.FINISHED,
            message=f"{outcome.verdict}: {outcome.reason}"[:500],
            verdict=outcome.verdict,
            reason=outcome.reason[:4000],
            measured=outcome.measured or None,
            busbw=outcome.busbw,
            evidence=outcome.evidence or None,
            finished_at=timezone.now(),
            exit_code=exit_code,
            submit_lease_until=None,
        )

    def unmeasured(self, step: AcceptanceStep, reason: str, exit_code: int | None = None) -> bool:
        return self.end_with(step, StepOutcome(INCONCLUSIVE, reason), exit_code)

    def refused(self, obj: AcceptanceStep, reason: str) -> None:
        self.unmeasured(obj, reason)

    def gave_up(self, obj: AcceptanceStep, reason: str) -> None:
        self.unmeasured(obj, f"could not reach the cluster to start the step: {reason}")

    def lost(self, obj: AcceptanceStep, message: str, now: datetime) -> bool:
        return self.unmeasured(obj, f"Slurm lost the step's job: {message}")

    def state_for(self, phase: str) -> str:
        if phase == Phase.PENDING:
            return AcceptanceStep.State.PENDING
        return AcceptanceStep.State.RUNNING

    def observed(self, obj: AcceptanceStep, slurm_job: SlurmJob, to_state: str) -> dict[str, Any]:
        if to_state == AcceptanceStep.State.RUNNING and obj.started_at is None:
            return {"started_at": slurm_job.start_time or timezone.now()}
        return {}

    def ended_values(self, now: datetime) -> dict[str, Any]:
        return {"finished_at": now}

    def cancel_requested(self, obj: AcceptanceStep, *, by: str) -> str:
        self.transition(obj, AcceptanceStep.State.CANCELLED, finished_at=timezone.now())
        return "cancelled"

    def cancel_was_requested(self, obj: AcceptanceStep) -> bool:
        return obj.run.cancelled_by_id is not None or obj.run.state == "cancelled"

    def finished(self, obj: AcceptanceStep, record: SlurmJob, now: datetime) -> bool:
        if slurm_phase(record.state) == Phase.CANCELLED and self.cancel_was_requested(obj):
            return self.transition(obj, AcceptanceStep.State.CANCELLED, finished_at=now)
        transport = self.transport_of(obj)
        if obj.tier == Tier.INVENTORY:
            outcome = self._inventory_outcome(obj, transport, record)
        elif obj.tier == Tier.SUSTAINED:
            outcome = self._sustained_outcome(obj, transport, record)
        else:
            outcome = self._collective_outcome(obj, transport, record)
        return self.end_with(obj, outcome, record.exit_code)

    def _collective_outcome(
        self, step: AcceptanceStep, transport: SshTransport, record: SlurmJob
    ) -> StepOutcome:
        doc = _read_json(transport, f"{step_directory(step)}/{RESULT_NAME}", RESULT_MAX_BYTES)
        if isinstance(doc, str):
            return StepOutcome(INCONCLUSIVE, doc)
        if doc is None:
            return StepOutcome(
                INCONCLUSIVE,
                f"the collective ended {record.state} (exit code {record.exit_code}) without "
                "writing its document",
            )
        return judge_collectives(
            doc,
            nodes=step.nodes,
            threshold=step.threshold,
            detail=step.threshold_detail or "no threshold",
        )

    def _sustained_outcome(
        self, step: AcceptanceStep, transport: SshTransport, record: SlurmJob
    ) -> StepOutcome:
        directory = step_directory(step)
        metrics = _read_bytes(transport, f"{directory}/{METRICS_NAME}", METRICS_MAX_BYTES)
        if metrics is None:
            metrics = (
                f"the training run ended {record.state} (exit code {record.exit_code}) "
                "without writing metrics.jsonl"
            )
        doc = _read_json(
            transport, f"{directory}/{TRAINER_ACCEPTANCE_NAME}", TRAINER_ACCEPTANCE_MAX_BYTES
        )
        if isinstance(doc, str):
            return StepOutcome(INCONCLUSIVE, doc)
        return judge_sustained(
            metrics,
            doc,
            expected=expected_of(step),
            threshold=step.threshold,
            threshold_detail=step.threshold_detail or "no threshold",
            reference=reference_of(step),
        )

    def _inventory_outcome(
        self, step: AcceptanceStep, transport: SshTransport, record: SlurmJob
    ) -> StepOutcome:
        outputs: dict[str, str] = {}
        for rank in range(len(step.nodes)):
            path = f"{step_directory(step)}/rank-{step.slurm_job_id}-{rank}.out"
            try:
                data = transport.read_bounded(path, PROBE_OUTPUT_MAX_BYTES)
            except slurm_errors.RemoteFileNotFound:
                continue
            except slurm_errors.RemoteFileRefused as refused:
                logger.warning("acceptance step %s: %s refused: %s", step.id, path, refused)
                continue
            outputs[str(rank)] = data.decode("utf-8", errors="replace")
        documents = probe_documents(outputs)
        # Read before this probe is recorded: what each node's last certificate says.
        certified = certified_stacks(cluster_id=step.cluster_id, names=list(step.nodes))
        nodes = {
            node.name: node
            for node in Node.objects.filter(
                cluster=step.cluster, name__in=step.nodes
            ).prefetch_related("gpus")
        }
        with transaction.atomic():
            for name, doc in documents.items():
                if name in nodes:
                    # The stack and GPU health also go where the health app keeps them.
                    probe_record(node=nodes[name], document=doc, now=timezone.now())
        inventory = [inventory_node(nodes[name]) for name in step.nodes if name in nodes]
        return judge_inventory(inventory, documents, certified)


def inventory_node(node: Node) -> InventoryNode:
    gpus = list(node.gpus.all())
    types = tuple(sorted({gpu.gpu_type for gpu in gpus if gpu.gpu_type}))
    return InventoryNode(name=node.name, gpus=len(gpus), gpu_types=types)


def _read_bytes(transport: SshTransport, path: str, limit: int) -> bytes | str | None:
    """The bytes at ``path``, read bounded (a regular file, no link). Missing: None;
    refused (a link, a directory, over ``limit``): a string saying why."""
    try:
        return transport.read_bounded(path, limit)
    except slurm_errors.RemoteFileNotFound:
        return None
    except slurm_errors.RemoteFileRefused as refused:
        return f"{path.rsplit('/', 1)[-1]} refused: {refused}"


def _read_json(transport: SshTransport, path: str, limit: int) -> Any:
    """The JSON at ``path``, read bounded (a regular file, no link). Missing: None;
    refused or not JSON: a string saying why."""
    try:
        data = transport.read_bounded(path, limit)
    except slurm_errors.RemoteFileNotFound:
        return None
    except slurm_errors.RemoteFileRefused as refused:
        return f"{path.rsplit('/', 1)[-1]} refused: {refused}"
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return f"{path.rsplit('/', 1)[-1]} is not JSON"


STEPS = StepLifecycle()
