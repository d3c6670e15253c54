"""Verification: manifest, sizes, hashes, required state, index contents; ``--resume``."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..config import STRATEGIES
from ..schema import Reason, manifest_digest
from ..sharding import rank_summary, sharding_problems
from ..statekeys import SHARDS
from .durable import sha256_files
from .layout import (
    MANIFEST,
    READ_FORMATS,
    CheckpointError,
    first_line,
    required_keys,
    strategy_of,
)
from .listing import list_checkpoints
from .rankfile import load_rank, rank_files, read_index


def load_manifest(path: str) -> dict[str, Any]:
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise CheckpointError(Reason.MISSING_FILE, f"{path}: no such checkpoint directory")
    if not os.path.isfile(mpath):
        raise CheckpointError(
            Reason.MISSING_MANIFEST,
            f"{os.path.basename(path)}: no manifest.json (incomplete checkpoint)",
        )
    try:
        with open(mpath, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(Reason.LOAD_ERROR, f"manifest.json unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in READ_FORMATS:
        raise CheckpointError(
            Reason.LOAD_ERROR,
            f"manifest.json is not a checkpoint manifest this trainer reads "
            f"({', '.join(READ_FORMATS)})",
        )
    if strategy_of(manifest) not in STRATEGIES:
        raise CheckpointError(
            Reason.LOAD_ERROR, f"manifest.json: unknown strategy {manifest.get('strategy')!r}"
        )
    for key in ("step", "world_size", "files", "state_keys", "config"):
        if key not in manifest:
            raise CheckpointError(Reason.LOAD_ERROR, f"manifest.json lacks {key!r}")
    return manifest


Problem = tuple[str, str]  # (reason code, reason)


def _file_items(path: str, manifest: dict[str, Any], report: dict[str, Any]) -> None:
    """One report item per listed file: present, of the listed size, of the listed sha256
    (the files of the listed size are hashed in parallel)."""
    to_hash: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for f in manifest["files"]:
        fpath = os.path.join(path, f["name"])
        item: dict[str, Any] = {
            "name": f["name"],
            "rank": f["rank"],
            "role": f.get("role", "index"),
            "size": f["size"],
            "sha256": f["sha256"],
            "exists": os.path.isfile(fpath),
            "size_ok": False,
            "sha256_ok": False,
            "keys_ok": None,
        }
        report["files"].append(item)
        if not item["exists"]:
            continue
        item["actual_size"] = os.path.getsize(fpath)
        if item["actual_size"] == f["size"]:
            item["size_ok"] = True
            to_hash.append((f, item))
    digests = sha256_files([os.path.join(path, f["name"]) for f, _ in to_hash])
    for (f, item), res in zip(to_hash, digests, strict=True):
        if isinstance(res, BaseException):
            item["error"] = first_line(res)
            continue
        digest, n = res
        report["bytes"] += n
        item["actual_sha256"] = digest
        item["sha256_ok"] = digest == f["sha256"]


def _file_problem(f: dict[str, Any], item: dict[str, Any], sharded: bool = False) -> Problem:
    name = f["name"]
    if not item["exists"]:
        # In a sharded checkpoint no other rank holds these slices: say whose they are.
        whose = f" (rank {f['rank']}'s shard of the model and optimizer state)" if sharded else ""
        return Reason.MISSING_FILE, f"{name}: file is missing{whose}"
    if not item["size_ok"]:
        actual, size = item["actual_size"], f["size"]
        trunc = " (truncated)" if actual < size else ""
        return (
            Reason.INTEGRITY_SIZE_MISMATCH,
            f"{name}: size {actual} != manifest size {size}{trunc}",
        )
    if "error" in item:
        return Reason.LOAD_ERROR, f"{name}: cannot be read: {item['error']}"
    return (
        Reason.INTEGRITY_HASH_MISMATCH,
        f"{name}: sha256 {item['actual_sha256'][:16]}... != manifest "
        f"{f['sha256'][:16]}... (content corrupted)",
    )


def _missing_state(
    report: dict[str, Any], item: dict[str, Any], rank: int, missing: list[str]
) -> Problem:
    item["keys_ok"] = False
    report["missing_state"] += [f"{k} (rank {rank})" for k in missing]
    return Reason.MISSING_STATE, f"{item['name']}: required state {', '.join(missing)} not present"


def _index_problem(
    path: str,
    manifest: dict[str, Any],
    f: dict[str, Any],
    item: dict[str, Any],
    report: dict[str, Any],
    deep: bool,
) -> Problem | None:
    """The required state keys of a rank's (intact) index: as listed in the manifest, and
    with ``deep`` as the index itself holds them and the data files it describes."""
    rank = int(f["rank"])
    required = required_keys(rank, strategy_of(manifest))
    missing_listed = [k for k in required if k not in f.get("keys", [])]
    if missing_listed:
        return _missing_state(report, item, rank, missing_listed)
    if deep:
        try:
            index = read_index(path, f, rank_files(manifest, rank)[1])
        except CheckpointError as exc:
            return exc.code, exc.reason
        absent = [k for k in required if k not in index["state"]]
        if absent:
            return _missing_state(report, item, rank, absent)
    item["keys_ok"] = True
    return None


def _problems(
    path: str, manifest: dict[str, Any], report: dict[str, Any], deep: bool
) -> list[Problem]:
    """Every file not as listed (``_file_items`` filled ``report``), every intact index
    without its required state, every rank of the world size without an index."""
    problems: list[Problem] = []
    bad_ranks: set[int] = set()
    pairs = list(zip(manifest["files"], report["files"], strict=True))
    for f, item in pairs:
        if not item["sha256_ok"]:
            bad_ranks.add(int(f["rank"]))
            problems.append(_file_problem(f, item, strategy_of(manifest) == "fsdp"))
    ranks_listed: set[int] = set()
    for f, item in pairs:
        if item["role"] != "index":
            continue
        ranks_listed.add(int(f["rank"]))
        if int(f["rank"]) not in bad_ranks:
            problem = _index_problem(path, manifest, f, item, report, deep)
            if problem is not None:
                problems.append(problem)
    expected_ranks = set(range(int(manifest["world_size"])))
    if ranks_listed != expected_ranks:
        gone = sorted(expected_ranks - ranks_listed)
        problems.append(
            (
                Reason.MISSING_FILE,
                f"manifest lists no index file for rank(s) {gone} of world size "
                f"{manifest['world_size']}",
            )
        )
    return problems


def registration_problem(
    path: str, manifest: dict[str, Any], *, step: int | None, digest: str | None
) -> str | None:
    """Why the manifest in ``path`` is not the one Gantry registered for this checkpoint
    (its ``step``, its ``digest``: ``schema.manifest_digest``), or None. Another complete,
    self-consistent checkpoint put in its place (another step of the same run, another
    save) passes every other check, so this one comes first. Unset expectations (a
    standalone drill, a checkpoint registered before digests) are not checked."""
    found = manifest.get("step")
    actual = manifest_digest(manifest)
    problems = []
    if step is not None and (isinstance(found, bool) or found != step):
        problems.append(f"it holds step {found!r}, Gantry registered step {step}")
    if digest and actual != digest:
        problems.append(
            f"its manifest digest is {actual[:16]}..., Gantry registered {digest[:16]}..."
        )
    if not problems:
        return None
    return (
        f"{os.path.basename(os.path.normpath(path))}: not the checkpoint Gantry registered: "
        + "; ".join(problems)
    )


def verify(
    path: str,
    deep: bool = True,
    *,
    registered_step: int | None = None,
    registered_digest: str | None = None,
) -> dict[str, Any]:
    """Integrity report for a checkpoint directory (never raises for a bad checkpoint).

    Checks, in order: manifest present and parsable; the manifest is the one Gantry
    registered (``registered_step``, ``registered_digest``; else ``not_as_registered``,
    and nothing more is checked); every listed file (index and data files of every rank)
    present, of the listed size and sha256 (files hashed in parallel); each rank has an
    index listing the required state keys; with ``deep`` each index is also loaded, its
    keys checked and its data-file list matched against the manifest.
    ``reason``/``reason_code`` describe the first failure.
    """
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "path": os.path.abspath(path),
        "ok": False,
        "reason": None,
        "reason_code": None,
        "step": None,
        "world_size_at_save": None,
        "files": [],
        "state_keys": [],
        "missing_state": [],
        "bytes": 0,
        "time_s": 0.0,
    }
    try:
        manifest = load_manifest(path)
    except CheckpointError as exc:
        report.update(reason=exc.reason, reason_code=exc.code)
        report["time_s"] = time.perf_counter() - t0
        return report
    report["step"] = manifest["step"]
    report["manifest_digest"] = manifest_digest(manifest)
    report["world_size_at_save"] = manifest["world_size"]
    swapped = registration_problem(path, manifest, step=registered_step, digest=registered_digest)
    if swapped is not None:
        report.update(reason=swapped, reason_code=Reason.NOT_AS_REGISTERED)
        report["problems"] = [{"code": Reason.NOT_AS_REGISTERED, "reason": swapped}]
        report["time_s"] = time.perf_counter() - t0
        return report
    report["state_keys"] = manifest["state_keys"]
    report["async"] = manifest.get("async")
    report["strategy"] = strategy_of(manifest)
    report["ranks"] = rank_summary(manifest)
    _file_items(path, manifest, report)
    problems = _problems(path, manifest, report, deep)
    if problems:
        report["reason_code"], report["reason"] = problems[0]
        report["problems"] = [{"code": c, "reason": r} for c, r in problems]
    else:
        report["ok"] = True
    report["time_s"] = time.perf_counter() - t0
    return report


def _resumable(path: str) -> tuple[str, str] | None:
    """Why ``path`` cannot be resumed from (code, reason), or None: every file intact
    (``verify``) and every rank's index consistent with the manifest and the sharding."""
    rep = verify(path, deep=True)
    if not rep["ok"]:
        return rep["reason_code"], rep["reason"]
    problems = rank_consistency(path, load_manifest(path))
    if problems:
        return Reason.INCONSISTENT_STATE, "; ".join(problems[:3])
    return None


def resolve(run_dir: str | None, spec: str) -> tuple[str, list[str]]:
    """Resolve ``--resume`` to a verified checkpoint path; returns (path, notes).

    ``latest`` walks complete checkpoints newest first and falls back past bad ones (saying
    so in the notes); an explicit path that fails verification or rank consistency raises
    CheckpointError.
    """
    notes: list[str] = []
    if spec != "latest":
        bad = _resumable(spec)
        if bad is not None:
            raise CheckpointError(bad[0], f"{spec}: {bad[1]}")
        return spec, notes
    if not run_dir:
        raise CheckpointError(Reason.MISSING_FILE, "--resume latest needs --run-dir")
    root = os.path.join(run_dir, "checkpoints")
    entries = list_checkpoints(root)
    for e in reversed(entries):
        name = os.path.basename(e.path)
        if not e.complete:
            notes.append(f"skipping {name}: no manifest.json (incomplete checkpoint)")
            continue
        bad = _resumable(e.path)
        if bad is None:
            if notes:
                notes.append(f"falling back to {name}, the newest complete checkpoint")
            return e.path, notes
        notes.append(f"skipping {name}: {bad[1]}")
    raise CheckpointError(
        Reason.MISSING_MANIFEST,
        f"no complete checkpoint under {root}" + ("; " + "; ".join(notes) if notes else ""),
    )


def read_rank(path: str, rank: int = 0) -> dict[str, Any]:
    """Convenience: the verified state of ``rank`` in the checkpoint at ``path``."""
    return load_rank(path, load_manifest(path), rank)[0]


def rank_consistency(path: str, manifest: dict[str, Any]) -> list[str]:
    """Every rank's index agrees with the manifest and with the others: the same step,
    save, world size and global data position, and its own rank number. A rank file copied
    from another step or another run (its hashes made valid) is caught here. Returns the
    problems in words (empty when consistent). Needs an intact checkpoint (``verify``)."""
    problems: list[str] = []
    step = int(manifest["step"])
    world = int(manifest["world_size"])
    save_id = manifest.get("save_id")
    positions: dict[int, Any] = {}
    datasets: dict[int, Any] = {}
    own_shards: dict[int, dict[str, Any]] = {}
    for rank in range(world):
        try:
            entry, data_files = rank_files(manifest, rank)
            index = read_index(path, entry, data_files)
        except CheckpointError as exc:
            problems.append(f"rank {rank}: {exc.reason}")
            continue
        state = index["state"]
        meta = state.get("meta") if isinstance(state.get("meta"), dict) else {}
        data = state.get("data") if isinstance(state.get("data"), dict) else {}
        name = entry["name"]
        if meta.get("step") != step:
            problems.append(f"{name}: holds step {meta.get('step')}, the manifest step {step}")
        if meta.get("rank") != rank:
            problems.append(f"{name}: holds rank {meta.get('rank')}'s state, not rank {rank}'s")
        if meta.get("world_size") != world or data.get("world_size") != world:
            problems.append(
                f"{name}: saved at world size {meta.get('world_size')}, the manifest says {world}"
            )
        if save_id and meta.get("save_id") not in (None, save_id):
            problems.append(f"{name}: written by another training session than the manifest's")
        positions[rank] = data.get("samples_consumed")
        datasets[rank] = data.get("dataset_sha256")
        if isinstance(state.get(SHARDS), dict):
            own_shards[rank] = state[SHARDS]
    if len(set(positions.values())) > 1:
        problems.append(f"ranks disagree on the data position: {positions}")
    if len(set(datasets.values())) > 1:
        problems.append("ranks disagree on the dataset")
    elif datasets and manifest.get("dataset_sha256") not in (None, *datasets.values()):
        problems.append("the ranks' dataset is not the manifest's")
    if "sharding" in manifest:
        problems += sharding_problems(manifest, own_shards)
    configured = (manifest.get("config") or {}).get("strategy", "ddp")
    if strategy_of(manifest) != configured:
        problems.append(
            f"the manifest says strategy {strategy_of(manifest)!r}, its config {configured!r}"
        )
    return problems
