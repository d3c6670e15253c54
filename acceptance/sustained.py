"""The sustained-training tier: the bundled trainer over every node of the set, one rank
per GPU (one per node without GPUs, as the collectives steps are sized), in a fixed
configuration for ``options["sustained_minutes"]`` (``train --max-seconds``), judged from
the files it wrote (``acceptance.sustained_judge``).

The configuration is fixed and documented here, so runs are comparable: a synthetic Markov
token stream (nothing is loaded from anywhere: ``trainer/data.py``), seed 0, DDP,
deterministic kernels, no checkpoints (nothing but training in the measured time), and

- on GPUs (every node of the set has one, and its last probe saw CUDA with NCCL): the
  ``small`` preset, bf16 where the GPUs are of a family with bf16 (compute capability 8.0
  and later: ``BF16_FAMILIES``), else fp32; a step logged every 50;
- otherwise on CPUs: the ``tiny`` preset in fp32, a step logged every 5.

Its **configuration key** is the sha256 of (trainer digest, world size, GPU types, device,
precision, the trainer config's sha256): a record or a reference counts only for exactly
the same key, in the same cluster and partition.

A sustained measurement is **on record** (its throughput a record, its losses a reference)
when its run ended with no tier failed, every tier before sustained passed, and its own
sustained tier passed, or was a *baseline*: sound (throughput measured, every loss finite)
and unjudged only because there was no record or reference yet (the first run of a
configuration; an operator's ``sustained_min_tokens_per_s`` judges its throughput).
Without that rule no run of a new configuration could ever become the record.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

import trainer
from acceptance.models import TIER_ORDER, AcceptanceRun, AcceptanceStep, Tier, Verdict
from acceptance.sustained_judge import RECORD_FRACTION, Expected, Reference, peak_flops_per_gpu
from acceptance.thresholds import OPERATOR, RECORD
from acceptance.tiers import SetNode, step_key
from controlplane.tasknames import ACCEPTANCE_STEP_SUBMIT, task_send
from health.models import NodeHealth
from nodes.models import Gpu
from trainer.config import validate as trainer_config_validate

DEFAULT_MINUTES = 3
# Torch threads per rank (``TRAINER_NUM_THREADS``): the step asks Slurm for one CPU per
# rank, and a fixed count keeps CPU losses bit for bit from one set of nodes to another
# (a float reduction split over another number of threads can round differently).
THREADS_PER_RANK = 1
# Slurm's limit is the measured time plus this: start-up (imports, the process group) and
# the end (barrier, metrics closed) must fit, or Slurm would cut the measurement short.
MARGIN_MINUTES = 10
RECORDS_LOOKED_AT = 200

_COMMON = {
    "steps": 1_000_000_000,
    "seed": 0,
    "strategy": "ddp",
    "checkpoint_every": 0,
    "deterministic": True,
    "warmup_steps": 10,
    "data": {"kind": "markov", "order": 2, "seed": 1234, "branching": 4},
}
TRAINER_CONFIGS: dict[str, dict[str, Any]] = {
    "cuda": {**_COMMON, "preset": "small", "device": "cuda", "log_every": 50},
    "cpu": {**_COMMON, "preset": "tiny", "device": "cpu", "log_every": 5, "precision": "fp32"},
}
# GPU families with bf16 (compute capability >= 8.0), as the inventory names GPU types
# (lower case, without separators); a type not listed runs fp32, which every GPU has.
BF16_FAMILIES = re.compile(
    r"^(a100|a800|a10|a16|a30|a40|a2\b|rtxa[0-9]+|rtx30[0-9]{2}|rtx40[0-9]{2}|rtx50[0-9]{2}"
    r"|l4|l40|h100|h800|h200|h20|gh200|b100|b200|gb200)"
)


def _squash(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def bf16_capable(gpu_types: Sequence[str]) -> bool:
    return bool(gpu_types) and all(BF16_FAMILIES.match(_squash(t)) for t in gpu_types)


@dataclass(frozen=True)
class Plan:
    """What the step runs: the trainer config and everything its key is made of."""

    device: str
    precision: str
    tasks_per_node: int
    gpus_per_node: int
    gpu_types: tuple[str, ...]
    trainer_config: dict[str, Any]
    config_sha256: str
    trainer_digest: str
    world_size: int

    @property
    def key(self) -> str:
        text = json.dumps(
            {
                "trainer_digest": self.trainer_digest,
                "world_size": self.world_size,
                "gpu_types": list(self.gpu_types),
                "device": self.device,
                "precision": self.precision,
                "config_sha256": self.config_sha256,
                "threads_per_rank": THREADS_PER_RANK,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(text.encode()).hexdigest()


def sustained_plan(run: AcceptanceRun, nodes: Sequence[SetNode]) -> Plan | str:
    """The fixed configuration for this set, or why it cannot be chosen."""
    names = [n.name for n in nodes]
    fewest = min((n.gpus for n in nodes), default=0)
    gpu_types = tuple(
        sorted(
            set(
                Gpu.objects.filter(node__cluster=run.cluster, node__name__in=names)
                .exclude(gpu_type="")
                .values_list("gpu_type", flat=True)
            )
        )
    )
    device = "cpu"
    if fewest >= 1:
        stacks = dict(
            NodeHealth.objects.filter(node__cluster=run.cluster, node__name__in=names)
            .exclude(probed_at__isnull=True)
            .values_list("node__name", "stack")
        )
        unknown = [name for name in names if name not in stacks]
        if unknown:
            return (
                f"no probe of {', '.join(unknown[:10])} on record, so Gantry cannot tell "
                "whether its GPUs are usable (CUDA with NCCL); run the inventory tier with it"
            )
        if all(isinstance(s, dict) and s.get("nccl") for s in stacks.values()):
            device = "cuda"
    precision = "bf16" if device == "cuda" and bf16_capable(gpu_types) else "fp32"
    raw = copy.deepcopy(TRAINER_CONFIGS[device])
    raw["precision"] = precision
    config = trainer_config_validate(raw)
    tasks = max(1, fewest)
    return Plan(
        device=device,
        precision=precision,
        tasks_per_node=tasks,
        gpus_per_node=fewest,
        gpu_types=gpu_types,
        trainer_config=config.to_dict(),
        config_sha256=config.sha256(),
        trainer_digest=trainer.source_digest(),
        world_size=tasks * len(nodes),
    )


def _outcome_counts(run: AcceptanceRun) -> bool:
    outcomes = run.outcomes or {}
    if any(o.get("verdict") == Verdict.FAILED for o in outcomes.values()):
        return False
    before = TIER_ORDER[: TIER_ORDER.index(Tier.SUSTAINED)]
    if any(outcomes[t.value].get("verdict") != Verdict.PASSED for t in before if t in outcomes):
        return False
    mine = outcomes.get(Tier.SUSTAINED.value) or {}
    return mine.get("verdict") == Verdict.PASSED or mine.get("baseline") is True


def counts_as_record(step: AcceptanceStep) -> bool:
    """Whether a finished sustained step is on record (the module's rule)."""
    measured = step.measured or {}
    return (
        step.run.state == AcceptanceRun.State.FINISHED
        and isinstance(measured.get("tokens_per_s"), int | float)
        and not isinstance(measured.get("tokens_per_s"), bool)
        and measured.get("nonfinite_step") is None
        and bool(measured.get("losses"))
        and _outcome_counts(step.run)
    )


def sustained_records(run: AcceptanceRun, key: str) -> list[AcceptanceStep]:
    """Sustained steps on record for ``key`` in the run's cluster and partition, newest
    first."""
    rows = (
        AcceptanceStep.objects.filter(
            cluster=run.cluster,
            tier=Tier.SUSTAINED,
            config_key=key,
            state=AcceptanceStep.State.FINISHED,
            run__partition=run.partition,
            run__state=AcceptanceRun.State.FINISHED,
        )
        .exclude(run=run)
        .exclude(verdict=Verdict.FAILED)
        .select_related("run")
        .order_by("-finished_at")[:RECORDS_LOOKED_AT]
    )
    return [step for step in rows if counts_as_record(step)]


def _threshold(run: AcceptanceRun, records: list[AcceptanceStep]) -> tuple[float | None, str, str]:
    where = f"{run.cluster.name}/{run.partition} for this configuration"
    operator = (run.options or {}).get("sustained_min_tokens_per_s")
    if operator:
        return float(operator), OPERATOR, f"set by the operator for this run ({where})"
    best = max(records, key=lambda s: float((s.measured or {})["tokens_per_s"]), default=None)
    if best is None:
        return None, "none", f"no record and no operator threshold {where}"
    value = float((best.measured or {})["tokens_per_s"])
    return (
        value * RECORD_FRACTION,
        RECORD,
        f"{RECORD_FRACTION:g} x the record {value:.6g} tokens/s {where} "
        f"(run {str(best.run_id)[:8]})",
    )


def sustained_step_create(run: AcceptanceRun, nodes: Sequence[SetNode]) -> AcceptanceStep | str:
    """The tier's one step (exactly once), its threshold and reference fixed now; enqueued
    for submission after commit. A string: why the tier cannot run."""
    plan = sustained_plan(run, nodes)
    if isinstance(plan, str):
        return plan
    records = sustained_records(run, plan.key)
    threshold, source, detail = _threshold(run, records)
    reference = records[0] if records else None
    minutes = int((run.options or {}).get("sustained_minutes", DEFAULT_MINUTES))
    group = [n.name for n in nodes]
    configuration = {
        "trainer_config": plan.trainer_config,
        "config_sha256": plan.config_sha256,
        "trainer_digest": plan.trainer_digest,
        "device": plan.device,
        "precision": plan.precision,
        "gpu_types": list(plan.gpu_types),
        "world_size": plan.world_size,
        "threads_per_rank": THREADS_PER_RANK,
        "seconds": minutes * 60,
        "reference_step": str(reference.id) if reference else None,
        "reference_run": str(reference.run_id) if reference else None,
    }
    try:
        with transaction.atomic():
            step = AcceptanceStep.objects.create(
                run=run,
                cluster=run.cluster,
                tier=Tier.SUSTAINED,
                level="",
                nodes=group,
                key=step_key(Tier.SUSTAINED, "", 0, group),
                tasks_per_node=plan.tasks_per_node,
                gpus_per_node=plan.gpus_per_node,
                threshold=threshold,
                threshold_source=source,
                threshold_detail=detail[:512],
                configuration=configuration,
                config_key=plan.key,
            )
    except IntegrityError:
        found = run.steps.filter(tier=Tier.SUSTAINED).first()
        return found if found is not None else "the sustained step could not be made"
    transaction.on_commit(functools.partial(task_send, ACCEPTANCE_STEP_SUBMIT, str(step.id)))
    return step


def expected_of(step: AcceptanceStep) -> Expected:
    configuration = step.configuration or {}
    config = configuration.get("trainer_config") or {}
    world = int(configuration.get("world_size") or 0)
    per_rank = int(config.get("batch_size") or 0)
    return Expected(
        nodes=tuple(step.nodes),
        world_size=world,
        device=str(configuration.get("device", "")),
        precision=str(configuration.get("precision", "")),
        config_sha256=str(configuration.get("config_sha256", "")),
        trainer_digest=str(configuration.get("trainer_digest", "")),
        tokens_per_step=per_rank * world * int(config.get("seq_len") or 0),
        samples_per_step=per_rank * world,
        seconds=float(configuration.get("seconds") or 0),
        peak_flops_per_rank=peak_flops_per_gpu(
            [str(t) for t in configuration.get("gpu_types") or []],
            str(configuration.get("precision", "")),
        )
        if configuration.get("device") == "cuda"
        else None,
    )


def reference_of(step: AcceptanceStep) -> Reference | None:
    """The losses of the reference step fixed when ``step`` was made (Gantry's database,
    never the cluster's files)."""
    reference_id = (step.configuration or {}).get("reference_step")
    if not reference_id:
        return None
    found = AcceptanceStep.objects.filter(id=reference_id).only("measured", "run_id").first()
    if found is None:
        return None
    measured = found.measured or {}
    stored = measured.get("losses")
    if not isinstance(stored, dict):
        return None
    losses = {
        int(s): float(v)
        for s, v in stored.items()
        if str(s).isdigit() and isinstance(v, float | int) and not isinstance(v, bool)
    }
    return Reference(
        label=f"run {str(found.run_id)[:8]}",
        losses=losses,
        digest=str(measured.get("losses_digest", "")),
    )


@dataclass
class SustainedDone:
    verdict: str
    reason: str
    extra: dict[str, Any]


def sustained_advance(run: AcceptanceRun, nodes: Sequence[SetNode]) -> SustainedDone | int:
    """The tier's next move: its outcome once its step ended, else 1 when the step was
    just made and 0 while it runs."""
    step = run.steps.filter(tier=Tier.SUSTAINED).first()
    if step is None:
        made = sustained_step_create(run, nodes)
        if isinstance(made, str):
            return SustainedDone(Verdict.INCONCLUSIVE, made, {})
        return 1
    if not step.is_final:
        return 0
    measured = step.measured or {}
    verdict = step.verdict or Verdict.INCONCLUSIVE
    reason = step.reason or ("cancelled" if step.state == step.State.CANCELLED else "")
    configuration = step.configuration or {}
    return SustainedDone(
        verdict,
        reason,
        {
            "step": str(step.id),
            "config_key": step.config_key,
            "dataset": measured.get("dataset")
            or {"definition": configuration.get("trainer_config", {}).get("data")},
            "precision": configuration.get("precision"),
            "device": configuration.get("device"),
            "scale": {
                "nodes": len(step.nodes),
                "world_size": configuration.get("world_size"),
                "gpu_types": configuration.get("gpu_types"),
                "seconds": configuration.get("seconds"),
            },
            "baseline": measured.get("baseline") is True,
        },
    )
