"""What a step's Slurm job left behind, read and judged. Pure: no Django models, no I/O.

The steps run as the cluster's service account in a directory of Gantry's own, but what
they print comes from the nodes under test, so it is read like any other input: bounded,
every field checked, every problem a reason in words (never an exception that loses the
rest). A document that does not describe the nodes the step asked for is no evidence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from acceptance.thresholds import FAILED, INCONCLUSIVE, PASSED
from health.document import read_probe
from health.stack import Difference, stack_drift, stack_fingerprint, stack_items
from trainer.schema import COLLECTIVES_SCHEMA, PROBE_SCHEMA

# The op a level is judged on (thresholds are per op; the others are recorded).
JUDGED_OP = "all_reduce"
MAX_RESULTS_KEPT = 200


@dataclass(frozen=True)
class StepOutcome:
    verdict: str  # passed | failed | inconclusive
    reason: str
    measured: dict[str, Any] = field(default_factory=dict)
    busbw: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _results(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = doc.get("results")
    out = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, Mapping):
            continue
        out.append(
            {
                "op": str(row.get("op", ""))[:32],
                "bytes": _number(row.get("bytes")),
                "time_s": _number(row.get("time_s")),
                "algbw": _number(row.get("algbw")),
                "busbw": _number(row.get("busbw")),
                "correct": row.get("correct") is True,
            }
        )
    return out[:MAX_RESULTS_KEPT]


def collectives_measured(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a collectives document the verdict and the certificate keep."""
    results = _results(doc)
    peak: dict[str, float] = {}
    for row in results:
        if row["correct"] and row["busbw"] is not None:
            peak[row["op"]] = max(peak.get(row["op"], 0.0), row["busbw"])
    versions = doc.get("versions")
    return {
        "verdict": str(doc.get("verdict", ""))[:16],
        "world_size": doc.get("world_size") if isinstance(doc.get("world_size"), int) else None,
        "backend": str(doc.get("backend", ""))[:16],
        "device": str(doc.get("device", ""))[:16],
        "device_name": str(doc.get("device_name", ""))[:128],
        "dtype": str(doc.get("dtype", ""))[:16],
        "unique_nodes": [str(n)[:128] for n in doc.get("unique_nodes") or [] if isinstance(n, str)],
        "versions": {str(k)[:32]: str(v)[:128] for k, v in versions.items()}
        if isinstance(versions, Mapping)
        else {},
        "peak_busbw": peak,
        "results": results,
        "wrong_results": sum(1 for row in results if not row["correct"]),
    }


def judge_collectives(
    doc: Any, *, nodes: Sequence[str], threshold: float | None, detail: str
) -> StepOutcome:
    """A collectives document against the step's nodes and threshold.

    failed: a result was wrong, or the judged op's best busbw is below the threshold;
    inconclusive: no document of this schema, one of other nodes, nothing measured, or no
    threshold; passed otherwise."""
    if not isinstance(doc, Mapping) or doc.get("schema") != COLLECTIVES_SCHEMA:
        return StepOutcome(INCONCLUSIVE, "no collectives document was written")
    measured = collectives_measured(doc)
    if sorted(measured["unique_nodes"]) != sorted(nodes):
        return StepOutcome(
            INCONCLUSIVE,
            f"the document describes nodes {measured['unique_nodes']}, not {sorted(nodes)}",
            measured,
        )
    if measured["wrong_results"]:
        return StepOutcome(
            FAILED,
            f"{measured['wrong_results']} collective result(s) were wrong (checked against "
            "the expected values)",
            measured,
            busbw=0.0,
        )
    busbw = measured["peak_busbw"].get(JUDGED_OP)
    if busbw is None:
        return StepOutcome(INCONCLUSIVE, f"no {JUDGED_OP} size was measured", measured)
    if threshold is None:
        return StepOutcome(INCONCLUSIVE, detail, measured, busbw=busbw)
    verdict = PASSED if busbw >= threshold else FAILED
    reason = f"{JUDGED_OP} busbw {busbw / 1e9:.3f} GB/s is {busbw / threshold:.1%} of the threshold"
    return StepOutcome(verdict, f"{reason} ({detail})", measured, busbw=busbw)


def probe_documents(outputs: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Probe documents by the node each names, from the ranks' output texts (one JSON
    line each; other lines, e.g. warnings on stderr, are skipped). The newest wins."""
    found: dict[str, dict[str, Any]] = {}
    for text in outputs.values():
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                doc = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(doc, dict) and doc.get("schema") == PROBE_SCHEMA:
                node = doc.get("node")
                if isinstance(node, str) and node:
                    found[node[:128]] = doc
    return found


@dataclass(frozen=True)
class InventoryNode:
    """What Gantry's inventory (from Slurm) says of a node."""

    name: str
    gpus: int
    gpu_types: tuple[str, ...]


def _squash(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def _gpu_check(node: InventoryNode, doc: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
    contents = read_probe(doc)
    if contents.report is None:
        why = "; ".join(contents.problems) or "nvidia-smi gave no report"
        return INCONCLUSIVE, f"{node.name}: GPUs not readable ({why})", {}
    models = [gpu.model or "" for gpu in contents.report.gpus]
    seen = {"gpus": len(models), "models": models[:64]}
    if len(models) != node.gpus:
        return FAILED, f"{node.name}: {len(models)} GPUs found, inventory says {node.gpus}", seen
    for kind in node.gpu_types:
        if not all(_squash(kind) in _squash(model) for model in models):
            return FAILED, f"{node.name}: GPU models {sorted(set(models))} are not {kind}", seen
    return PASSED, "", seen


def judge_inventory(
    inventory: Sequence[InventoryNode],
    documents: Mapping[str, Mapping[str, Any]],
    certified: Mapping[str, Mapping[str, Any]] | None = None,
) -> StepOutcome:
    """Every node answered, its GPUs match the inventory, every stack is the same.

    A node whose stack differs from the others fails the set, named with what differs;
    GPUs that could not be read (no nvidia-smi) leave the tier inconclusive, never passed.
    Where no value is held by most nodes (two nodes, or an even split), ``certified`` (each
    node's stack in its last certificate) names the node that changed since, when the
    others did not (``changed_since_certified``); otherwise none is named, and the set
    still fails."""
    failed: list[str] = []
    unknown: list[str] = []
    # Nodes the evidence names: GPUs unlike the inventory, or a stack unlike the majority's.
    at_fault: set[str] = set()
    per_node: dict[str, Any] = {}
    stacks: dict[str, dict[str, Any]] = {}
    for node in inventory:
        doc = documents.get(node.name)
        if doc is None:
            unknown.append(f"{node.name}: no probe document")
            continue
        verdict, why, seen = _gpu_check(node, doc)
        stack = doc.get("stack")
        stacks[node.name] = dict(stack) if isinstance(stack, Mapping) else {}
        per_node[node.name] = {
            "gpus": seen,
            "stack": {k: v for k, v in stacks[node.name].items() if k != "packages"},
            "stack_fingerprint": stack_fingerprint(stacks[node.name]),
        }
        if verdict == FAILED:
            failed.append(why)
            at_fault.add(node.name)
        elif verdict == INCONCLUSIVE:
            unknown.append(why)
    drift = stack_drift(stacks)
    differing = sorted({d.node for d in drift})
    at_fault |= {d.node for d in drift if not d.split}
    changed = changed_since_certified(drift, stacks, certified or {})
    at_fault |= {node for node, _ in changed}
    for d in drift:
        have = d.value if d.value is not None else "absent"
        most = "no majority" if d.split else (d.majority or "absent")
        was = changed.get((d.node, d.key)) if d.split else None
        since = f"; its last certificate: {was}, the others unchanged" if was else ""
        failed.append(f"{d.node}: stack {d.key} is {have} (the others: {most}{since})")
    evidence = {"nodes": per_node, "stack_differs": differing, "at_fault": sorted(at_fault)}
    if failed:
        return StepOutcome(FAILED, "; ".join(failed)[:4000], {"nodes": per_node}, None, evidence)
    if unknown:
        reason = "; ".join(unknown)[:4000]
        return StepOutcome(INCONCLUSIVE, reason, {"nodes": per_node}, None, evidence)
    return StepOutcome(
        PASSED,
        f"{len(inventory)} nodes: GPUs as the inventory says, one stack",
        {"nodes": per_node},
        None,
        evidence,
    )


def changed_since_certified(
    drift: Sequence[Difference],
    stacks: Mapping[str, Mapping[str, Any]],
    certified: Mapping[str, Mapping[str, Any]],
) -> dict[tuple[str, str], str]:
    """For each item split with no majority: the nodes whose value changed since their last
    certificate, where every other node of the split has one and still holds its value
    (then the change is the odd one out): (node, item) -> the value it had then ("absent"
    where it had none). Nothing where a node of the split was never certified, or where all or none
    changed: no side can then claim to be the norm."""
    found: dict[tuple[str, str], str] = {}
    split_keys = sorted({d.key for d in drift if d.split})
    for key in split_keys:
        nodes = [d.node for d in drift if d.split and d.key == key]
        if any(node not in certified or not stack_items(certified[node]) for node in nodes):
            continue
        now = {node: stack_items(stacks.get(node) or {}).get(key) for node in nodes}
        then = {node: stack_items(certified[node]).get(key) for node in nodes}
        moved = [node for node in nodes if now[node] != then[node]]
        if moved and len(moved) < len(nodes):
            for node in moved:
                found[(node, key)] = then[node] or "absent"
    return found


def tier_verdict(verdicts: Sequence[str]) -> str:
    """failed if any failed; inconclusive if any could not judge; passed otherwise (and
    inconclusive for a tier with nothing in it)."""
    if not verdicts:
        return INCONCLUSIVE
    if FAILED in verdicts:
        return FAILED
    if INCONCLUSIVE in verdicts:
        return INCONCLUSIVE
    return PASSED
