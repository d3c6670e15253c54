"""One rank's state as an index file plus raw tensor data files: save, read, verify while
reading."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from typing import Any

import torch

from ..schema import Reason
from .durable import blocks, io_pool, write_hashed
from .layout import (
    DATA_CHUNK,
    INDEX_FORMAT,
    CheckpointError,
    data_file_name,
    first_line,
    rank_file_name,
)

_REF = "__gantry_tensor__"


def byte_view(t: torch.Tensor) -> memoryview:
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


def is_ref(obj: Any) -> bool:
    """Whether ``obj`` is an index's stand-in for a tensor (``{_REF: i}``)."""
    return isinstance(obj, dict) and len(obj) == 1 and _REF in obj


def ref_index(obj: dict[str, Any]) -> int:
    return int(obj[_REF])


def refs_in(obj: Any) -> list[int]:
    """The tensor indices referenced anywhere in a skeleton, in order."""
    if is_ref(obj):
        return [ref_index(obj)]
    if isinstance(obj, dict):
        return [i for v in obj.values() for i in refs_in(v)]
    if isinstance(obj, list | tuple):
        return [i for v in obj for i in refs_in(v)]
    return []


def unflatten(obj: Any, tensors: Any) -> Any:
    """A skeleton with every reference replaced by ``tensors[i]`` (a list or a dict)."""
    if isinstance(obj, dict):
        if is_ref(obj):
            return tensors[obj[_REF]]
        return {k: unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(unflatten(v, tensors) for v in obj)
    return obj


def dtype_of(name: str) -> torch.dtype:
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
    views = [byte_view(t) for t in tensors]
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
    pool = io_pool()
    jobs = [
        (
            data_file_name(rank, i),
            "data",
            pool.submit(
                write_hashed,
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
            pool.submit(write_hashed, os.path.join(d, idx_name), [memoryview(index_bytes)]),
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


def read_into(path: str, pieces: list[memoryview], size: int) -> str:
    """Read a file straight into ``pieces`` (in order) with large reads, hashing the same
    bytes; returns the sha256. Raises if the file is shorter or longer than ``size``."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        n = 0
        for piece in pieces:
            for mv in blocks(piece):
                got = 0
                while got < len(mv):
                    k = os.readv(fd, [mv[got:]])
                    if k == 0:
                        raise CheckpointError(
                            Reason.INTEGRITY_SIZE_MISMATCH,
                            f"{os.path.basename(path)}: shorter than the manifest size "
                            f"{size} (truncated)",
                        )
                    got += k
                h.update(mv)
                n += got
        if n != size or os.read(fd, 1):
            raise CheckpointError(
                Reason.INTEGRITY_SIZE_MISMATCH,
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
        raise CheckpointError(Reason.MISSING_FILE, f"manifest lists no index file for rank {rank}")
    return index[0], [f for f in mine if f.get("role") == "data"]


def check_present(path: str, f: dict[str, Any]) -> None:
    name = f["name"]
    try:
        actual = os.path.getsize(os.path.join(path, name))
    except FileNotFoundError:
        raise CheckpointError(Reason.MISSING_FILE, f"{name}: file is missing") from None
    if actual != f["size"]:
        raise CheckpointError(
            Reason.INTEGRITY_SIZE_MISMATCH,
            f"{name}: size {actual} != manifest size {f['size']}"
            + (" (truncated)" if actual < f["size"] else ""),
        )


def hash_error(name: str, got: str, want: str) -> CheckpointError:
    return CheckpointError(
        Reason.INTEGRITY_HASH_MISMATCH,
        f"{name}: sha256 {got[:16]}... != manifest {want[:16]}... (content corrupted)",
    )


def read_index(
    path: str, f: dict[str, Any], data: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Read, hash-check and parse a rank's index file; with ``data`` (the manifest's data
    entries of that rank) also check that the index describes exactly those files."""
    name = f["name"]
    check_present(path, f)
    with open(os.path.join(path, name), "rb") as fh:
        raw = fh.read()
    got = hashlib.sha256(raw).hexdigest()
    if got != f["sha256"]:
        raise hash_error(name, got, f["sha256"])
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
            if numel * dtype_of(ent["dtype"]).itemsize != ent["nbytes"]:
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
            Reason.LOAD_ERROR, f"{name}: cannot be loaded: {first_line(exc)}"
        ) from None
    if data is not None:
        listed = [(x["name"], int(x["size"])) for x in data]
        described = [(x["name"], int(x["size"])) for x in files]
        if sorted(listed) != sorted(described):
            raise CheckpointError(
                Reason.LOAD_ERROR,
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
        check_present(path, f)
    table = index["tensors"]
    direct: dict[int, torch.Tensor] = {}
    if into:
        _targets(index["state"], into, table, direct)
    bufs = [
        direct[i] if i in direct else torch.empty(int(e["nbytes"]), dtype=torch.uint8)
        for i, e in enumerate(table)
    ]
    views = [byte_view(b) for b in bufs]
    want = {f["name"]: f["sha256"] for f in data}
    pool = io_pool()
    futs = [
        (
            f["name"],
            pool.submit(
                read_into,
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
            err = err or CheckpointError(Reason.LOAD_ERROR, f"{name}: cannot be read: {exc}")
            continue
        if got != want[name] and err is None:
            err = hash_error(name, got, want[name])
    if err is not None:
        raise err
    tensors = [
        b if i in direct else b.view(dtype_of(e["dtype"])).reshape(e["shape"])
        for i, (b, e) in enumerate(zip(bufs, table, strict=True))
    ]
    state = unflatten(index["state"], tensors)
    names = [fidx["name"]] + [f["name"] for f in index["data_files"]]
    return state, names, int(fidx["size"]) + int(index["data_bytes"])


def serialize(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def deserialize(data: bytes, map_location: Any = "cpu") -> Any:
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
