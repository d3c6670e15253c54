"""Checkpoints: per-rank files + a manifest written last; verification; retention.

Layout ``<root>/step-NNNNNN/``:

* ``rank-KKKKK.pt``   one torch file per rank (rank 0 also holds model/optimizer/scheduler)
* ``rank-KKKKK.json`` sidecar written atomically by rank K after its file is fsynced:
  name, size, sha256, keys, and the ``save_id`` of the training session
* ``manifest.json``   written LAST by rank 0 once every rank's sidecar for this save_id is
  present: temp file + fsync + rename + fsync of the directory.

A directory without ``manifest.json`` is not a checkpoint. Sidecars are how rank 0 learns the
other ranks' file hashes without a collective in a background thread (collectives would race
with DDP's); they need the shared filesystem the checkpoint directory lives on anyway.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.serialization import config as _ser_config

MANIFEST = "manifest.json"
FORMAT = "gantry-trainer-checkpoint/1"
STEP_RE = re.compile(r"^step-(\d{6,})$")
RANK0_KEYS = ("model", "optimizer", "scheduler", "rng", "data", "meta")
RANK_KEYS = ("rng", "data", "meta")
CHUNK = 8 << 20


class CheckpointError(Exception):
    """A checkpoint that cannot be used; ``code`` is one of the drill reason codes."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def required_keys(rank: int) -> tuple[str, ...]:
    return RANK0_KEYS if rank == 0 else RANK_KEYS


# -- durable IO ----------------------------------------------------------------------------
def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: str, data: bytes | memoryview) -> None:
    """Write bytes to ``path`` and fsync the file (not atomic; caller decides the name)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        off = 0
        while off < len(view):
            off += os.write(fd, view[off : off + CHUNK * 8])
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: str, obj: Any) -> None:
    """temp file + fsync + rename + fsync(dir): readers see the old file or the whole new one."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    write_durable(tmp, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """One helper thread: hashing (hashlib releases the GIL) overlaps reads and writes."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-hash")
        return _POOL


def sha256_file(path: str) -> tuple[str, int]:
    """sha256 and size of a file; reading chunk i overlaps hashing chunk i-1."""
    h = hashlib.sha256()
    n = 0
    bufs = (bytearray(CHUNK), bytearray(CHUNK))
    fut: Future[None] | None = None
    i = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            buf = bufs[i % 2]
            got = fh.readinto(buf)
            if fut is not None:
                fut.result()
            if not got:
                break
            fut = _pool().submit(h.update, memoryview(buf)[:got])
            n += got
            i += 1
    return h.hexdigest(), n


class HashingFile:
    """Write-only file object for torch.save: bytes go straight to the descriptor while the
    helper thread hashes them (no in-memory serialized copy). Small writes are coalesced
    into a buffer so hashing and writing overlap on large blocks."""

    BUF = 4 << 20

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.h = hashlib.sha256()
        self.size = 0
        self._buf = bytearray()

    def _emit(self, mv: memoryview) -> None:
        fut = _pool().submit(self.h.update, mv)
        try:
            off, n = 0, len(mv)
            while off < n:
                off += os.write(self.fd, mv[off:])
        finally:
            fut.result()

    def _drain(self) -> None:
        if self._buf:
            self._emit(memoryview(self._buf))
            self._buf = bytearray()

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        n = len(mv)
        if n < (1 << 20):
            self._buf += mv
            if len(self._buf) >= self.BUF:
                self._drain()
        else:
            self._drain()
            self._emit(mv)
        self.size += n
        return n

    def flush(self) -> None:
        pass

    def close_durable(self) -> str:
        try:
            self._drain()
            os.fsync(self.fd)
        finally:
            os.close(self.fd)
        return self.h.hexdigest()

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def save_hashed(obj: Any, path: str) -> tuple[int, str]:
    """torch.save ``obj`` to ``path`` durably; returns (size, sha256)."""
    f = HashingFile(path)
    try:
        # the zip CRC32 would be a second full pass over the data; sha256 covers integrity
        _ser_config.save.compute_crc32 = False
        torch.save(obj, f)  # type: ignore[arg-type]
    except BaseException:
        f.abort()
        raise
    digest = f.close_durable()
    return f.size, digest


def check_file(path: str, size: int | None, sha256: str | None) -> int:
    """Check a file's size and hash against the manifest; raise CheckpointError on mismatch."""
    name = os.path.basename(path)
    try:
        actual = os.path.getsize(path)
    except FileNotFoundError:
        raise CheckpointError("missing_file", f"{name}: file is missing") from None
    if size is not None and actual != size:
        raise CheckpointError(
            "integrity_size_mismatch",
            f"{name}: size {actual} != manifest size {size}"
            + (" (truncated)" if actual < size else ""),
        )
    if sha256 is not None:
        got, actual = sha256_file(path)
        if got != sha256:
            raise CheckpointError(
                "integrity_hash_mismatch",
                f"{name}: sha256 {got[:16]}... != manifest {sha256[:16]}...",
            )
    return actual


def load_file(path: str, map_location: Any = "cpu") -> Any:
    """torch.load with mmap (the hash was checked by check_file first). The tensors are
    private mappings of the file: callers that keep them must copy (see Session.load)."""
    return torch.load(path, map_location=map_location, weights_only=True, mmap=True)


# -- snapshot --------------------------------------------------------------------------------
def clone_to_cpu(obj: Any) -> Any:
    """Deep copy with every tensor copied to CPU (the snapshot that decouples the write)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
    if isinstance(obj, dict):
        return {k: clone_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clone_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(clone_to_cpu(v) for v in obj)
    return obj


def clone_into(obj: Any, cache: dict[str, torch.Tensor], key: str = "") -> Any:
    """Like clone_to_cpu, but reuses CPU buffers from ``cache`` (same key, shape, dtype), so
    steady-state async snapshots are a memcpy without fresh allocations/page faults. Only
    safe when the previous snapshot has been written (CheckpointWriter.save waits for it)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        buf = cache.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu")
            cache[key] = buf
        buf.copy_(t)
        return buf
    if isinstance(obj, dict):
        return {k: clone_into(v, cache, f"{key}/{k}") for k, v in obj.items()}
    if isinstance(obj, list):
        return [clone_into(v, cache, f"{key}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(clone_into(v, cache, f"{key}/{i}") for i, v in enumerate(obj))
    return obj


def serialize(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def deserialize(data: bytes, map_location: Any = "cpu") -> Any:
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)


# -- listing ---------------------------------------------------------------------------------
@dataclass
class Entry:
    step: int
    path: str
    complete: bool


def list_checkpoints(root: str) -> list[Entry]:
    """All ``step-*`` directories under root, oldest first; complete = has manifest.json."""
    out: list[Entry] = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return out
    for name in names:
        m = STEP_RE.match(name)
        path = os.path.join(root, name)
        if m and os.path.isdir(path):
            out.append(Entry(int(m.group(1)), path, os.path.isfile(os.path.join(path, MANIFEST))))
    out.sort(key=lambda e: e.step)
    return out


def complete_checkpoints(root: str) -> list[Entry]:
    return [e for e in list_checkpoints(root) if e.complete]


def apply_retention(root: str, keep: int) -> list[str]:
    """Keep the newest ``keep`` complete checkpoints (never the newest one); remove older
    complete ones and incomplete directories older than the newest complete checkpoint."""
    entries = list_checkpoints(root)
    complete = [e for e in entries if e.complete]
    if not complete:
        return []
    newest = complete[-1].step
    keep_steps = {e.step for e in complete[-max(1, keep) :]}
    removed: list[str] = []
    for e in entries:
        if e.step in keep_steps or e.step >= newest:
            continue
        if e.complete:
            # drop the manifest first so a crash mid-delete leaves an incomplete dir, not a
            # "complete" checkpoint with missing files
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(e.path, MANIFEST))
        shutil.rmtree(e.path, ignore_errors=True)
        removed.append(e.path)
    return removed


# -- verification ----------------------------------------------------------------------------
def load_manifest(path: str) -> dict[str, Any]:
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise CheckpointError("missing_file", f"{path}: no such checkpoint directory")
    if not os.path.isfile(mpath):
        raise CheckpointError(
            "missing_manifest",
            f"{os.path.basename(path)}: no manifest.json (incomplete checkpoint)",
        )
    try:
        with open(mpath, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError("load_error", f"manifest.json unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError("load_error", f"manifest.json is not a {FORMAT} manifest")
    for key in ("step", "world_size", "files", "state_keys", "config"):
        if key not in manifest:
            raise CheckpointError("load_error", f"manifest.json lacks {key!r}")
    return manifest


def verify(path: str, deep: bool = True) -> dict[str, Any]:
    """Integrity report for a checkpoint directory (never raises for a bad checkpoint).

    Checks, in order: manifest present and parsable; every listed file present, of the listed
    size and sha256; the required state keys listed; with ``deep`` each file is also loaded
    and its keys checked. ``reason``/``reason_code`` describe the first failure.
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
    problems: list[tuple[str, str]] = []
    try:
        manifest = load_manifest(path)
    except CheckpointError as exc:
        report.update(reason=exc.reason, reason_code=exc.code)
        report["time_s"] = time.perf_counter() - t0
        return report
    report["step"] = manifest["step"]
    report["world_size_at_save"] = manifest["world_size"]
    report["state_keys"] = manifest["state_keys"]
    report["async"] = manifest.get("async")
    ranks_listed = set()
    for f in manifest["files"]:
        name, rank = f["name"], f["rank"]
        ranks_listed.add(rank)
        fpath = os.path.join(path, name)
        item: dict[str, Any] = {
            "name": name,
            "rank": rank,
            "size": f["size"],
            "sha256": f["sha256"],
            "exists": os.path.isfile(fpath),
            "size_ok": False,
            "sha256_ok": False,
            "keys_ok": None,
        }
        report["files"].append(item)
        if not item["exists"]:
            problems.append(("missing_file", f"{name}: file is missing"))
            continue
        actual = os.path.getsize(fpath)
        item["actual_size"] = actual
        if actual != f["size"]:
            trunc = " (truncated)" if actual < f["size"] else ""
            problems.append(
                (
                    "integrity_size_mismatch",
                    f"{name}: size {actual} != manifest size {f['size']}{trunc}",
                )
            )
            continue
        item["size_ok"] = True
        digest, n = sha256_file(fpath)
        report["bytes"] += n
        if digest != f["sha256"]:
            problems.append(
                (
                    "integrity_hash_mismatch",
                    f"{name}: sha256 {digest[:16]}... != manifest "
                    f"{f['sha256'][:16]}... (content corrupted)",
                )
            )
            continue
        item["sha256_ok"] = True
        missing_listed = [k for k in required_keys(rank) if k not in f.get("keys", [])]
        if missing_listed:
            item["keys_ok"] = False
            report["missing_state"] += [f"{k} (rank {rank})" for k in missing_listed]
            problems.append(
                ("missing_state", f"{name}: required state {', '.join(missing_listed)} not present")
            )
            continue
        if deep:
            try:
                obj = load_file(fpath)
            except Exception as exc:
                problems.append(("load_error", f"{name}: cannot be loaded: {_first_line(exc)}"))
                continue
            absent = [k for k in required_keys(rank) if not isinstance(obj, dict) or k not in obj]
            if absent:
                item["keys_ok"] = False
                report["missing_state"] += [f"{k} (rank {rank})" for k in absent]
                problems.append(
                    ("missing_state", f"{name}: required state {', '.join(absent)} not present")
                )
                continue
        item["keys_ok"] = True
    expected_ranks = set(range(int(manifest["world_size"])))
    if ranks_listed != expected_ranks:
        gone = sorted(expected_ranks - ranks_listed)
        problems.append(
            (
                "missing_file",
                f"manifest lists no file for rank(s) {gone} of world size {manifest['world_size']}",
            )
        )
    if problems:
        report["reason_code"], report["reason"] = problems[0]
        report["problems"] = [{"code": c, "reason": r} for c, r in problems]
    else:
        report["ok"] = True
    report["time_s"] = time.perf_counter() - t0
    return report


def resolve(run_dir: str | None, spec: str) -> tuple[str, list[str]]:
    """Resolve ``--resume`` to a verified checkpoint path; returns (path, notes).

    ``latest`` walks complete checkpoints newest first and falls back past bad ones (saying
    so in the notes); an explicit path that fails verification raises CheckpointError.
    """
    notes: list[str] = []
    if spec != "latest":
        rep = verify(spec, deep=True)
        if not rep["ok"]:
            raise CheckpointError(rep["reason_code"], f"{spec}: {rep['reason']}")
        return spec, notes
    if not run_dir:
        raise CheckpointError("missing_file", "--resume latest needs --run-dir")
    root = os.path.join(run_dir, "checkpoints")
    entries = list_checkpoints(root)
    for e in reversed(entries):
        name = os.path.basename(e.path)
        if not e.complete:
            notes.append(f"skipping {name}: no manifest.json (incomplete checkpoint)")
            continue
        rep = verify(e.path, deep=True)
        if rep["ok"]:
            if notes:
                notes.append(f"falling back to {name}, the newest complete checkpoint")
            return e.path, notes
        notes.append(f"skipping {name}: {rep['reason']}")
    raise CheckpointError(
        "missing_manifest",
        f"no complete checkpoint under {root}" + ("; " + "; ".join(notes) if notes else ""),
    )


# -- writer ----------------------------------------------------------------------------------
class CheckpointWriter:
    """Saves per-rank state; async (snapshot inline, write in a thread) or synchronous."""

    def __init__(
        self,
        root: str,
        rank: int,
        world_size: int,
        save_id: str,
        async_save: bool,
        keep: int,
        on_complete: Callable[[dict[str, Any]], None] | None = None,
        sidecar_timeout_s: float = 1800.0,
    ) -> None:
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.save_id = save_id
        self.async_save = async_save
        self.keep = keep
        self.on_complete = on_complete
        self.sidecar_timeout_s = sidecar_timeout_s
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.completed: list[dict[str, Any]] = []
        os.makedirs(root, exist_ok=True)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def save(
        self,
        step: int,
        snapshot_fn: Callable[[bool], dict[str, Any]],
        manifest_extra: dict[str, Any],
    ) -> float:
        """Checkpoint ``step``; returns seconds the caller was blocked.

        ``snapshot_fn(copy)`` returns the state; with ``copy`` (async) every tensor is cloned
        to CPU so training can go on; a synchronous save writes the live tensors directly.
        """
        t0 = time.perf_counter()
        self.wait()  # one save in flight at a time
        state = snapshot_fn(self.async_save)
        if self.async_save:
            blocked = time.perf_counter() - t0
            self._thread = threading.Thread(
                target=self._write_guarded,
                args=(step, state, manifest_extra, blocked),
                name=f"ckpt-{step}",
                daemon=False,
            )
            self._thread.start()
            return blocked
        self._write_guarded(step, state, manifest_extra, None)
        return time.perf_counter() - t0

    def _write_guarded(
        self, step: int, state: dict[str, Any], extra: dict[str, Any], blocked: float | None
    ) -> None:
        try:
            self._write(step, state, extra, blocked)
        except Exception as exc:  # surfaced by the trainer as an event + warning
            self.errors.append(f"step {step}: {type(exc).__name__}: {exc}")

    def _write(
        self, step: int, state: dict[str, Any], extra: dict[str, Any], blocked: float | None
    ) -> None:
        t0 = time.perf_counter()
        d = os.path.join(self.root, step_dir_name(step))
        os.makedirs(d, exist_ok=True)
        name = rank_file_name(self.rank)
        size, digest = save_hashed(state, os.path.join(d, name))
        info = {
            "name": name,
            "rank": self.rank,
            "size": size,
            "sha256": digest,
            "keys": sorted(state.keys()),
            "save_id": self.save_id,
        }
        del state
        atomic_write_json(os.path.join(d, f"rank-{self.rank:05d}.json"), info)
        if self.rank != 0:
            return
        files = self._collect_sidecars(d)
        _fault("crash_before_manifest", step)
        state_keys = sorted(
            {k for f in files for k in f["keys"] if k not in ("rng", "data", "meta")}
            | {f"{k}/rank{f['rank']}" for f in files for k in ("rng", "data")}
            | {"meta"}
        )
        manifest = {
            "format": FORMAT,
            "step": step,
            "world_size": self.world_size,
            "files": [{k: f[k] for k in ("name", "rank", "size", "sha256", "keys")} for f in files],
            "state_keys": state_keys,
            "total_bytes": sum(f["size"] for f in files),
            "created": time.time(),
            "async": self.async_save,
            "save_id": self.save_id,
            **extra,
        }
        fsync_dir(self.root)
        atomic_write_json(os.path.join(d, MANIFEST), manifest)
        removed = apply_retention(self.root, self.keep)
        result = {
            "step": step,
            "path": d,
            "bytes": manifest["total_bytes"],
            "write_s": time.perf_counter() - t0,
            "blocking_s": blocked,
            "async": self.async_save,
            "removed": removed,
        }
        self.completed.append(result)
        if self.on_complete is not None:
            self.on_complete(result)

    def _collect_sidecars(self, d: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.sidecar_timeout_s
        files: dict[int, dict[str, Any]] = {}
        while True:
            for r in range(self.world_size):
                if r in files:
                    continue
                p = os.path.join(d, f"rank-{r:05d}.json")
                try:
                    with open(p, encoding="utf-8") as fh:
                        info = json.load(fh)
                except (FileNotFoundError, json.JSONDecodeError):
                    continue
                if info.get("save_id") == self.save_id:
                    files[r] = info
            if len(files) == self.world_size:
                return [files[r] for r in range(self.world_size)]
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.world_size)) - set(files))
                raise TimeoutError(f"no sidecar from rank(s) {missing}; manifest not written")
            time.sleep(0.02)


def _fault(kind: str, step: int) -> None:
    """Test-only fault injection: TRAINER_FAULT=crash_before_manifest@STEP."""
    spec = os.environ.get("TRAINER_FAULT", "")
    if spec == f"{kind}@{step}":
        os._exit(137)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
