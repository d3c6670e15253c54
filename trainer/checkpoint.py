"""Checkpoints: per-rank files + a manifest written last; verification; retention.

Layout ``<root>/step-NNNNNN/`` (format ``gantry-trainer-checkpoint/2``):

* ``rank-KKKKK.pt``        per-rank *index*: ``torch.save`` of the state with every tensor
  replaced by a reference, plus the tensor table (dtype, shape, offset, nbytes) and the list
  of data files. Small; loadable with ``torch.load(weights_only=True)``.
* ``rank-KKKKK-NNNN.bin``  the rank's tensor bytes, concatenated in table order and cut into
  files of at most ``DATA_CHUNK`` bytes. Written straight from tensor memory (no serialised
  copy); each file is hashed, written and fsynced by a worker of a small thread pool, so
  sha256 (which releases the GIL) runs on every core while other files are written/flushed.
* ``rank-KKKKK.json``      sidecar written atomically by rank K after all its files are
  fsynced: every file's name, role, size and sha256, the state keys, and the ``save_id``.
* ``manifest.json``        written LAST by rank 0 once every rank's sidecar for this save_id
  is present: temp file + fsync + rename + fsync of the directory. Lists every file of every
  rank with its size and sha256.

A directory without ``manifest.json`` is not a checkpoint. Sidecars are how rank 0 learns the
other ranks' file hashes without a collective in a background thread (collectives would race
with DDP's); they need the shared filesystem the checkpoint directory lives on anyway.
Loading reads each data file with large reads straight into the new tensors' memory and
hashes the same bytes (files in parallel); a mismatch names the file.
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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

MANIFEST = "manifest.json"
FORMAT = "gantry-trainer-checkpoint/2"
INDEX_FORMAT = "gantry-trainer-rank-index/2"
STEP_RE = re.compile(r"^step-(\d{6,})$")
RANK0_KEYS = ("model", "optimizer", "scheduler", "rng", "data", "meta")
RANK_KEYS = ("rng", "data", "meta")
DATA_CHUNK = 32 << 20  # max bytes per data file
BLOCK = 256 << 10  # hash/write/read step inside a file: small enough to stay in cache
_REF = "__gantry_tensor__"


class CheckpointError(Exception):
    """A checkpoint that cannot be used; ``code`` is one of the drill reason codes."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def rank_file_name(rank: int) -> str:
    """The rank's index file (its data files are ``data_file_name(rank, i)``)."""
    return f"rank-{rank:05d}.pt"


def data_file_name(rank: int, i: int) -> str:
    return f"rank-{rank:05d}-{i:04d}.bin"


def sidecar_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def required_keys(rank: int) -> tuple[str, ...]:
    return RANK0_KEYS if rank == 0 else RANK_KEYS


# -- durable IO ----------------------------------------------------------------------------
def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, mv: memoryview) -> None:
    off, n = 0, len(mv)
    while off < n:
        off += os.write(fd, mv[off:])


def write_durable(path: str, data: bytes | memoryview) -> None:
    """Write bytes to ``path`` and fsync the file (not atomic; caller decides the name)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, memoryview(data))
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


def io_workers() -> int:
    """Threads for checkpoint IO: one more than the cores, so one can wait on the disk
    (write/fsync/read) while the others hash; at least 2, at most 8."""
    env = os.environ.get("TRAINER_CKPT_THREADS")
    if env:
        return max(1, int(env))
    return max(2, min(8, (os.cpu_count() or 1) + 1))


def _pool() -> ThreadPoolExecutor:
    """Shared pool for hashing/IO (hashlib and os.read/write release the GIL). Tasks never
    submit to the pool themselves, so callers may wait on it from any thread."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=io_workers(), thread_name_prefix="ckpt-io")
        return _POOL


def _blocks(mv: memoryview) -> Iterator[memoryview]:
    for off in range(0, len(mv), BLOCK):
        yield mv[off : off + BLOCK]


def _write_hashed(path: str, pieces: list[memoryview]) -> tuple[int, str]:
    """Hash, write and fsync ``pieces`` into a new file; returns (size, sha256). Every byte is
    hashed from the same memory it is written from."""
    h = hashlib.sha256()
    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for piece in pieces:
            for mv in _blocks(piece):
                h.update(mv)
                _write_all(fd, mv)
                n += len(mv)
        os.fsync(fd)
    finally:
        os.close(fd)
    return n, h.hexdigest()


def _hash_file(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    buf = bytearray(BLOCK)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while True:
            got = fh.readinto(mv)
            if not got:
                break
            h.update(mv[:got])
            n += got
    return h.hexdigest(), n


def sha256_file(path: str) -> tuple[str, int]:
    """sha256 and size of a file."""
    return _hash_file(path)


def sha256_files(paths: list[str]) -> list[tuple[str, int] | BaseException]:
    """sha256 and size of several files, hashed in parallel (errors returned, not raised)."""
    futs = [_pool().submit(_hash_file, p) for p in paths]
    out: list[tuple[str, int] | BaseException] = []
    for f in futs:
        try:
            out.append(f.result())
        except Exception as exc:
            out.append(exc)
    return out


# -- rank state <-> index + raw tensor data ----------------------------------------------------
def _byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    if t.numel() == 0:
        return memoryview(b"")
    return t.reshape(-1).view(torch.uint8).numpy().data


def _flatten(obj: Any, tensors: list[torch.Tensor], seen: dict[tuple[Any, ...], int]) -> Any:
    """Replace tensors by ``{_REF: i}``, collecting them (deduplicated) in ``tensors``."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        key = (t.data_ptr(), t.dtype, tuple(t.shape))
        idx = seen.get(key)
        if idx is None:
            idx = seen[key] = len(tensors)
            tensors.append(t)  # kept alive, so data_ptr keys cannot be reused
        return {_REF: idx}
    if isinstance(obj, dict):
        return {k: _flatten(v, tensors, seen) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_flatten(v, tensors, seen) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_flatten(v, tensors, seen) for v in obj)
    return obj


def _unflatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if len(obj) == 1 and _REF in obj:
            return tensors[obj[_REF]]
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_unflatten(v, tensors) for v in obj)
    return obj


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def _pieces(
    table: list[dict[str, Any]], views: list[memoryview], a: int, b: int
) -> list[memoryview]:
    """Views of the stream bytes [a, b) (tensor ``i`` occupies [offset, offset+nbytes))."""
    out = []
    for ent, mv in zip(table, views, strict=True):
        lo, hi = ent["offset"], ent["offset"] + ent["nbytes"]
        if hi <= a or lo >= b or hi == lo:
            continue
        out.append(mv[max(a, lo) - lo : min(b, hi) - lo])
    return out


def save_rank(state: dict[str, Any], d: str, rank: int) -> list[dict[str, Any]]:
    """Write one rank's state durably as an index file + data files (in parallel); returns
    [{name, role, size, sha256}] with the index first. Every file is fsynced on return."""
    tensors: list[torch.Tensor] = []
    skeleton = _flatten(state, tensors, {})
    views = [_byte_view(t) for t in tensors]
    table: list[dict[str, Any]] = []
    off = 0
    for t, mv in zip(tensors, views, strict=True):
        dt = str(t.dtype).removeprefix("torch.")
        table.append({"dtype": dt, "shape": list(t.shape), "offset": off, "nbytes": len(mv)})
        off += len(mv)
    total = off
    data_files: list[dict[str, Any]] = []
    for i, a in enumerate(range(0, total, DATA_CHUNK)):
        b = min(total, a + DATA_CHUNK)
        data_files.append({"name": data_file_name(rank, i), "offset": a, "size": b - a})
    index = {
        "format": INDEX_FORMAT,
        "rank": rank,
        "state": skeleton,
        "tensors": table,
        "data_files": data_files,
        "data_bytes": total,
    }
    index_bytes = serialize(index)
    pool = _pool()
    jobs = [
        (
            data_file_name(rank, i),
            "data",
            pool.submit(
                _write_hashed,
                os.path.join(d, f["name"]),
                _pieces(table, views, f["offset"], f["offset"] + f["size"]),
            ),
        )
        for i, f in enumerate(data_files)
    ]
    idx_name = rank_file_name(rank)
    jobs.insert(
        0,
        (
            idx_name,
            "index",
            pool.submit(_write_hashed, os.path.join(d, idx_name), [memoryview(index_bytes)]),
        ),
    )
    out, err = [], None
    for name, role, fut in jobs:  # wait for all, even after a failure
        try:
            size, digest = fut.result()
            out.append({"name": name, "role": role, "size": size, "sha256": digest})
        except Exception as exc:
            err = err or exc
    if err is not None:
        raise err
    return out


def _read_into(path: str, pieces: list[memoryview], size: int) -> str:
    """Read a file straight into ``pieces`` (in order) with large reads, hashing the same
    bytes; returns the sha256. Raises if the file is shorter or longer than ``size``."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        n = 0
        for piece in pieces:
            for mv in _blocks(piece):
                got = 0
                while got < len(mv):
                    k = os.readv(fd, [mv[got:]])
                    if k == 0:
                        raise CheckpointError(
                            "integrity_size_mismatch",
                            f"{os.path.basename(path)}: shorter than the manifest size "
                            f"{size} (truncated)",
                        )
                    got += k
                h.update(mv)
                n += got
        if n != size or os.read(fd, 1):
            raise CheckpointError(
                "integrity_size_mismatch",
                f"{os.path.basename(path)}: size differs from the manifest size {size}",
            )
    finally:
        os.close(fd)
    return h.hexdigest()


def rank_files(manifest: dict[str, Any], rank: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(index entry, data entries) of ``rank`` in the manifest; missing_file if no index."""
    mine = [f for f in manifest["files"] if int(f["rank"]) == rank]
    index = [f for f in mine if f.get("role", "index") == "index"]
    if not index:
        raise CheckpointError("missing_file", f"manifest lists no index file for rank {rank}")
    return index[0], [f for f in mine if f.get("role") == "data"]


def _check_present(path: str, f: dict[str, Any]) -> None:
    name = f["name"]
    try:
        actual = os.path.getsize(os.path.join(path, name))
    except FileNotFoundError:
        raise CheckpointError("missing_file", f"{name}: file is missing") from None
    if actual != f["size"]:
        raise CheckpointError(
            "integrity_size_mismatch",
            f"{name}: size {actual} != manifest size {f['size']}"
            + (" (truncated)" if actual < f["size"] else ""),
        )


def _hash_error(name: str, got: str, want: str) -> CheckpointError:
    return CheckpointError(
        "integrity_hash_mismatch",
        f"{name}: sha256 {got[:16]}... != manifest {want[:16]}... (content corrupted)",
    )


def read_index(
    path: str, f: dict[str, Any], data: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Read, hash-check and parse a rank's index file; with ``data`` (the manifest's data
    entries of that rank) also check that the index describes exactly those files."""
    name = f["name"]
    _check_present(path, f)
    with open(os.path.join(path, name), "rb") as fh:
        raw = fh.read()
    got = hashlib.sha256(raw).hexdigest()
    if got != f["sha256"]:
        raise _hash_error(name, got, f["sha256"])
    try:
        index = deserialize(raw)
        if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
            raise ValueError(f"not a {INDEX_FORMAT} index")
        state = index["state"]
        table = index["tensors"]
        files = index["data_files"]
        total = int(index["data_bytes"])
        if not isinstance(state, dict):
            raise ValueError("state is not a dict")
        for ent in table:
            if ent["offset"] < 0 or ent["nbytes"] < 0 or ent["offset"] + ent["nbytes"] > total:
                raise ValueError("tensor table out of range")
            numel = 1
            for n in ent["shape"]:
                numel *= int(n)
            if numel * _dtype(ent["dtype"]).itemsize != ent["nbytes"]:
                raise ValueError("tensor table entry size does not match dtype x shape")
        pos = 0
        for x in files:
            if int(x["offset"]) != pos:
                raise ValueError("data files do not tile the data stream")
            pos += int(x["size"])
        if pos != total:
            raise ValueError("data files do not add up to the data size")
    except Exception as exc:
        raise CheckpointError(
            "load_error", f"{name}: cannot be loaded: {_first_line(exc)}"
        ) from None
    if data is not None:
        listed = [(x["name"], int(x["size"])) for x in data]
        described = [(x["name"], int(x["size"])) for x in files]
        if sorted(listed) != sorted(described):
            raise CheckpointError(
                "load_error",
                f"{name}: describes data files {[n for n, _ in described]} but the manifest "
                f"lists {[n for n, _ in listed]}",
            )
    return index


def _targets(
    skel: Any, into: Any, table: list[dict[str, Any]], out: dict[int, torch.Tensor]
) -> None:
    """Map tensor indices of the skeleton to same-path tensors of ``into`` that can receive
    the bytes directly (CPU, contiguous, same dtype and shape)."""
    if isinstance(skel, dict) and isinstance(into, dict):
        if len(skel) == 1 and _REF in skel:
            return
        for k, v in skel.items():
            if k not in into:
                continue
            t = into[k]
            if isinstance(v, dict) and len(v) == 1 and _REF in v:
                ent = table[v[_REF]]
                if (
                    isinstance(t, torch.Tensor)
                    and t.device.type == "cpu"
                    and t.is_contiguous()
                    and str(t.dtype).removeprefix("torch.") == ent["dtype"]
                    and list(t.shape) == list(ent["shape"])
                    and t.numel() * t.element_size() == ent["nbytes"]
                ):
                    out.setdefault(v[_REF], t.detach())
            else:
                _targets(v, t, table, out)


def load_rank(
    path: str, manifest: dict[str, Any], rank: int, into: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[str], int]:
    """Load one rank's state: verify sizes, read every data file into the tensors while
    hashing it (files in parallel), compare with the manifest. Returns (state, file names
    verified, bytes). Raises CheckpointError naming the first bad file.

    Tensors are fresh memory, except that with ``into`` (e.g. ``{"model":
    module.state_dict()}``) a tensor at the same path with the same dtype/shape receives the
    bytes in place and is returned in the state (``load_state_dict`` then copies nothing).
    If loading fails, such targets may hold partial data: treat them as garbage."""
    fidx, data = rank_files(manifest, rank)
    index = read_index(path, fidx, data)
    for f in data:
        _check_present(path, f)
    table = index["tensors"]
    direct: dict[int, torch.Tensor] = {}
    if into:
        _targets(index["state"], into, table, direct)
    bufs = [
        direct[i] if i in direct else torch.empty(int(e["nbytes"]), dtype=torch.uint8)
        for i, e in enumerate(table)
    ]
    views = [_byte_view(b) for b in bufs]
    want = {f["name"]: f["sha256"] for f in data}
    pool = _pool()
    futs = [
        (
            f["name"],
            pool.submit(
                _read_into,
                os.path.join(path, f["name"]),
                _pieces(table, views, int(f["offset"]), int(f["offset"]) + int(f["size"])),
                int(f["size"]),
            ),
        )
        for f in index["data_files"]
    ]
    err: CheckpointError | None = None
    for name, fut in futs:
        try:
            got = fut.result()
        except CheckpointError as exc:
            err = err or exc
            continue
        except OSError as exc:
            err = err or CheckpointError("load_error", f"{name}: cannot be read: {exc}")
            continue
        if got != want[name] and err is None:
            err = _hash_error(name, got, want[name])
    if err is not None:
        raise err
    tensors = [
        b if i in direct else b.view(_dtype(e["dtype"])).reshape(e["shape"])
        for i, (b, e) in enumerate(zip(bufs, table, strict=True))
    ]
    state = _unflatten(index["state"], tensors)
    names = [fidx["name"]] + [f["name"] for f in index["data_files"]]
    return state, names, int(fidx["size"]) + int(index["data_bytes"])


def read_rank(path: str, rank: int = 0) -> dict[str, Any]:
    """Convenience: the verified state of ``rank`` in the checkpoint at ``path``."""
    return load_rank(path, load_manifest(path), rank)[0]


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


COPY_PIECE = 4 << 20


def _copy_jobs(jobs: list[tuple[torch.Tensor, torch.Tensor]], nthreads: int) -> None:
    """dst.copy_(src) for CPU tensor pairs: single-threaded memcpys (np.copyto releases the
    GIL) of <= COPY_PIECE slices pulled from a shared queue by the calling thread and
    ``nthreads - 1`` pool threads. If a core is taken by another process the other thread
    simply copies more; torch's OpenMP copy instead waits at a barrier for the descheduled
    thread (measured 5-10x slower under contention on a shared 2-core VM)."""
    pieces: list[tuple[memoryview, memoryview]] = []
    for d, s in jobs:
        if not d.numel():
            continue
        dv, sv = _byte_view(d), _byte_view(s)
        for off in range(0, len(sv), COPY_PIECE):
            pieces.append((dv[off : off + COPY_PIECE], sv[off : off + COPY_PIECE]))
    queue = iter(pieces)
    lock = threading.Lock()

    def run() -> None:
        while True:
            with lock:
                item = next(queue, None)
            if item is None:
                return
            np.copyto(np.frombuffer(item[0], np.uint8), np.frombuffer(item[1], np.uint8))

    helpers = min(nthreads, len(pieces)) - 1
    futs = [_pool().submit(run) for _ in range(max(0, helpers))]
    try:
        run()
    finally:
        for fut in futs:
            fut.result()


def clone_into(
    obj: Any,
    cache: dict[str, torch.Tensor],
    key: str = "",
    jobs: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Any:
    """Like clone_to_cpu, but reuses CPU buffers from ``cache`` (same key, shape, dtype), so
    steady-state async snapshots are a memcpy without fresh allocations/page faults. Only
    safe when the previous snapshot has been written (CheckpointWriter.save waits for it).
    With ``jobs``, CPU->CPU copies are deferred into it (run them with ``copy_tensors``)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        buf = cache.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu")
            cache[key] = buf
        if jobs is not None and t.device.type == "cpu" and t.is_contiguous():
            jobs.append((buf, t))
        else:
            buf.copy_(t)
        return buf
    if isinstance(obj, dict):
        return {k: clone_into(v, cache, f"{key}/{k}", jobs) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clone_into(v, cache, f"{key}/{i}", jobs) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(clone_into(v, cache, f"{key}/{i}", jobs) for i, v in enumerate(obj))
    return obj


def copy_tensors(jobs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Run the copies deferred by clone_into on all cores (see _copy_jobs)."""
    _copy_jobs(jobs, max(1, min(os.cpu_count() or 1, io_workers())))


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

    Checks, in order: manifest present and parsable; every listed file (index and data files
    of every rank) present, of the listed size and sha256 (files hashed in parallel); each
    rank has an index listing the required state keys; with ``deep`` each index is also
    loaded, its keys checked and its data-file list matched against the manifest.
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
    to_hash: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for f in manifest["files"]:
        name = f["name"]
        fpath = os.path.join(path, name)
        item: dict[str, Any] = {
            "name": name,
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
            item["error"] = _first_line(res)
            continue
        digest, n = res
        report["bytes"] += n
        item["actual_sha256"] = digest
        item["sha256_ok"] = digest == f["sha256"]
    bad_ranks: set[int] = set()
    for f, item in zip(manifest["files"], report["files"], strict=True):
        name, rank = f["name"], int(f["rank"])
        if item["sha256_ok"]:
            continue
        bad_ranks.add(rank)
        if not item["exists"]:
            problems.append(("missing_file", f"{name}: file is missing"))
        elif not item["size_ok"]:
            actual, size = item["actual_size"], f["size"]
            trunc = " (truncated)" if actual < size else ""
            problems.append(
                ("integrity_size_mismatch", f"{name}: size {actual} != manifest size {size}{trunc}")
            )
        elif "error" in item:
            problems.append(("load_error", f"{name}: cannot be read: {item['error']}"))
        else:
            problems.append(
                (
                    "integrity_hash_mismatch",
                    f"{name}: sha256 {item['actual_sha256'][:16]}... != manifest "
                    f"{f['sha256'][:16]}... (content corrupted)",
                )
            )
    ranks_listed: set[int] = set()
    for f, item in zip(manifest["files"], report["files"], strict=True):
        if item["role"] != "index":
            continue
        rank = int(f["rank"])
        ranks_listed.add(rank)
        if rank in bad_ranks:
            continue
        missing_listed = [k for k in required_keys(rank) if k not in f.get("keys", [])]
        if missing_listed:
            item["keys_ok"] = False
            report["missing_state"] += [f"{k} (rank {rank})" for k in missing_listed]
            problems.append(
                (
                    "missing_state",
                    f"{f['name']}: required state {', '.join(missing_listed)} not present",
                )
            )
            continue
        if deep:
            try:
                index = read_index(path, f, rank_files(manifest, rank)[1])
            except CheckpointError as exc:
                problems.append((exc.code, exc.reason))
                continue
            absent = [k for k in required_keys(rank) if k not in index["state"]]
            if absent:
                item["keys_ok"] = False
                report["missing_state"] += [f"{k} (rank {rank})" for k in absent]
                problems.append(
                    (
                        "missing_state",
                        f"{f['name']}: required state {', '.join(absent)} not present",
                    )
                )
                continue
        item["keys_ok"] = True
    expected_ranks = set(range(int(manifest["world_size"])))
    if ranks_listed != expected_ranks:
        gone = sorted(expected_ranks - ranks_listed)
        problems.append(
            (
                "missing_file",
                f"manifest lists no index file for rank(s) {gone} of world size "
                f"{manifest['world_size']}",
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
        files = save_rank(state, d, self.rank)
        info = {
            "rank": self.rank,
            "files": files,
            "keys": sorted(state.keys()),
            "save_id": self.save_id,
        }
        del state
        atomic_write_json(os.path.join(d, sidecar_name(self.rank)), info)
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
            "files": [
                {
                    "name": x["name"],
                    "rank": f["rank"],
                    "role": x["role"],
                    "size": x["size"],
                    "sha256": x["sha256"],
                    **({"keys": f["keys"]} if x["role"] == "index" else {}),
                }
                for f in files
                for x in f["files"]
            ],
            "state_keys": state_keys,
            "total_bytes": sum(x["size"] for f in files for x in f["files"]),
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
                p = os.path.join(d, sidecar_name(r))
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
