"""Restore drill: verify a checkpoint, load it on this allocation, run K steps, compare."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch

from . import checkpoint as ck
from . import dist
from .config import ConfigError, validate
from .metrics import read_jsonl
from .train import Session

SCHEMA = "gantry-trainer-drill/1"


def reference_losses(path: str) -> dict[int, float]:
    """Step -> loss from a metrics.jsonl (last occurrence wins, e.g. after a resume)."""
    out: dict[int, float] = {}
    for rec in read_jsonl(path):
        if "event" in rec or "step" not in rec or "loss" not in rec:
            continue
        try:
            out[int(rec["step"])] = float(rec["loss"])
        except (TypeError, ValueError):
            continue
    return out


def run(
    checkpoint: str,
    reference: str,
    k: int,
    out: str,
    env: dist.DistEnv,
    device: torch.device,
    backend: str | None,
    tolerance: float = 1e-4,
    mode: str = "auto",
) -> int:
    """Returns the exit code: 0 passed, 1 failed (drill.json written by rank 0)."""
    t_all = time.perf_counter()
    rank = env.rank
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "verdict": "failed",
        "reason": None,
        "reason_code": None,
        "checkpoint": {"path": os.path.abspath(checkpoint)},
        "reference": os.path.abspath(reference),
        "allocation": {
            "world_size": env.world_size,
            "nodes": [],
            "device": str(device),
            "backend": backend,
        },
        "mode": None,
        "tolerance": tolerance,
        "steps_requested": k,
        "steps": [],
        "first_divergence": None,
        "ranks": [],
        "timings": {
            "integrity_s": None,
            "load_s": None,
            "steps_s": None,
            "per_step_s": None,
            "total_s": None,
        },
        "versions": dist.versions(),
        "created": time.time(),
    }
    nodes = dist.all_gather_object(env.node, env)
    doc["allocation"]["nodes"] = nodes

    def finish(code: str | None, reason: str | None) -> int:
        doc["reason_code"] = code
        doc["reason"] = reason
        doc["verdict"] = "passed" if code is None else "failed"
        doc["timings"]["total_s"] = time.perf_counter() - t_all
        if rank == 0:
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            ck.atomic_write_json(out, doc)
            print(
                f"trainer drill: {doc['verdict']}" + (f" [{code}] {reason}" if code else ""),
                flush=True,
            )
        return 0 if code is None else 1

    # 1. integrity (rank 0 checks every file; each rank re-verifies what it loads)
    t0 = time.perf_counter()
    rep = ck.verify(checkpoint, deep=False) if rank == 0 else None
    rep = dist.broadcast_object(rep)
    doc["timings"]["integrity_s"] = time.perf_counter() - t0
    assert rep is not None
    doc["integrity"] = {
        k: rep.get(k)
        for k in ("ok", "reason", "reason_code", "files", "state_keys", "missing_state", "bytes")
    }
    doc["checkpoint"].update(step=rep["step"], world_size_at_save=rep["world_size_at_save"])
    if not rep["ok"]:
        doc["ranks"] = [
            {
                "rank": r,
                "node": nodes[r],
                "files_verified": 0,
                "bytes": 0,
                "ok": False,
                "detail": "integrity check failed before load",
            }
            for r in range(env.world_size)
        ]
        return finish(rep["reason_code"], rep["reason"])
    manifest = ck.load_manifest(checkpoint)
    step0 = int(manifest["step"])
    w_save = int(manifest["world_size"])
    try:
        cfg = validate(manifest["config"])
    except ConfigError as exc:
        return finish("load_error", f"checkpoint config invalid: {exc}")
    g_save = cfg.batch_size * w_save
    doc["checkpoint"].update(
        step=step0,
        world_size_at_save=w_save,
        global_batch=g_save,
        created=manifest.get("created"),
        async_save=manifest.get("async"),
        precision=manifest.get("precision"),
        device_type=manifest.get("device_type"),
        config_sha256=manifest.get("config_sha256"),
    )

    # 2. reference and allocation
    ref = reference_losses(reference) if os.path.isfile(reference) else {}
    wanted = [s for s in range(step0 + 1, step0 + k + 1) if s in ref]
    if not os.path.isfile(reference):
        return finish("reference_missing", f"reference file {reference} does not exist")
    if not wanted:
        return finish(
            "reference_missing", f"reference has no steps after {step0} (in ({step0}, {step0 + k}])"
        )
    if g_save % env.world_size != 0:
        return finish(
            "allocation_incompatible",
            f"allocation incompatible because the global batch {g_save} (world size "
            f"{w_save} x {cfg.batch_size}) cannot be split evenly over {env.world_size} ranks",
        )
    exact_possible = (
        env.world_size == w_save
        and device.type == "cpu"
        and manifest.get("device_type", "cpu") == "cpu"
        and manifest.get("torch_threads") in (None, torch.get_num_threads())
    )
    if mode == "exact" and not exact_possible:
        return finish(
            "allocation_incompatible",
            "allocation incompatible because exact mode needs the same world size, "
            "CPU and thread count as at save",
        )
    doc["mode"] = (
        "exact" if (mode == "exact" or (mode == "auto" and exact_possible)) else "tolerance"
    )
    if doc["mode"] == "exact":
        doc["tolerance"] = 0.0

    # 3. load
    t0 = time.perf_counter()
    session = Session(cfg, env, device)
    err: str | None = None
    code: str | None = None
    lrep: dict[str, Any] = {}
    try:
        lrep = session.load(checkpoint, manifest)
    except ck.CheckpointError as exc:
        err, code = exc.reason, exc.code
    except Exception as exc:
        err, code = f"{type(exc).__name__}: {exc}", "load_error"
    per_rank = {
        "rank": rank,
        "node": env.node,
        "files_verified": len(lrep.get("files_verified", [])),
        "files": lrep.get("files_verified", []),
        "bytes": lrep.get("bytes", 0),
        "ok": err is None,
        "detail": err or "; ".join(lrep.get("notes", [])) or "loaded",
    }
    doc["ranks"] = dist.all_gather_object(per_rank, env)
    doc["timings"]["load_s"] = time.perf_counter() - t0
    bad = [r for r in doc["ranks"] if not r["ok"]]
    if bad:
        codes = dist.all_gather_object(code, env)
        first = next(c for c in codes if c)
        return finish(first, f"rank {bad[0]['rank']}: {bad[0]['detail']}")

    # 4. steps
    t0 = time.perf_counter()
    losses: dict[int, float] = {}
    for _ in range(k):
        r = session.train_step()
        losses[session.step] = r["loss"]
    doc["timings"]["steps_s"] = time.perf_counter() - t0
    doc["timings"]["per_step_s"] = doc["timings"]["steps_s"] / k
    tol = doc["tolerance"]
    for s in range(step0 + 1, step0 + k + 1):
        loss = losses[s]
        if s not in ref:
            doc["steps"].append(
                {
                    "step": s,
                    "loss": loss,
                    "reference": None,
                    "abs_diff": None,
                    "rel_diff": None,
                    "ok": None,
                }
            )
            continue
        refv = ref[s]
        ad = abs(loss - refv)
        rd = ad / abs(refv) if refv != 0 else (0.0 if ad == 0 else math.inf)
        ok = (loss == refv) if doc["mode"] == "exact" else (rd <= tol)
        entry = {
            "step": s,
            "loss": loss,
            "reference": refv,
            "abs_diff": ad,
            "rel_diff": rd,
            "ok": ok,
        }
        doc["steps"].append(entry)
        if not ok and doc["first_divergence"] is None:
            doc["first_divergence"] = dict(entry)
    doc["steps_compared"] = len(wanted)
    fd = doc["first_divergence"]
    if fd is not None:
        what = "differs from" if doc["mode"] == "exact" else f"exceeds tolerance {tol:g} vs"
        return finish(
            "loss_diverged",
            f"loss diverged at step {fd['step']}: {fd['loss']!r} {what} reference "
            f"{fd['reference']!r} (abs diff {fd['abs_diff']:.3g}, rel diff "
            f"{fd['rel_diff']:.3g})",
        )
    return finish(None, None)
