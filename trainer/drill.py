"""Restore drill: prove that a checkpoint resumes training, on this allocation.

The steps, in order; each either adds to the report or ends the drill with a reason code
whose class is the verdict (``trainer.schema.verdict_for``):

1. ``read_reference`` — what Gantry holds of the original run (losses, the state
   fingerprints at the checkpoint and at the step the drill replays to, the dataset hash);
   absent or incomplete: *inconclusive*.
2. ``check_integrity`` — first, the directory holds the checkpoint Gantry registered (the
   step and manifest digest in the reference): else *failed* (``not_as_registered``), since
   another complete checkpoint put in its place passes every later check; then every file
   present, of its size and sha256: else *failed*.
3. ``check_consistency`` — every rank's files hold this step, this save, this world size,
   one data position: else *failed* (``inconsistent_state``).
4. ``check_data`` — the data this trainer would produce is the run's (else *inconclusive*:
   the environment changed), and the checkpoint's is too (else *failed*).
5. ``choose_mode`` — bit-exact on the same shape on CPU (or a deterministic GPU run),
   within tolerances otherwise; an allocation that cannot continue the run: *inconclusive*.
6. ``load`` — every rank loads and re-hashes what it reads: else *failed*.
7. ``compare_loaded`` — the loaded state's fingerprint equals the saved one, bit for bit on
   any allocation: else *failed* (``state_mismatch``, naming the tensors).
8. ``replay`` — K steps (to the original run's next checkpoint when Gantry asks): an
   exception while stepping is *failed*; each loss against the original run; then the state
   against the next checkpoint's fingerprint (exact, or relative L2 within tolerance).
9. fewer steps compared than asked: *inconclusive*. Otherwise: *passed*.

K = 0 is a drill of the state alone ("state-exact, no replay", for a checkpoint the run
logged nothing after): steps 1-7, no replay; Gantry names that level, never a full pass.

``drill.json`` is written by rank 0 at the end. The drill writes nothing else.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from . import checkpoint as ck
from . import dist, fingerprint
from .config import Config, ConfigError, validate
from .data import MarkovSource
from .metrics import read_jsonl
from .schema import DRILL_REFERENCE_SCHEMA, DRILL_SCHEMA, Event, Reason, json_digest, verdict_for
from .session import Session

SCHEMA = DRILL_SCHEMA
DEFAULT_STATE_TOLERANCE = 1e-3


class DrillEnded(Exception):
    """The drill reached its verdict early: ``code`` None means passed."""

    def __init__(self, code: str | None, reason: str | None) -> None:
        super().__init__(reason or "")
        self.code = code
        self.reason = reason


def reference_from_metrics(path: str) -> dict[str, Any]:
    """A reference built from a run's own metrics.jsonl (standalone use, without Gantry):
    losses from the step lines (last occurrence wins), fingerprints from the checkpoint
    events. Gantry writes its reference from its own database instead, so that damage to
    the cluster's files cannot make a bad checkpoint pass."""
    losses: dict[str, float] = {}
    fingerprints: dict[str, Any] = {}
    for record in read_jsonl(path):
        if record.get("event") == Event.CHECKPOINT and record.get("fingerprint"):
            fingerprints[str(record["step"])] = record["fingerprint"]
        elif "event" not in record and "step" in record and "loss" in record:
            try:
                losses[str(int(record["step"]))] = float(record["loss"])
            except (TypeError, ValueError):
                continue
    return {
        "schema": DRILL_REFERENCE_SCHEMA,
        "source": os.path.abspath(path),
        "losses": losses,
        "fingerprints": fingerprints,
        "dataset_sha256": None,
    }


def read_reference(path: str) -> dict[str, Any]:
    """Gantry's reference (``reference.json``), or one built from a metrics.jsonl."""
    if not os.path.isfile(path):
        raise DrillEnded(Reason.REFERENCE_MISSING, f"reference file {path} does not exist")
    if path.endswith(".jsonl"):
        return reference_from_metrics(path)
    try:
        with open(path, encoding="utf-8") as fh:
            reference = json.load(fh)
    except (OSError, ValueError) as exc:
        raise DrillEnded(Reason.REFERENCE_MISSING, f"reference unreadable: {exc}") from None
    if not isinstance(reference, dict) or reference.get("schema") != DRILL_REFERENCE_SCHEMA:
        raise DrillEnded(Reason.REFERENCE_MISSING, f"{path} is not a {DRILL_REFERENCE_SCHEMA}")
    return reference


def registered_of(reference: dict[str, Any]) -> tuple[int | None, str | None]:
    """The checkpoint as Gantry registered it: (step, manifest digest) from its reference;
    None where the reference does not say (standalone, or registered before digests). A
    value of the wrong type is a reference the drill cannot hold the checkpoint to."""
    step = reference.get("checkpoint_step")
    digest = reference.get("manifest_digest")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise DrillEnded(Reason.REFERENCE_INCOMPLETE, f"reference checkpoint_step {step!r}")
    if digest is not None and not isinstance(digest, str):
        raise DrillEnded(Reason.REFERENCE_INCOMPLETE, f"reference manifest_digest {digest!r}")
    return step, digest or None


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
        "state_tolerance": extra["state_tolerance"],
        "steps_requested": k,
        "steps_compared": 0,
        "steps": [],
        "first_divergence": None,
        "state": {"at_load": None, "at_end": None},
        "ranks": [],
        "timings": {
            "integrity_s": None,
            "load_s": None,
            "fingerprint_s": None,
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
    reference_path: str
    k: int
    env: dist.DistEnv
    device: torch.device
    doc: dict[str, Any]
    nodes: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    cfg: Config | None = None
    reference: dict[str, Any] = field(default_factory=dict)
    # Restore with this strategy instead of the checkpoint's (None: the checkpoint's).
    strategy: str | None = None
    # The checkpoint as Gantry registered it (None: not said): step, manifest digest.
    registered: tuple[int | None, str | None] = (None, None)

    @property
    def timings(self) -> dict[str, Any]:
        return self.doc["timings"]

    @property
    def step0(self) -> int:
        return int(self.manifest["step"])

    def read_reference(self) -> None:
        self.reference = read_reference(self.reference_path)
        self.doc["reference_digest"] = json_digest(self.reference)
        self.registered = registered_of(self.reference)

    def check_integrity(self) -> None:
        """Rank 0 checks that the directory holds the checkpoint Gantry registered, then
        every file (each rank re-verifies what it loads later)."""
        t0 = time.perf_counter()
        step, digest = self.registered
        rep = (
            ck.verify(self.checkpoint, deep=False, registered_step=step, registered_digest=digest)
            if self.env.rank == 0
            else None
        )
        rep = dist.broadcast_object(rep)
        self.timings["integrity_s"] = time.perf_counter() - t0
        assert rep is not None
        keys = ("ok", "reason", "reason_code", "files", "state_keys", "missing_state", "bytes")
        self.doc["integrity"] = {key: rep.get(key) for key in keys}
        self.doc["checkpoint"].update(
            step=rep["step"],
            world_size_at_save=rep["world_size_at_save"],
            manifest_digest=rep.get("manifest_digest"),
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

    def check_consistency(self) -> None:
        """The manifest and config are readable; every rank's files agree with them."""
        self.manifest = ck.load_manifest(self.checkpoint)
        try:
            self.cfg = validate(self.manifest["config"])
        except ConfigError as exc:
            raise DrillEnded(Reason.LOAD_ERROR, f"checkpoint config invalid: {exc}") from None
        saved_strategy = ck.strategy_of(self.manifest)
        if self.strategy is not None and self.strategy != self.cfg.strategy:
            self.cfg = self.cfg.replace(strategy=self.strategy)
        self.doc["allocation"]["strategy"] = self.cfg.strategy
        w_save = int(self.manifest["world_size"])
        self.doc["checkpoint"].update(
            step=self.step0,
            world_size_at_save=w_save,
            global_batch=self.cfg.batch_size * w_save,
            created=self.manifest.get("created"),
            async_save=self.manifest.get("async"),
            precision=self.manifest.get("precision"),
            device_type=self.manifest.get("device_type"),
            deterministic=self.manifest.get("deterministic"),
            config_sha256=self.manifest.get("config_sha256"),
            trainer_digest=(self.manifest.get("versions") or {}).get("trainer_digest"),
            strategy=saved_strategy,
        )
        problems = ck.rank_consistency(self.checkpoint, self.manifest) if self.env.rank == 0 else []
        problems = dist.broadcast_object(problems)
        if problems:
            raise DrillEnded(Reason.INCONSISTENT_STATE, "; ".join(problems[:5]))

    def check_data(self) -> None:
        """The data this trainer would produce is the run's, and so is the checkpoint's."""
        assert self.cfg is not None
        wanted = self.reference.get("dataset_sha256")
        produced = MarkovSource(self.cfg).definition_sha256()
        saved = self.manifest.get("dataset_sha256")
        self.doc["dataset"] = {"reference": wanted, "produced": produced, "checkpoint": saved}
        if wanted and produced != wanted:
            raise DrillEnded(
                Reason.DATASET_CHANGED,
                f"this trainer produces dataset {produced[:16]}... from the run's config, the run "
                f"used {wanted[:16]}...: the drill cannot replay the original run",
            )
        if wanted and saved and saved != wanted:
            raise DrillEnded(
                Reason.INCONSISTENT_STATE,
                f"the checkpoint was saved from dataset {saved[:16]}..., not the run's "
                f"{wanted[:16]}...",
            )

    def choose_mode(self, mode: str) -> None:
        """Which steps can be compared, whether the allocation fits, exact or tolerance."""
        assert self.cfg is not None
        losses = self.reference.get("losses") or {}
        if str(self.step0) not in (self.reference.get("fingerprints") or {}):
            raise DrillEnded(
                Reason.REFERENCE_INCOMPLETE,
                f"the reference has no state fingerprint of step {self.step0}",
            )
        end = self.step0 + self.k
        wanted = [s for s in range(self.step0 + 1, end + 1) if str(s) in losses]
        if not wanted and self.k > 0:
            raise DrillEnded(
                Reason.REFERENCE_MISSING,
                f"reference has no steps after {self.step0} (in ({self.step0}, {end}])",
            )
        w_save = int(self.manifest["world_size"])
        g_save = self.cfg.batch_size * w_save
        if g_save % self.env.world_size != 0:
            raise DrillEnded(
                Reason.ALLOCATION_INCOMPATIBLE,
                f"allocation incompatible because the global batch {g_save} (world size "
                f"{w_save} x {self.cfg.batch_size}) cannot be split evenly over "
                f"{self.env.world_size} ranks",
            )
        same_device = self.device.type == self.manifest.get("device_type", "cpu")
        deterministic = self.device.type == "cpu" or bool(self.manifest.get("deterministic"))
        exact_possible = (
            self.env.world_size == w_save
            and self.cfg.strategy == ck.strategy_of(self.manifest)
            and same_device
            and deterministic
            and self.manifest.get("torch_threads") in (None, torch.get_num_threads())
        )
        if mode == "exact" and not exact_possible:
            raise DrillEnded(
                Reason.ALLOCATION_INCOMPATIBLE,
                "allocation incompatible because exact mode needs the same world size, "
                "strategy, device type and thread count as at save, and a deterministic run",
            )
        exact = mode == "exact" or (mode == "auto" and exact_possible)
        self.doc["mode"] = "exact" if exact else "tolerance"
        if exact:
            self.doc["tolerance"] = 0.0
            self.doc["state_tolerance"] = 0.0
        self.doc["steps_compared"] = len(wanted)

    def load(self) -> Session:
        """Every rank loads (and re-hashes) its part; the first rank's failure ends it."""
        assert self.cfg is not None
        t0 = time.perf_counter()
        session = Session(self.cfg, self.env, self.device)
        err: str | None = None
        code: str | None = None
        lrep: dict[str, Any] = {}
        collective = False
        # The slices read are checked against Gantry's fingerprint of this step.
        expected = (self.reference.get("fingerprints") or {}).get(str(self.step0))
        try:
            lrep = session.load(self.checkpoint, self.manifest, expected, Reason.STATE_MISMATCH)
        except ck.CheckpointError as exc:
            err, code, collective = exc.reason, exc.code, exc.collective
        except Exception as exc:
            err, code = f"{type(exc).__name__}: {exc}", Reason.LOAD_ERROR
        per_rank = {
            "rank": self.env.rank,
            "node": self.env.node,
            "files_verified": len(lrep.get("files_verified", [])),
            "files": lrep.get("files_verified", []),
            "ranges": lrep.get("ranges", []),
            "slices_checked": lrep.get("slices_checked", 0),
            "bytes": lrep.get("bytes", 0),
            "data_bytes": lrep.get("data_bytes"),
            "ok": err is None,
            "detail": err or "; ".join(lrep.get("notes", [])) or "loaded",
        }
        self.doc["ranks"] = dist.all_gather_object(per_rank, self.env)
        self.timings["load_s"] = time.perf_counter() - t0
        bad = [r for r in self.doc["ranks"] if not r["ok"]]
        if bad:
            codes = dist.all_gather_object(code, self.env)
            first = next(c for c in codes if c)
            # A collective failure (a slice's digest summed over ranks) names its rank.
            where = "" if collective else f"rank {bad[0]['rank']}: "
            raise DrillEnded(first, f"{where}{bad[0]['detail']}")
        return session

    def compare_state(self, session: Session, step: int, *, exact: bool, what: str) -> None:
        """The live state against the reference fingerprint at ``step``; ends the drill
        with ``state_mismatch`` naming the tensors that differ."""
        t0 = time.perf_counter()
        # Bit for bit needs only the exact digests; a distance needs the sums and sketch.
        observed = session.fingerprint_now(full=not exact)
        self.timings["fingerprint_s"] = (
            (self.timings["fingerprint_s"] or 0.0) + time.perf_counter() - t0
        )
        reference = (self.reference.get("fingerprints") or {}).get(str(step))
        tolerance = float(self.doc["state_tolerance"] or DEFAULT_STATE_TOLERANCE)
        same_ranks = self.env.world_size == int(self.manifest["world_size"])
        problems = (
            fingerprint.compare(
                observed,
                reference,
                exact=exact,
                tolerance=tolerance,
                # Ranks beyond the saved world size are seeded afresh; after replay on another
                # shape the RNG streams legitimately differ.
                compare_rng=exact or what == "at_load",
            )
            if reference
            else []
        )
        self.doc["state"][what] = {
            "step": step,
            "exact": exact,
            "tolerance": 0.0 if exact else tolerance,
            "compared": reference is not None,
            "tensors": len(observed.get("tensors", {})),
            "same_world_size": same_ranks,
            "problems": problems[:50],
        }
        if problems:
            named = ", ".join(p["key"] for p in problems[:6])
            more = f" and {len(problems) - 6} more" if len(problems) > 6 else ""
            raise DrillEnded(
                Reason.STATE_MISMATCH,
                f"the state {'loaded' if what == 'at_load' else f'at step {step}'} differs from "
                f"the run's: {named}{more} ({problems[0]['detail']})",
            )

    def replay(self, session: Session) -> dict[int, float]:
        """K steps from the loaded state; an exception on any rank ends the drill."""
        t0 = time.perf_counter()
        losses: dict[int, float] = {}
        error: str | None = None
        try:
            for _ in range(self.k):
                result = session.train_step()
                losses[session.step] = result["loss"]
        except Exception as exc:
            error = f"step {session.step + 1}: {type(exc).__name__}: {exc}"
        self.timings["steps_s"] = time.perf_counter() - t0
        self.timings["per_step_s"] = self.timings["steps_s"] / self.k if self.k else None
        errors = [e for e in dist.all_gather_object(error, self.env) if e]
        if errors:
            raise DrillEnded(
                Reason.STEP_ERROR,
                f"the loaded state cannot be trained: {errors[0].splitlines()[0][:400]}",
            )
        return losses

    def compare_losses(self, losses: dict[int, float]) -> None:
        exact = self.doc["mode"] == "exact"
        ref = self.reference.get("losses") or {}
        for s in range(self.step0 + 1, self.step0 + self.k + 1):
            reference = ref.get(str(s))
            entry = _compare(
                s,
                losses[s],
                None if reference is None else float(reference),
                exact,
                self.doc["tolerance"],
            )
            self.doc["steps"].append(entry)
            if entry["ok"] is False and self.doc["first_divergence"] is None:
                self.doc["first_divergence"] = dict(entry)
        fd = self.doc["first_divergence"]
        if fd is not None:
            what = "differs from" if exact else f"exceeds tolerance {self.doc['tolerance']:g} vs"
            raise DrillEnded(
                Reason.LOSS_DIVERGED,
                f"loss diverged at step {fd['step']}: {fd['loss']!r} {what} reference "
                f"{fd['reference']!r} (abs diff {fd['abs_diff']:.3g}, rel diff "
                f"{fd['rel_diff']:.3g})",
            )

    def check_complete(self) -> None:
        """A drill that compared fewer steps than asked proves less than it claims."""
        if self.doc["steps_compared"] < self.k:
            raise DrillEnded(
                Reason.STEPS_SHORT,
                f"the reference has {self.doc['steps_compared']} of the {self.k} steps asked "
                "for: the drill could not compare them all",
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


def _run_steps(drill: Drill, mode: str) -> None:
    fingerprint.prepare()  # the hash tables, built while the integrity check runs
    drill.read_reference()
    drill.check_integrity()
    drill.check_consistency()
    drill.check_data()
    drill.choose_mode(mode)
    session = drill.load()
    exact = drill.doc["mode"] == "exact"
    # Loading moves bytes, never changes them: bit for bit on any allocation.
    drill.compare_state(session, drill.step0, exact=True, what="at_load")
    losses = drill.replay(session)
    drill.compare_losses(losses)
    end = drill.step0 + drill.k
    if drill.k and str(end) in (drill.reference.get("fingerprints") or {}):
        drill.compare_state(session, end, exact=exact, what="at_end")
    drill.check_complete()


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
    state_tolerance: float = DEFAULT_STATE_TOLERANCE,
    strategy: str | None = None,
) -> int:
    """Returns the exit code: 0 passed, 1 failed, 5 inconclusive (drill.json by rank 0).
    ``strategy``: restore with it instead of the checkpoint's (a tolerance drill)."""
    t_all = time.perf_counter()
    doc = _empty_report(
        checkpoint,
        reference,
        k,
        env,
        device,
        backend=backend,
        tolerance=tolerance,
        state_tolerance=state_tolerance,
    )
    doc["allocation"]["strategy"] = strategy  # None until the checkpoint's is read
    drill = Drill(checkpoint, reference, k, env, device, doc, strategy=strategy)
    drill.nodes = dist.all_gather_object(env.node, env)
    doc["allocation"]["nodes"] = drill.nodes
    try:
        _run_steps(drill, mode)
        ended = DrillEnded(None, None)
    except DrillEnded as verdict:
        ended = verdict
    doc["reason_code"] = ended.code
    doc["reason"] = ended.reason
    doc["verdict"] = verdict_for(ended.code)
    doc["timings"]["total_s"] = time.perf_counter() - t_all
    if env.rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        ck.atomic_write_json(out, doc)
        suffix = f" [{ended.code}] {ended.reason}" if ended.code else ""
        print(f"trainer drill: {doc['verdict']}{suffix}", flush=True)
    return {"passed": 0, "failed": 1, "inconclusive": 5}.get(doc["verdict"], 3)
