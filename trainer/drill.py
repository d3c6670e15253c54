"""Restore drill: verify a checkpoint, load it on this allocation, run K steps, compare.

The steps of a drill, in order: ``check_integrity`` (rank 0 hashes every file),
``read_checkpoint`` (manifest and config), ``choose_mode`` (reference losses, whether the
allocation can be compared bit for bit), ``load`` (every rank loads and re-hashes what it
reads), ``step_and_compare``. Each step either fills the report or ends the drill with a
reason code; ``drill.json`` is written by rank 0 at the end.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from . import checkpoint as ck
from . import dist
from .config import Config, ConfigError, validate
from .metrics import read_jsonl
from .schema import DRILL_SCHEMA, Reason
from .session import Session

SCHEMA = DRILL_SCHEMA


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


class DrillEnded(Exception):
    """The drill reached its verdict early: ``code`` None means passed."""

    def __init__(self, code: str | None, reason: str | None) -> None:
        super().__init__(reason or "")
        self.code = code
        self.reason = reason


def _empty_report(
    checkpoint: str, reference: str, k: int, env: dist.DistEnv, device: torch.device, **extra: Any
) -> dict[str, Any]:
    return {
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
            "backend": extra["backend"],
        },
        "mode": None,
        "tolerance": extra["tolerance"],
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


@dataclass
class Drill:
    checkpoint: str
    reference: str
    k: int
    env: dist.DistEnv
    device: torch.device
    doc: dict[str, Any]
    nodes: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    cfg: Config | None = None
    ref: dict[int, float] = field(default_factory=dict)

    @property
    def timings(self) -> dict[str, Any]:
        return self.doc["timings"]

    def check_integrity(self) -> None:
        """Rank 0 checks every file (each rank re-verifies what it loads later)."""
        t0 = time.perf_counter()
        rep = ck.verify(self.checkpoint, deep=False) if self.env.rank == 0 else None
        rep = dist.broadcast_object(rep)
        self.timings["integrity_s"] = time.perf_counter() - t0
        assert rep is not None
        keys = ("ok", "reason", "reason_code", "files", "state_keys", "missing_state", "bytes")
        self.doc["integrity"] = {key: rep.get(key) for key in keys}
        self.doc["checkpoint"].update(
            step=rep["step"], world_size_at_save=rep["world_size_at_save"]
        )
        if rep["ok"]:
            return
        self.doc["ranks"] = [
            {
                "rank": r,
                "node": self.nodes[r],
                "files_verified": 0,
                "bytes": 0,
                "ok": False,
                "detail": "integrity check failed before load",
            }
            for r in range(self.env.world_size)
        ]
        raise DrillEnded(rep["reason_code"], rep["reason"])

    def read_checkpoint(self) -> None:
        self.manifest = ck.load_manifest(self.checkpoint)
        try:
            self.cfg = validate(self.manifest["config"])
        except ConfigError as exc:
            raise DrillEnded(Reason.LOAD_ERROR, f"checkpoint config invalid: {exc}") from None
        w_save = int(self.manifest["world_size"])
        self.doc["checkpoint"].update(
            step=int(self.manifest["step"]),
            world_size_at_save=w_save,
            global_batch=self.cfg.batch_size * w_save,
            created=self.manifest.get("created"),
            async_save=self.manifest.get("async"),
            precision=self.manifest.get("precision"),
            device_type=self.manifest.get("device_type"),
            config_sha256=self.manifest.get("config_sha256"),
        )

    def choose_mode(self, mode: str) -> None:
        """The reference losses, whether the allocation fits, exact or tolerance mode."""
        assert self.cfg is not None
        step0 = int(self.manifest["step"])
        w_save = int(self.manifest["world_size"])
        g_save = self.cfg.batch_size * w_save
        if not os.path.isfile(self.reference):
            raise DrillEnded(
                Reason.REFERENCE_MISSING, f"reference file {self.reference} does not exist"
            )
        self.ref = reference_losses(self.reference)
        wanted = [s for s in range(step0 + 1, step0 + self.k + 1) if s in self.ref]
        if not wanted:
            raise DrillEnded(
                Reason.REFERENCE_MISSING,
                f"reference has no steps after {step0} (in ({step0}, {step0 + self.k}])",
            )
        if g_save % self.env.world_size != 0:
            raise DrillEnded(
                Reason.ALLOCATION_INCOMPATIBLE,
                f"allocation incompatible because the global batch {g_save} (world size "
                f"{w_save} x {self.cfg.batch_size}) cannot be split evenly over "
                f"{self.env.world_size} ranks",
            )
        exact_possible = (
            self.env.world_size == w_save
            and self.device.type == "cpu"
            and self.manifest.get("device_type", "cpu") == "cpu"
            and self.manifest.get("torch_threads") in (None, torch.get_num_threads())
        )
        if mode == "exact" and not exact_possible:
            raise DrillEnded(
                Reason.ALLOCATION_INCOMPATIBLE,
                "allocation incompatible because exact mode needs the same world size, "
                "CPU and thread count as at save",
            )
        exact = mode == "exact" or (mode == "auto" and exact_possible)
        self.doc["mode"] = "exact" if exact else "tolerance"
        if exact:
            self.doc["tolerance"] = 0.0
        self.doc["steps_compared"] = len(wanted)

    def load(self) -> Session:
        """Every rank loads (and re-hashes) its part; the first rank's failure ends it."""
        assert self.cfg is not None
        t0 = time.perf_counter()
        session = Session(self.cfg, self.env, self.device)
        err: str | None = None
        code: str | None = None
        lrep: dict[str, Any] = {}
        try:
            lrep = session.load(self.checkpoint, self.manifest)
        except ck.CheckpointError as exc:
            err, code = exc.reason, exc.code
        except Exception as exc:
            err, code = f"{type(exc).__name__}: {exc}", Reason.LOAD_ERROR
        per_rank = {
            "rank": self.env.rank,
            "node": self.env.node,
            "files_verified": len(lrep.get("files_verified", [])),
            "files": lrep.get("files_verified", []),
            "bytes": lrep.get("bytes", 0),
            "ok": err is None,
            "detail": err or "; ".join(lrep.get("notes", [])) or "loaded",
        }
        self.doc["ranks"] = dist.all_gather_object(per_rank, self.env)
        self.timings["load_s"] = time.perf_counter() - t0
        bad = [r for r in self.doc["ranks"] if not r["ok"]]
        if bad:
            codes = dist.all_gather_object(code, self.env)
            first = next(c for c in codes if c)
            raise DrillEnded(first, f"rank {bad[0]['rank']}: {bad[0]['detail']}")
        return session

    def step_and_compare(self, session: Session) -> None:
        """Run K steps from the loaded state and compare each loss with the original run."""
        t0 = time.perf_counter()
        losses: dict[int, float] = {}
        for _ in range(self.k):
            result = session.train_step()
            losses[session.step] = result["loss"]
        self.timings["steps_s"] = time.perf_counter() - t0
        self.timings["per_step_s"] = self.timings["steps_s"] / self.k
        step0 = int(self.manifest["step"])
        exact = self.doc["mode"] == "exact"
        for s in range(step0 + 1, step0 + self.k + 1):
            entry = _compare(s, losses[s], self.ref.get(s), exact, self.doc["tolerance"])
            self.doc["steps"].append(entry)
            if entry["ok"] is False and self.doc["first_divergence"] is None:
                self.doc["first_divergence"] = dict(entry)
        fd = self.doc["first_divergence"]
        if fd is not None:
            tol = self.doc["tolerance"]
            what = "differs from" if exact else f"exceeds tolerance {tol:g} vs"
            raise DrillEnded(
                Reason.LOSS_DIVERGED,
                f"loss diverged at step {fd['step']}: {fd['loss']!r} {what} reference "
                f"{fd['reference']!r} (abs diff {fd['abs_diff']:.3g}, rel diff "
                f"{fd['rel_diff']:.3g})",
            )


def _compare(
    step: int, loss: float, reference: float | None, exact: bool, tolerance: float
) -> dict[str, Any]:
    if reference is None:
        return {
            "step": step,
            "loss": loss,
            "reference": None,
            "abs_diff": None,
            "rel_diff": None,
            "ok": None,
        }
    ad = abs(loss - reference)
    rd = ad / abs(reference) if reference != 0 else (0.0 if ad == 0 else math.inf)
    ok = (loss == reference) if exact else (rd <= tolerance)
    return {
        "step": step,
        "loss": loss,
        "reference": reference,
        "abs_diff": ad,
        "rel_diff": rd,
        "ok": ok,
    }


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
    doc = _empty_report(checkpoint, reference, k, env, device, backend=backend, tolerance=tolerance)
    drill = Drill(checkpoint, reference, k, env, device, doc)
    drill.nodes = dist.all_gather_object(env.node, env)
    doc["allocation"]["nodes"] = drill.nodes
    try:
        drill.check_integrity()
        drill.read_checkpoint()
        drill.choose_mode(mode)
        session = drill.load()
        drill.step_and_compare(session)
        ended = DrillEnded(None, None)
    except DrillEnded as verdict:
        ended = verdict
    doc["reason_code"] = ended.code
    doc["reason"] = ended.reason
    doc["verdict"] = "passed" if ended.code is None else "failed"
    doc["timings"]["total_s"] = time.perf_counter() - t_all
    if env.rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        ck.atomic_write_json(out, doc)
        suffix = f" [{ended.code}] {ended.reason}" if ended.code else ""
        print(f"trainer drill: {doc['verdict']}{suffix}", flush=True)
    return 0 if ended.code is None else 1
