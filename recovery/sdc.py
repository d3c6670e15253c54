"""Silent data corruption: two restore drills of the same checkpoint, comparing the same
thing (the same reference Gantry wrote, the same trainer version, the same steps and
shape, both bit for bit), one failing its bit-exact comparison on one set of nodes and the
other passing it on another. The checkpoint's files and the computation are the same, so
the difference is the nodes: those of the failed drill that the passing one did not use
are recorded as suspects (``SuspectNode`` of kind ``sdc``), once per drill and node.

Fail closed; nothing here is evidence unless all of it holds:

- both drills are verifier-attested (``drills.attestation``): the owner of the checkpoint
  wrote neither report, so neither can be forged to point at a node;
- the failure is a bit-exact comparison (``loss_diverged`` or ``state_mismatch`` in exact
  mode), never an integrity, load, step, reference or infrastructure failure, a timeout, a
  cancellation or an inconclusive drill;
- the failed report shows the mismatch in well-formed figures, and a loss it compared is
  the one Gantry holds of the original run at that step;
- the checkpoint's state and the original run's losses over the steps compared are finite
  (a NaN never compares equal to itself);
- the nodes are those Slurm ran the drills on, as Gantry recorded them from squeue or sacct
  (``RestoreDrill.allocated_nodes``), and nodes of the cluster in Gantry's inventory;
  nothing a report names is used. Equal node sets are no evidence;
- both drills were scheduled by Gantry itself (``GANTRY_TRIGGERS``: a drill policy, or
  recovery proving a checkpoint), on the job's own shape: a drill a person started chose
  its partition, shape and moment, so its placement could be aimed at a node;
- both ran on the same partition, on nodes of one GPU model (the inventory's) and one
  software stack (the health probe's ``stack_fingerprint``, Gantry's own reading of each
  node), the same for both: a difference between two kinds of hardware or two stacks is
  no evidence against either.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.fields.json import KT

from core.audit import AuditAction, audit_event_record
from drills.models import RestoreDrill
from health.models import NodeHealth
from jobs.models import Checkpoint, MetricPoint, StateFingerprint
from nodes.models import Cluster, Gpu, Node
from recovery.models import SuspectNode
from slurm.hostlist import expand
from trainer.schema import Reason

logger = logging.getLogger(__name__)

# The reason codes of a failed comparison with the original run (as opposed to damaged
# files, a load or step error, or another checkpoint in its place).
COMPARISON_CODES = frozenset({Reason.LOSS_DIVERGED, Reason.STATE_MISMATCH})
# Drills that finished this recently send their checkpoint through the comparison again
# (every cycle: the records are unique, so a repeat adds nothing).
SDC_LOOKBACK = timedelta(hours=1)
# The most drills of one checkpoint looked at (newest first).
MAX_DRILLS = 50
# What the allocations of two comparable drills must share (world size and device).
_SHAPE_KEYS = ("nodes", "tasks_per_node", "gpus_per_node", "gpu_type")
# Drills Gantry scheduled itself, on the job's own shape, at a moment it chose: only these
# are evidence against a node (a person's drill chose its partition, shape and moment).
GANTRY_TRIGGERS = frozenset(
    {
        RestoreDrill.Trigger.POLICY_RUNNING,
        RestoreDrill.Trigger.POLICY_FINAL,
        RestoreDrill.Trigger.RECOVERY,
    }
)
_NONFINITE_TEXT = frozenset({"NaN", "Infinity", "-Infinity"})
# Bounds on what the evidence quotes from a report.
_TENSORS_QUOTED = 4
_TENSOR_NAME_CHARS = 80
_DRILLS_NAMED = 3
EVIDENCE_CHARS = 2000


@dataclass(frozen=True)
class Mismatch:
    """The bit-exact comparison a failed drill shows failing, in checked figures."""

    what: str  # "loss" or "state"
    step: int
    loss: float | None = None
    reference: float | None = None
    tensors: tuple[str, ...] = ()

    def words(self) -> str:
        if self.what == "loss":
            return f"the loss at step {self.step} was {self.loss!r}, the run's {self.reference!r}"
        named = ", ".join(self.tensors) or "its tensors"
        return f"the state at step {self.step} differed from the run's in {named}"

    def as_evidence(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "step": self.step,
            "loss": self.loss,
            "reference": self.reference,
            "tensors": list(self.tensors),
        }


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _finite(value: Any) -> float | None:
    """A finite JSON number (not a bool, not the strings a NaN is stored as)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _tensor_name(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    printable = "".join(char for char in value if char.isprintable())
    return printable[:_TENSOR_NAME_CHARS] or None


def _state_mismatch(drill: RestoreDrill, state: dict[str, Any]) -> Mismatch | None:
    """The state the drill compared bit for bit and found different: at the step it
    replayed to, else as it loaded it."""
    for where in ("at_end", "at_load"):
        entry = state.get(where)
        if not isinstance(entry, dict) or entry.get("exact") is not True:
            continue
        problems = entry.get("problems")
        step = _integer(entry.get("step"))
        if not isinstance(problems, list) or not problems or step is None:
            continue
        expected = drill.replay_to_step if where == "at_end" else drill.checkpoint.step
        if expected is None or step != expected:
            continue
        names = [
            name
            for name in (
                _tensor_name(problem.get("key"))
                for problem in problems[:_TENSORS_QUOTED]
                if isinstance(problem, dict)
            )
            if name is not None
        ]
        return Mismatch(what="state", step=step, tensors=tuple(names))
    return None


def _loss_mismatch(drill: RestoreDrill, divergence: Any) -> Mismatch | None:
    """The first step whose loss differed, checked against the loss Gantry holds of the
    original run at that step (the report must have compared with the run's own)."""
    if not isinstance(divergence, dict):
        return None
    step = _integer(divergence.get("step"))
    loss = _finite(divergence.get("loss"))
    reference = _finite(divergence.get("reference"))
    start = drill.checkpoint.step
    if step is None or loss is None or reference is None or loss == reference:
        return None
    if not start < step <= start + drill.steps:
        return None
    held = (
        MetricPoint.objects.filter(job_id=drill.checkpoint.job_id, step=step)
        .values_list("loss", flat=True)
        .first()
    )
    if held is None or float(held) != reference:
        return None
    return Mismatch(what="loss", step=step, loss=loss, reference=reference)


def bit_exact_mismatch(drill: RestoreDrill) -> Mismatch | None:
    """What a failed drill's report shows of a failed bit-exact comparison, or None when it
    is no such failure (another reason, tolerance mode, figures missing or malformed)."""
    if drill.verdict != RestoreDrill.Verdict.FAILED or drill.reason_code not in COMPARISON_CODES:
        return None
    evidence = drill.evidence if isinstance(drill.evidence, dict) else {}
    if evidence.get("mode") != "exact":
        return None
    if drill.reason_code == Reason.LOSS_DIVERGED:
        return _loss_mismatch(drill, evidence.get("first_divergence"))
    state = evidence.get("state")
    return _state_mismatch(drill, state) if isinstance(state, dict) else None


def _shape(drill: RestoreDrill) -> tuple[Any, ...] | None:
    allocation = drill.allocation if isinstance(drill.allocation, dict) else {}
    if not all(key in allocation for key in _SHAPE_KEYS[:3]):
        return None
    return tuple(allocation.get(key) or None for key in _SHAPE_KEYS)


def _report_mode(drill: RestoreDrill) -> Any:
    """The comparison mode the drill's report states ("exact" or "tolerance"): read in the
    query (``report_mode``) where the report itself was left in the database."""
    if hasattr(drill, "report_mode"):
        return drill.report_mode
    return drill.evidence.get("mode") if isinstance(drill.evidence, dict) else None


def _partition(drill: RestoreDrill) -> str:
    allocation = drill.allocation if isinstance(drill.allocation, dict) else {}
    partition = allocation.get("partition")
    return partition if isinstance(partition, str) else ""


# Per node name: (its GPU model, its stack fingerprint) in Gantry's inventory and health
# probe; "" where either is unknown or the node's GPUs are of several models.
Platforms = dict[str, tuple[str, str]]


def node_platforms(cluster: Cluster, names: set[str]) -> Platforms:
    """What each node of ``names`` is (two queries): the GPU model, the stack."""
    models: dict[str, set[str]] = {}
    for name, gpu_type in Gpu.objects.filter(
        node__cluster=cluster, node__name__in=sorted(names)
    ).values_list("node__name", "gpu_type"):
        models.setdefault(name, set()).add(gpu_type or "")
    stacks = dict(
        NodeHealth.objects.filter(node__cluster=cluster, node__name__in=sorted(names)).values_list(
            "node__name", "stack_fingerprint"
        )
    )
    return {
        name: (
            next(iter(models[name])) if len(models.get(name, ())) == 1 else "",
            stacks.get(name) or "",
        )
        for name in names
    }


def platform(drill: RestoreDrill, platforms: Platforms) -> tuple[str, str, str] | None:
    """(partition, GPU model, stack fingerprint) every node of the drill shares, or None
    when they do not share one or any of it is unknown."""
    found = {platforms.get(name, ("", "")) for name in _names(drill)}
    if len(found) != 1:
        return None
    [(model, stack)] = found
    partition = _partition(drill)
    return (partition, model, stack) if partition and model and stack else None


def comparable(failed: RestoreDrill, passed: RestoreDrill) -> bool:
    """Whether the two drills compared the same thing the same way: the same checkpoint,
    reference, trainer version, steps, shape and partition, both bit for bit, both
    scheduled by Gantry (the hardware they ran on is ``platform``'s to compare)."""
    return (
        failed.trigger in GANTRY_TRIGGERS
        and passed.trigger in GANTRY_TRIGGERS
        and bool(_partition(failed))
        and _partition(failed) == _partition(passed)
        and failed.checkpoint_id == passed.checkpoint_id
        and passed.verdict == RestoreDrill.Verdict.PASSED
        and bool(failed.reference_digest)
        and failed.reference_digest == passed.reference_digest
        and failed.trainer == passed.trainer
        and bool(failed.trainer_digest)
        and failed.trainer_digest == passed.trainer_digest
        and failed.steps == passed.steps
        and failed.replay_to_step == passed.replay_to_step
        and _shape(failed) is not None
        and _shape(failed) == _shape(passed)
        and _report_mode(failed) == "exact"
        and _report_mode(passed) == "exact"
    )


def _nonfinite(data: Any) -> bool:
    """Whether a stored fingerprint shows a tensor whose sums are not finite."""
    tensors = data.get("tensors") if isinstance(data, dict) else None
    if not isinstance(tensors, dict):
        return True
    for entry in tensors.values():
        if not isinstance(entry, dict):
            continue
        for key in ("sum", "sumsq"):
            value = entry.get(key)
            if isinstance(value, str) and value in _NONFINITE_TEXT:
                return True
            if isinstance(value, float) and not math.isfinite(value):
                return True
    return False


def state_is_finite(checkpoint: Checkpoint, steps: int, replay_to: int | None) -> bool:
    """The checkpoint's state (and at the step replayed to), and the original run's losses
    over the steps compared, as Gantry holds them: all there and all finite."""
    job = checkpoint.job
    end = checkpoint.step + steps
    if job.nonfinite_loss_step is not None and job.nonfinite_loss_step <= end:
        return False
    wanted = {checkpoint.step} | ({replay_to} if replay_to is not None else set())
    prints = dict(
        StateFingerprint.objects.filter(job=job, step__in=wanted).values_list("step", "data")
    )
    if set(prints) != wanted or any(_nonfinite(data) for data in prints.values()):
        return False
    losses = list(
        MetricPoint.objects.filter(job=job, step__gt=checkpoint.step, step__lte=end).values_list(
            "loss", flat=True
        )
    )
    return bool(losses) and all(loss is not None and math.isfinite(float(loss)) for loss in losses)


def _names(drill: RestoreDrill) -> set[str]:
    try:
        return set(expand(drill.allocated_nodes))
    except ValueError:
        return set()


def sdc_record(*, cluster: Cluster, now: datetime) -> int:
    """Record the silent data corruption the drills of ``cluster`` that finished lately
    show, against each checkpoint they drilled; returns how many suspicions were added."""
    recent = (
        RestoreDrill.objects.filter(
            checkpoint__job__cluster=cluster,
            state=RestoreDrill.State.FINISHED,
            finished_at__gte=now - SDC_LOOKBACK,
            attestation=RestoreDrill.Attestation.VERIFIER,
            trigger__in=sorted(GANTRY_TRIGGERS),
        )
        .filter(
            Q(verdict=RestoreDrill.Verdict.PASSED)
            | Q(verdict=RestoreDrill.Verdict.FAILED, reason_code__in=list(COMPARISON_CODES))
        )
        .exclude(allocated_nodes="")
        .order_by()
        .values_list("checkpoint_id", flat=True)
        .distinct()
    )
    added = 0
    for checkpoint_id in sorted(set(recent)):
        added += _checkpoint_evidence(cluster, checkpoint_id)
    return added


def _checkpoint_evidence(cluster: Cluster, checkpoint_id: int) -> int:
    drills: list[RestoreDrill] = list(
        RestoreDrill.objects.filter(
            checkpoint_id=checkpoint_id,
            state=RestoreDrill.State.FINISHED,
            attestation=RestoreDrill.Attestation.VERIFIER,
            trigger__in=sorted(GANTRY_TRIGGERS),
            verdict__in=[RestoreDrill.Verdict.PASSED, RestoreDrill.Verdict.FAILED],
        )
        .exclude(allocated_nodes="")
        .select_related("checkpoint__job")
        # Reports can be large: only a failed drill's is read (below), when it matters.
        .defer("evidence")
        .annotate(report_mode=KT("evidence__mode"))
        .order_by("-finished_at")[:MAX_DRILLS]
    )
    passed = [d for d in drills if d.verdict == RestoreDrill.Verdict.PASSED]
    failed = [
        d
        for d in drills
        if d.verdict == RestoreDrill.Verdict.FAILED and d.reason_code in COMPARISON_CODES
    ]
    if not passed or not failed:
        return 0
    platforms = node_platforms(cluster, set().union(*(_names(d) for d in drills)))
    added = 0
    finite: dict[tuple[int, int | None], bool] = {}
    for bad in failed:
        where = platform(bad, platforms)
        if where is None:
            continue
        good = [
            item
            for item in passed
            if comparable(bad, item) and _names(item) and platform(item, platforms) == where
        ]
        if not good:
            continue
        key = (bad.steps, bad.replay_to_step)
        if key not in finite:
            finite[key] = state_is_finite(bad.checkpoint, bad.steps, bad.replay_to_step)
        if not finite[key]:
            continue
        # Reads the failed drill's report (deferred above).
        mismatch = bit_exact_mismatch(bad)
        if mismatch is None:
            continue
        added += _record(cluster, bad, good, mismatch, where)
    return added


def _record(
    cluster: Cluster,
    bad: RestoreDrill,
    good: list[RestoreDrill],
    mismatch: Mismatch,
    where: tuple[str, str, str],
) -> int:
    """Suspect the nodes of ``bad`` that none of the passing drills ``good`` ran on
    (``where``: the partition, GPU model and stack fingerprint all of them share)."""
    failed_on = _names(bad)
    passed_on: set[str] = set().union(*(_names(item) for item in good))
    only_failed = failed_on - passed_on
    if not only_failed:
        return 0
    nodes = list(Node.objects.filter(cluster=cluster, name__in=sorted(only_failed)))
    if not nodes:
        return 0
    why = _evidence_text(bad, good, mismatch, failed_on, passed_on, only_failed, where)
    details = {
        "drill": str(bad.id),
        "passed_drills": [str(item.id) for item in good[:_DRILLS_NAMED]],
        "checkpoint": bad.checkpoint_id,
        "step": bad.checkpoint.step,
        "failed_on": sorted(failed_on),
        "passed_on": sorted(passed_on),
        "mismatch": mismatch.as_evidence(),
        "partition": where[0],
        "gpu_model": where[1],
        "stack_fingerprint": where[2],
    }
    added = 0
    with transaction.atomic():
        for node in sorted(nodes, key=lambda n: n.name):
            _, created = SuspectNode.objects.get_or_create(
                node=node,
                drill=bad,
                defaults={
                    "kind": SuspectNode.Kind.SILENT_DATA_CORRUPTION,
                    "passed_drill": good[0],
                    "evidence": why,
                },
            )
            if created:
                added += 1
                audit_event_record(
                    actor=None,
                    action=AuditAction.SUSPECT_NODE_SDC,
                    target=node,
                    details={**details, "node": node.name},
                )
    if added:
        logger.warning("silent data corruption on %s: %s", cluster.name, why)
    return added


def _drill_names(drills: Iterable[RestoreDrill]) -> str:
    items = list(drills)
    named = ", ".join(str(item.id)[:8] for item in items[:_DRILLS_NAMED])
    return named + (f" and {len(items) - _DRILLS_NAMED} more" if len(items) > _DRILLS_NAMED else "")


def _evidence_text(
    bad: RestoreDrill,
    good: list[RestoreDrill],
    mismatch: Mismatch,
    failed_on: set[str],
    passed_on: set[str],
    only_failed: set[str],
    where: tuple[str, str, str],
) -> str:
    checkpoint = bad.checkpoint
    start = checkpoint.step
    plural = "s" if len(good) > 1 else ""
    text = (
        f"silent data corruption: restore drill {str(bad.id)[:8]} of the checkpoint at step "
        f"{start} (job {str(checkpoint.job_id)[:8]}) failed its bit-exact comparison on "
        f"{', '.join(sorted(failed_on))} ({mismatch.words()}), while drill{plural} "
        f"{_drill_names(good)} of the same checkpoint passed the same comparison (steps "
        f"{start + 1}-{start + bad.steps}, the same reference and trainer "
        f"{bad.trainer_digest[:12]}) on {', '.join(sorted(passed_on))}; all of them "
        f"scheduled by Gantry on partition {where[0]}, {where[1]} GPUs, stack {where[2]}; "
        f"{', '.join(sorted(only_failed))} ran only in the failed drill"
    )
    return text[:EVIDENCE_CHARS]
