"""The sustained-training step judged from what the trainer left in the step's directory:
``metrics.jsonl`` and ``acceptance.json`` (``trainer/SCHEMA.md``). Pure: no Django, no I/O.

The files come from the nodes under test, so they are read like any other input: the
caller reads them bounded, and here every line and field is checked (a line that is not a
JSON object of the expected types is skipped and counted, never trusted), at most
``MAX_LINES`` lines are looked at, and non-finite figures never count as a measurement.

Three figures, each with its threshold and verdict:

- throughput: tokens/s over the steady-state window (the logged steps after the first
  ``WARMUP_FRACTION`` of the run's time: compilation, allocator and data warm-up are not
  sustained work), from the step counter and the trainer's own clock, so every step in the
  window counts whether it was logged or not. Judged against the threshold fixed when the
  step was made (an operator's, or ``RECORD_FRACTION`` x the partition's record for the same
  configuration key); none: inconclusive.
- MFU: the trainer reports its model FLOPs per token; the achieved model FLOP/s over the
  peak of the set's GPUs (``PEAK_FLOPS``: the vendor's dense figure for the precision) is
  the MFU. On CPUs, GPU types not in the table, or a set of mixed types, MFU is "not
  measured" (never a guessed peak); the achieved FLOP/s are recorded anyway.
- loss: any non-finite loss fails. Otherwise the logged losses are compared, step by step,
  with the reference run of the same configuration key (the steps both logged): on CPU the
  trainer is deterministic (fixed gloo reduction order, deterministic kernels, the same
  thread count), so the losses must match bit for bit; on GPUs deterministic kernels are on
  too, but NCCL may pick another reduction order (ring or tree, channel count) on another
  set of nodes, and a last-bit difference in one gradient grows over thousands of steps, so
  each loss must be within ``GPU_LOSS_TOLERANCE`` (relative) of the reference's, and how
  many matched bit for bit is reported. No reference: inconclusive.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from acceptance.results import StepOutcome, tier_verdict
from acceptance.thresholds import FAILED, INCONCLUSIVE, PASSED
from trainer.schema import ACCEPTANCE_SCHEMA, Event

MAX_LINES = 200_000
# The losses a step keeps (the first ones logged: the steps two runs of one configuration
# have in common) and the most it shows as a curve.
MAX_LOSSES = 2000
WARMUP_FRACTION = 0.2
MIN_WINDOW_POINTS = 3
MIN_COMMON_LOSSES = 5
# The run must have trained for this share of the time asked for to count as sustained.
MIN_DURATION_FRACTION = 0.9
GPU_LOSS_TOLERANCE = 0.05
RECORD_FRACTION = 0.92


@dataclass(frozen=True)
class Expected:
    """What the step asked for: a document that describes anything else is no evidence."""

    nodes: tuple[str, ...]
    world_size: int
    device: str  # cpu | cuda
    precision: str
    config_sha256: str
    trainer_digest: str
    tokens_per_step: int
    samples_per_step: int
    seconds: float
    # One rank's peak FLOP/s (``peak_flops_per_gpu``; one rank per GPU); None: no MFU.
    peak_flops_per_rank: float | None = None


# Dense (no sparsity) peak FLOP/s per GPU from NVIDIA's datasheets, per precision the trainer
# runs (bf16 on tensor cores; fp32 is plain FP32, as torch's matmuls run without TF32).
# Keys match the GPU type squashed to lowercase letters and digits; the first match wins,
# so the more particular parts come first. A part not here has no MFU.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("h100pcie", {"bf16": 756e12, "fp32": 51e12}),
    ("h100nvl", {}),
    ("h200nvl", {}),
    ("gh200", {"bf16": 989e12, "fp32": 67e12}),
    ("h100", {"bf16": 989e12, "fp32": 67e12}),
    ("h200", {"bf16": 989e12, "fp32": 67e12}),
    ("a100", {"bf16": 312e12, "fp32": 19.5e12}),
)


def peak_flops_per_gpu(gpu_types: tuple[str, ...] | list[str], precision: str) -> float | None:
    """The peak of one GPU of the set at ``precision``; None unless every GPU type of the
    set is the same part with a figure in ``PEAK_FLOPS``."""
    peaks = set()
    for gpu_type in gpu_types:
        squashed = "".join(ch for ch in str(gpu_type).lower() if ch.isalnum())
        squashed = squashed.removeprefix("nvidia").removeprefix("tesla")
        found = next((p for key, p in PEAK_FLOPS if squashed.startswith(key)), None)
        peaks.add((found or {}).get(precision))
    if len(peaks) != 1:
        return None
    (peak,) = peaks
    return peak


@dataclass(frozen=True)
class Reference:
    """The losses of the reference run of the same configuration key."""

    label: str
    losses: dict[int, float]
    digest: str


@dataclass
class Metrics:
    # step -> (elapsed seconds, loss); the last line per step wins (SCHEMA.md).
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    done: dict[str, Any] | None = None
    start: dict[str, Any] | None = None
    skipped_lines: int = 0
    lines: int = 0
    truncated: bool = False


def _number(value: Any) -> float | None:
    """A JSON number (not a bool), finite or not; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _finite(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and math.isfinite(number) else None


def read_metrics(data: bytes) -> Metrics:
    """The step and event lines of ``metrics.jsonl`` (only lines that end in a newline:
    the last one may be half written), checked field by field."""
    found = Metrics()
    text = data.decode("utf-8", errors="replace")
    complete = text.split("\n")[:-1]
    if len(complete) > MAX_LINES:
        found.truncated = True
        complete = complete[:MAX_LINES]
    for line in complete:
        found.lines += 1
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            found.skipped_lines += 1
            continue
        if not isinstance(row, dict):
            found.skipped_lines += 1
            continue
        event = row.get("event")
        if event is not None:
            if event == Event.DONE:
                found.done = row
            elif event == Event.START and found.start is None:
                found.start = row
            continue
        step, elapsed, loss = row.get("step"), _finite(row.get("elapsed")), _number(row.get("loss"))
        if type(step) is not int or step < 1 or elapsed is None or elapsed < 0 or loss is None:
            found.skipped_lines += 1
            continue
        found.steps[step] = (elapsed, loss)
    return found


def losses_digest(losses: Mapping[int, float]) -> str:
    """sha256 of the canonical JSON of ``{step: loss}`` (steps as strings, sorted)."""
    text = json.dumps(
        {str(step): losses[step] for step in sorted(losses)}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()


def check_acceptance(doc: Any, expected: Expected) -> str:
    """Why ``acceptance.json`` does not describe the configuration asked for ("" if it does)."""
    if not isinstance(doc, Mapping) or doc.get("schema") != ACCEPTANCE_SCHEMA:
        return "the trainer wrote no acceptance.json of its schema"
    nodes = doc.get("unique_nodes")
    if not isinstance(nodes, list) or sorted(str(n) for n in nodes) != sorted(expected.nodes):
        return f"the run describes nodes {nodes!r:.200}, not {sorted(expected.nodes)}"
    checks = (
        ("world_size", doc.get("world_size"), expected.world_size),
        ("config_sha256", doc.get("config_sha256"), expected.config_sha256),
        ("precision", doc.get("precision"), expected.precision),
    )
    for name, got, want in checks:
        if got != want:
            return f"the run's {name} is {got!r:.80}, the step asked for {want!r}"
    versions = doc.get("versions")
    digest = versions.get("trainer_digest") if isinstance(versions, Mapping) else None
    if digest != expected.trainer_digest:
        return f"the trainer that ran ({digest!r:.80}) is not the one the configuration names"
    ranks = doc.get("ranks")
    devices = {
        str(r.get("device", "")).split(":")[0]
        for r in (ranks if isinstance(ranks, list) else [])
        if isinstance(r, Mapping)
    }
    if devices != {expected.device}:
        return f"the ranks ran on {sorted(devices)}, the step asked for {expected.device}"
    return ""


@dataclass
class Throughput:
    verdict: str
    reason: str
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    window: dict[str, Any] = field(default_factory=dict)
    unjudged: bool = False  # measured, but there was no threshold


def throughput_of(
    metrics: Metrics, expected: Expected, threshold: float | None, detail: str
) -> Throughput:
    ordered = sorted(metrics.steps.items())
    if not ordered:
        return Throughput(INCONCLUSIVE, "no training step was logged")
    last_elapsed = ordered[-1][1][0]
    if last_elapsed < MIN_DURATION_FRACTION * expected.seconds:
        return Throughput(
            INCONCLUSIVE,
            f"the run trained for {last_elapsed:.0f} s of the {expected.seconds:.0f} s asked for",
        )
    window = [(s, e) for s, (e, _) in ordered if e >= WARMUP_FRACTION * last_elapsed]
    if len(window) < MIN_WINDOW_POINTS:
        return Throughput(
            INCONCLUSIVE,
            f"{len(window)} logged steps after the warm-up: too few to measure a sustained rate",
        )
    (first_step, first_s), (last_step, last_s) = window[0], window[-1]
    seconds = last_s - first_s
    if seconds <= 0 or last_step <= first_step:
        return Throughput(INCONCLUSIVE, "the steady-state window has no length")
    steps = last_step - first_step
    tokens = steps * expected.tokens_per_step / seconds
    samples = steps * expected.samples_per_step / seconds
    found = Throughput(
        INCONCLUSIVE,
        "",
        tokens_per_s=tokens,
        samples_per_s=samples,
        window={"from_step": first_step, "to_step": last_step, "seconds": round(seconds, 6)},
    )
    if threshold is None:
        found.reason = f"{tokens:.6g} tokens/s measured; {detail}"
        found.unjudged = True
        return found
    found.verdict = PASSED if tokens >= threshold else FAILED
    found.reason = (
        f"{tokens:.6g} tokens/s is {tokens / threshold:.1%} of the threshold {threshold:.6g} "
        f"({detail})"
    )
    return found


def compare_losses(
    losses: Mapping[int, float], reference: Reference | None, device: str
) -> dict[str, Any]:
    """The loss criterion against ``reference`` (the losses here are all finite)."""
    mode = "exact" if device == "cpu" else "tolerance"
    tolerance = 0.0 if mode == "exact" else GPU_LOSS_TOLERANCE
    found: dict[str, Any] = {"mode": mode, "tolerance": tolerance, "compared": 0}
    if reference is None:
        return {
            **found,
            "verdict": INCONCLUSIVE,
            "reason": "no reference run of this configuration on record",
            "unjudged": True,
        }
    found["reference"] = reference.label
    found["reference_digest"] = reference.digest
    common = sorted(set(losses) & set(reference.losses))
    found["compared"] = len(common)
    if len(common) < MIN_COMMON_LOSSES:
        found.update(
            verdict=INCONCLUSIVE,
            reason=f"{len(common)} logged steps in common with the reference "
            f"({reference.label}); at least {MIN_COMMON_LOSSES} are needed",
        )
        return found
    exact = 0
    worst = 0.0
    first_bad: dict[str, Any] | None = None
    for step in common:
        got, want = losses[step], reference.losses[step]
        if got == want:
            exact += 1
            continue
        relative = abs(got - want) / max(abs(want), 1e-12)
        worst = max(worst, relative)
        if first_bad is None and relative > tolerance:
            first_bad = {"step": step, "loss": got, "reference": want, "rel_diff": relative}
    found.update(bit_exact=exact, max_rel_diff=worst, first_mismatch=first_bad)
    if first_bad is None:
        how = (
            "bit for bit"
            if exact == len(common)
            else f"within {tolerance:g} (relative; {exact} bit for bit)"
        )
        found.update(
            verdict=PASSED,
            reason=f"{len(common)} losses match the reference ({reference.label}) {how}",
        )
    else:
        found.update(
            verdict=FAILED,
            reason=f"the loss at step {first_bad['step']} is {first_bad['loss']!r}, the "
            f"reference ({reference.label}) has {first_bad['reference']!r} "
            + ("(exact mode: bit for bit expected)" if mode == "exact" else f"(> {tolerance:g})"),
        )
    return found


def _loss_part(metrics: Metrics) -> tuple[dict[int, float], int | None]:
    """The finite losses kept (the first ``MAX_LOSSES`` steps), and the first step whose
    loss is not finite."""
    nonfinite = [step for step, (_, loss) in metrics.steps.items() if not math.isfinite(loss)]
    kept = sorted(metrics.steps)[:MAX_LOSSES]
    losses = {s: metrics.steps[s][1] for s in kept if math.isfinite(metrics.steps[s][1])}
    return losses, min(nonfinite) if nonfinite else None


def _flops(doc: Any, tokens_per_s: float | None, world: int, peak: float | None) -> dict[str, Any]:
    per_token = _finite(doc.get("flops_per_token")) if isinstance(doc, Mapping) else None
    achieved = tokens_per_s * per_token if tokens_per_s and per_token and per_token > 0 else None
    per_rank = achieved / world if achieved and world else None
    if per_rank is None:
        mfu, note = None, "not measured: no model FLOPs per token or no throughput"
    elif not peak:
        mfu, note = None, "not measured: no peak FLOP/s on record for these GPUs (or on CPUs)"
    else:
        mfu = round(per_rank / peak, 6)
        note = f"model FLOP/s per GPU over a peak of {peak / 1e12:g} TFLOP/s"
    return {
        "flops_per_token": per_token,
        "model_flops_per_s": achieved,
        "model_flops_per_s_per_rank": per_rank,
        "peak_flops_per_rank": peak,
        "mfu": mfu,
        "mfu_note": note,
    }


def judge_sustained(
    metrics_data: bytes | str | None,
    acceptance_doc: Any,
    *,
    expected: Expected,
    threshold: float | None,
    threshold_detail: str,
    reference: Reference | None,
) -> StepOutcome:
    """The step's outcome from its files: ``metrics_data`` the bytes of ``metrics.jsonl``
    (None: not written; a string: why it could not be read)."""
    if metrics_data is None:
        return StepOutcome(INCONCLUSIVE, "the trainer wrote no metrics.jsonl")
    if isinstance(metrics_data, str):
        return StepOutcome(INCONCLUSIVE, metrics_data)
    wrong = check_acceptance(acceptance_doc, expected)
    if wrong:
        return StepOutcome(INCONCLUSIVE, wrong)
    metrics = read_metrics(metrics_data)
    losses, nonfinite = _loss_part(metrics)
    speed = throughput_of(metrics, expected, threshold, threshold_detail)
    if nonfinite is not None:
        loss = {
            "verdict": FAILED,
            "reason": f"the loss at step {nonfinite} is {metrics.steps[nonfinite][1]!r}: the "
            "run diverged",
            "mode": "finite",
        }
    elif not losses:
        loss = {"verdict": INCONCLUSIVE, "reason": "no loss was logged"}
    else:
        loss = compare_losses(losses, reference, expected.device)
    done = metrics.done or {}
    ordered = sorted(metrics.steps)
    measured: dict[str, Any] = {
        "device": expected.device,
        "precision": expected.precision,
        "world_size": expected.world_size,
        "dataset": _dataset(acceptance_doc),
        "tokens_per_s": speed.tokens_per_s,
        "samples_per_s": speed.samples_per_s,
        "window": speed.window,
        "throughput": {
            "verdict": speed.verdict,
            "reason": speed.reason,
            "threshold": threshold,
            "detail": threshold_detail,
        },
        **_flops(
            acceptance_doc, speed.tokens_per_s, expected.world_size, expected.peak_flops_per_rank
        ),
        "loss": {k: v for k, v in loss.items() if k != "unjudged"},
        "losses": {str(s): losses[s] for s in sorted(losses)},
        "losses_digest": losses_digest(losses) if losses else "",
        "nonfinite_step": nonfinite,
        "logged_steps": len(metrics.steps),
        "last_step": ordered[-1] if ordered else None,
        "duration_s": metrics.steps[ordered[-1]][0] if ordered else None,
        "final_loss": _finite(done.get("final_loss")),
        "stopped_on_time": done.get("stopped_on_time") is True,
        "skipped_lines": metrics.skipped_lines,
        "truncated": metrics.truncated,
    }
    verdict = tier_verdict([speed.verdict, loss["verdict"]])
    # Sound, and unjudged only for want of a record or a reference: the first of its
    # configuration, which may become the record (``acceptance.sustained``).
    measured["baseline"] = (
        verdict == INCONCLUSIVE
        and (speed.verdict == PASSED or speed.unjudged)
        and (loss["verdict"] == PASSED or bool(loss.get("unjudged")))
    )
    reason = f"throughput: {speed.reason}; loss: {loss['reason']}"
    return StepOutcome(verdict, reason[:4000], measured)


def _dataset(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, Mapping):
        return {}
    definition = doc.get("dataset")
    return {
        "sha256": str(doc.get("dataset_sha256", ""))[:64],
        "definition": {str(k)[:32]: v for k, v in definition.items() if _plain(v)}
        if isinstance(definition, Mapping)
        else {},
        "optimal_loss": _finite(doc.get("optimal_loss")),
    }


def _plain(value: Any) -> bool:
    """A short scalar (what a dataset definition holds)."""
    if isinstance(value, str):
        return len(value) <= 256
    return value is None or isinstance(value, bool) or _finite(value) is not None
