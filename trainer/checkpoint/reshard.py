"""Reading a checkpoint by slices: each rank reads only the byte ranges it needs.

Every tensor lies C-contiguous in its rank's data stream, and FSDP2 shards on dim 0, so
the global rows [a, b) of a saved slice are one contiguous byte range of that rank's data
files. A loading rank asks for the rows it will hold (its own FSDP shard at any world
size, or the whole tensor for DDP); the reader intersects them with the saved slices of
all ranks, maps each intersection to (file, offset, length) and reads straight into the
destination tensor with ``preadv`` — no rank gathers the full state, none reads what it
does not keep. A file whose every byte a rank needs is read whole and its sha256 checked;
each piece read is digested at its global position (the fingerprint's ``lhash``), so the
slices read can be checked against the digests recorded when they were saved
(``trainer.restore``), whichever ranks read them.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import fingerprint
from ..schema import Reason
from ..statekeys import SHARD0, SHARDS, row_elements, state_leaves
from .durable import io_pool
from .layout import CheckpointError, first_line, strategy_of
from .rankfile import (
    byte_view,
    check_present,
    dtype_of,
    hash_error,
    is_ref,
    rank_files,
    read_index,
    read_into,
    ref_index,
    refs_in,
    unflatten,
)


def rows_of(shape: list[int] | tuple[int, ...]) -> int:
    """Dim-0 rows of a tensor; a 0-dim tensor counts as one row of one element."""
    return int(shape[0]) if len(shape) else 1


@dataclass(frozen=True)
class Slice:
    """A saved slice: global rows [start, start + rows) of ``key``, held by ``rank`` at
    bytes [offset, offset + nbytes) of its data stream."""

    rank: int
    key: str
    start: int
    rows: int
    global_shape: tuple[int, ...]
    dtype: str
    offset: int
    nbytes: int

    @property
    def row_bytes(self) -> int:
        return row_elements(list(self.global_shape)) * dtype_of(self.dtype).itemsize


class ShardLayout:
    """Where every saved tensor slice lies, from the ranks' indices (each read once and
    checked against its sha256 in the manifest)."""

    def __init__(self, path: str, manifest: dict[str, Any], param_names: list[str]) -> None:
        self.path = path
        self.manifest = manifest
        self.param_names = param_names
        self.strategy = strategy_of(manifest)
        self._indices: dict[int, dict[str, Any]] = {}
        self.slices: dict[str, list[Slice]] = {}
        self.scalars: dict[str, Any] = {}
        holders = range(int(manifest["world_size"])) if self.strategy == "fsdp" else [0]
        for rank in holders:
            self._add_rank(rank)

    def index(self, rank: int) -> dict[str, Any]:
        if rank not in self._indices:
            entry, data = rank_files(self.manifest, rank)
            self._indices[rank] = read_index(self.path, entry, data)
        return self._indices[rank]

    def state(self, rank: int) -> dict[str, Any]:
        """The skeleton of a rank's state (tensors as references)."""
        return self.index(rank)["state"]

    def index_entries(self) -> list[dict[str, Any]]:
        """The manifest entries of the indices read (each checked against its sha256)."""
        return [rank_files(self.manifest, rank)[0] for rank in sorted(self._indices)]

    def _add_rank(self, rank: int) -> None:
        index = self.index(rank)
        state, table = index["state"], index["tensors"]
        shards = state.get(SHARDS) or {}
        for key, value in state_leaves(state, self.param_names):
            if not is_ref(value):
                self.scalars.setdefault(key, value)
                continue
            entry = table[ref_index(value)]
            shape = [int(n) for n in entry["shape"]]
            placed = shards.get(key)
            if placed is not None and placed.get("placement") == SHARD0:
                global_shape = [int(n) for n in placed["global_shape"]]
                start, rows = int(placed["start"]), int(placed["rows"])
                fits = shape == [rows, *global_shape[1:]]
            else:
                global_shape, start, rows, fits = shape, 0, rows_of(shape), True
            if not fits:
                raise CheckpointError(
                    Reason.INCONSISTENT_STATE,
                    f"{rank_files(self.manifest, rank)[0]['name']}: {key} holds a "
                    f"{shape} tensor, its shard table says rows {start}+{rows} of "
                    f"{global_shape}",
                )
            self.slices.setdefault(key, []).append(
                Slice(
                    rank,
                    key,
                    start,
                    rows,
                    tuple(global_shape),
                    entry["dtype"],
                    int(entry["offset"]),
                    int(entry["nbytes"]),
                )
            )

    def files_of(self, rank: int, offset: int, nbytes: int) -> list[str]:
        """The data files of ``rank`` that hold stream bytes [offset, offset + nbytes)."""
        return [
            f["name"]
            for f in self.index(rank)["data_files"]
            if int(f["offset"]) < offset + max(1, nbytes)
            and offset < int(f["offset"]) + int(f["size"])
        ]


@dataclass
class Piece:
    """What one read produced: global rows [lo, hi) of ``source``'s tensor, now in
    ``rows`` (a view of the destination)."""

    source: Slice
    lo: int
    hi: int
    rows: torch.Tensor

    @property
    def complete(self) -> bool:
        return self.lo == self.source.start and self.hi == self.source.start + self.source.rows

    def lhash(self) -> int:
        shape = list(self.source.global_shape)
        offset = self.lo * row_elements(shape)
        return int(fingerprint.tensor_part(self.rows, offset=offset, full=False)["lhash"])


@dataclass
class RangeReader:
    """Collects the byte ranges a rank needs (``want``, ``want_tree``), then reads them
    (``run``), files in parallel."""

    layout: ShardLayout
    by_file: dict[str, list[tuple[int, memoryview]]] = field(default_factory=dict)
    pieces: list[Piece] = field(default_factory=list)
    trees: list[tuple[int, Any, dict[int, torch.Tensor]]] = field(default_factory=list)

    def _stream(self, rank: int, offset: int, dest: memoryview) -> None:
        """Stream bytes [offset, offset + len(dest)) of ``rank`` into ``dest``."""
        end = offset + len(dest)
        for f in self.layout.index(rank)["data_files"]:
            lo, hi = int(f["offset"]), int(f["offset"]) + int(f["size"])
            a, b = max(lo, offset), min(hi, end)
            if a < b:
                piece = (a - lo, dest[a - offset : b - offset])
                self.by_file.setdefault(f["name"], []).append(piece)

    def want(self, key: str, out: torch.Tensor, start: int) -> None:
        """Fill ``out`` (contiguous, CPU) with global rows [start, start + rows) of ``key``
        from every saved slice that holds some of them."""
        stop = start + rows_of(list(out.shape))
        dest = byte_view(out)
        covered = 0
        for source in self.layout.slices.get(key, []):
            lo, hi = max(source.start, start), min(source.start + source.rows, stop)
            if lo >= hi:
                continue
            row = source.row_bytes
            self._stream(
                source.rank,
                source.offset + (lo - source.start) * row,
                dest[(lo - start) * row : (hi - start) * row],
            )
            view = out.reshape(1) if out.dim() == 0 else out[lo - start : hi - start]
            self.pieces.append(Piece(source, lo, hi, view))
            covered += hi - lo
        if covered != stop - start:
            raise CheckpointError(
                Reason.INCONSISTENT_STATE,
                f"{key}: the saved slices hold {covered} of the rows {start}..{stop} this "
                "rank needs (a rank's shard is missing from the layout)",
            )

    def want_tree(self, rank: int, skeleton: Any) -> int:
        """Read every tensor a skeleton of ``rank``'s state references (e.g. its RNG
        state); returns a handle for ``tree``."""
        table = self.layout.index(rank)["tensors"]
        buffers: dict[int, torch.Tensor] = {}
        for i in refs_in(skeleton):
            entry = table[i]
            buffer = torch.empty(int(entry["nbytes"]), dtype=torch.uint8)
            buffers[i] = buffer
            self._stream(rank, int(entry["offset"]), byte_view(buffer))
        self.trees.append((rank, skeleton, buffers))
        return len(self.trees) - 1

    def tree(self, handle: int) -> Any:
        rank, skeleton, buffers = self.trees[handle]
        table = self.layout.index(rank)["tensors"]
        tensors = {
            i: b.view(dtype_of(table[i]["dtype"])).reshape(table[i]["shape"])
            for i, b in buffers.items()
        }
        return unflatten(skeleton, tensors)

    def run(self) -> dict[str, Any]:
        """Read everything asked for. Returns {files_verified (read whole, sha256 checked),
        ranges [{name, bytes}] (read in part), bytes}; raises CheckpointError naming the
        first file that is missing, short or (read whole) corrupted."""
        entries = {f["name"]: f for f in self.layout.manifest["files"]}
        jobs = []
        for name, parts in sorted(self.by_file.items()):
            entry = entries.get(name)
            if entry is None:
                raise CheckpointError(Reason.MISSING_FILE, f"{name}: not in the manifest")
            check_present(self.layout.path, entry)
            parts.sort(key=lambda p: p[0])
            whole = _tiles(parts, int(entry["size"]))
            path = os.path.join(self.layout.path, name)
            if whole:
                fut = io_pool().submit(read_into, path, [mv for _, mv in parts], int(entry["size"]))
            else:
                fut = io_pool().submit(_read_ranges, path, parts)
            jobs.append((entry, whole, fut, sum(len(mv) for _, mv in parts)))
        report: dict[str, Any] = {"files_verified": [], "ranges": [], "bytes": 0}
        error: CheckpointError | None = None
        for entry, whole, fut, nbytes in jobs:  # wait for all, even after a failure
            try:
                digest = fut.result()
            except CheckpointError as exc:
                error = error or exc
                continue
            except OSError as exc:
                error = error or CheckpointError(
                    Reason.LOAD_ERROR, f"{entry['name']}: cannot be read: {first_line(exc)}"
                )
                continue
            if whole and digest != entry["sha256"]:
                error = error or hash_error(entry["name"], str(digest), entry["sha256"])
            report["bytes"] += nbytes
            if whole:
                report["files_verified"].append(entry["name"])
            else:
                report["ranges"].append({"name": entry["name"], "bytes": nbytes})
        if error is not None:
            raise error
        return report


def _tiles(parts: list[tuple[int, memoryview]], size: int) -> bool:
    """Whether sorted (offset, view) pieces cover [0, size) exactly once."""
    position = 0
    for offset, mv in parts:
        if offset != position:
            return False
        position += len(mv)
    return position == size


def _read_ranges(path: str, parts: list[tuple[int, memoryview]]) -> str:
    """``preadv`` each (offset, view) of a file; a short read is a truncated file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for offset, mv in parts:
            got = 0
            while got < len(mv):
                n = os.preadv(fd, [mv[got:]], offset + got)
                if n == 0:
                    raise CheckpointError(
                        Reason.INTEGRITY_SIZE_MISMATCH,
                        f"{os.path.basename(path)}: shorter than the manifest says (truncated)",
                    )
                got += n
    finally:
        os.close(fd)
    return ""  # read in part: no digest of the whole file
