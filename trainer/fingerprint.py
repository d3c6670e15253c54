"""State fingerprints: what a checkpoint's training state was, in a few numbers per tensor,
the same however the state is sharded across ranks.

Per tensor (keyed ``model/<name>``, ``optimizer/<param name>/<key>``):

* ``lhash`` — an exact 32-bit digest of the tensor's bytes: the sum of its 32-bit words,
  each weighted by an odd pseudo-random function of its *global* position (mod 2**32).
  Shards' contributions add up, so every world size and sharding of the same global
  tensor gives the same value, and any single changed element always changes it (an odd
  weight has no zero divisor mod 2**32); several changes cancel with probability ~2**-32
  per tensor. Not cryptographic: it guards against damage and drift, not against someone
  forging a matching tensor — and the copy it is compared with is Gantry's, not the
  cluster's. 32 bits, not 64, for speed: one int32 multiply-accumulate pass is what keeps
  the drill's bit-for-bit check of the loaded state within 10% of its load time;
* ``sum`` and ``sumsq`` in float64 (the L2 norm is the root of ``sumsq``);
* ``sketch`` — ``SKETCH`` random projections (signs by global position), from which the
  relative L2 distance between two states is estimated where they cannot be equal bit for
  bit (another allocation, a GPU).

Speed: position weights and signs come from tables built once (``_Tables``); per element
the work is one integer multiply-add and a small float32 matrix product, so fingerprinting
costs a fraction of reading the checkpoint (``bench/fingerprint_bench.py``).

Non-tensor state (the scheduler, the optimizer's hyper-parameters) is a digest of its
canonical JSON; the data position and each rank's RNG state are digests too. Computed in
the checkpoint writer's background thread from the snapshot it writes, logged with the
``checkpoint`` event; Gantry keeps it, and a drill compares the state it loaded (and the
state after replaying to the next checkpoint) with Gantry's copy.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from .schema import FINGERPRINT_FORMAT
from .statekeys import SHARD0, SHARDS, group_params, row_elements, state_leaves

FORMAT = FINGERPRINT_FORMAT
SKETCH = 8
BLOCK = 1 << 20  # elements: position weights are cached for one block
ROW = 64  # the sketch's signs: a row sign (per ROW elements) times a column pattern
_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
# Odd 64-bit constants (splitmix64), as signed int64 for torch.
_C1 = 0x9E3779B97F4A7C15 - (1 << 64)
_C2 = 0xBF58476D1CE4E5B9 - (1 << 64)
_C3 = 0x94D049BB133111EB - (1 << 64)


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _lshr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(index: torch.Tensor, salt: int) -> torch.Tensor:
    """splitmix64 of positions (int64, wrapping), one value per element."""
    x = index * _C1 + _signed(salt * 0xD6E8FEB86659FD93)
    x = (x ^ _lshr(x, 30)) * _C2
    x = (x ^ _lshr(x, 27)) * _C3
    return x ^ _lshr(x, 31)


def _mix_int(value: int, salt: int) -> int:
    """``_mix`` of one position, in plain integers (unsigned 64-bit result)."""
    x = (value * (_C1 & _MASK64) + (salt * 0xD6E8FEB86659FD93)) & _MASK64
    x = ((x ^ (x >> 30)) * (_C2 & _MASK64)) & _MASK64
    x = ((x ^ (x >> 27)) * (_C3 & _MASK64)) & _MASK64
    return x ^ (x >> 31)


class _Tables:
    """Position tables, built once: the element weight of position ``i`` is
    ``weights[i % BLOCK] * block_weight(i // BLOCK)`` (both odd, so every changed element
    changes the hash), and its sketch sign for projection ``j`` is
    ``rows[(i // ROW) % (BLOCK // ROW)] * block_sign(i // BLOCK) * columns[i % ROW, j]``
    (products of independent signs: pairwise uncorrelated, as a random projection needs)."""

    def __init__(self) -> None:
        index = torch.arange(BLOCK, dtype=torch.int64)
        # Odd 32-bit weights, as int32 (the products wrap at 32 bits, as intended).
        weights = (_mix(index, 1) | 1) & 0xFFFFFFFF
        self.weights = torch.where(weights >= 1 << 31, weights - (1 << 32), weights).to(torch.int32)
        rows = torch.arange(BLOCK // ROW, dtype=torch.int64)
        self.rows = ((_lshr(_mix(rows, 2), 7) & 1) * 2 - 1).to(torch.float32)
        cells = _mix(torch.arange(ROW * SKETCH, dtype=torch.int64), 3)
        self.columns = ((_lshr(cells, 11) & 1) * 2 - 1).to(torch.float32).reshape(ROW, SKETCH)


_tables: _Tables | None = None
_tables_lock = threading.Lock()
_scratch = threading.local()


def _get_tables() -> _Tables:
    """The tables (~40 ms to build, once per process; ``prepare`` builds them early)."""
    global _tables
    with _tables_lock:
        if _tables is None:
            _tables = _Tables()
        return _tables


def prepare() -> threading.Thread:
    """Build the tables in the background now, off the critical path of a later call."""
    thread = threading.Thread(target=_get_tables, name="fingerprint-tables", daemon=True)
    thread.start()
    return thread


def _buffer(length: int) -> torch.Tensor:
    """A per-thread int32 scratch buffer (products are written there, not allocated)."""
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None:
        buffer = _scratch.buffer = torch.empty(BLOCK, dtype=torch.int32)
    return buffer[:length]


def _words(flat: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The tensor's raw bytes as 32-bit words (int32) and how many words per element:
    4-byte elements are one word, 8-byte ones two, 2- and 1-byte ones zero-extended."""
    size = flat.element_size()
    if size == 4:
        return flat.view(torch.int32), 1
    if size == 8:
        return flat.view(torch.int32), 2
    if size == 2:
        return flat.view(torch.int16).to(torch.int32) & 0xFFFF, 1
    return flat.view(torch.uint8).to(torch.int32), 1


def _pieces(offset: int, n: int) -> Iterator[tuple[int, int, int, int]]:
    """Cut the global positions ``[offset, offset + n)`` at block boundaries:
    (start in the local tensor, length, block number, position in the block)."""
    done = 0
    while done < n:
        position = offset + done
        block, inside = divmod(position, BLOCK)
        length = min(n - done, BLOCK - inside)
        yield done, length, block, inside
        done += length


def _sketch_piece(values: torch.Tensor, inside: int, block: int, t: _Tables) -> torch.Tensor:
    """The 8 projections of one piece (float32 values at block positions from ``inside``)."""
    head = inside % ROW
    padded = values
    if head or (head + values.numel()) % ROW:
        tail = (-(head + values.numel())) % ROW
        padded = torch.nn.functional.pad(values, (head, tail))
    rows = padded.view(-1, ROW) @ t.columns  # (rows, SKETCH)
    first = inside // ROW
    signs = t.rows[first : first + rows.shape[0]]
    if _mix_int(block, 4) & 1:
        signs = -signs
    return signs @ rows


def tensor_part(
    tensor: torch.Tensor,
    *,
    offset: int = 0,
    global_shape: Iterable[int] | None = None,
    full: bool = True,
) -> dict[str, Any]:
    """The fingerprint contribution of ``tensor``, which holds the elements
    ``[offset, offset + numel)`` of the flattened global tensor (``global_shape``; the
    tensor itself when None). Contributions of shards add up to the whole tensor's.
    ``full`` False: the exact digest only (no sums, no sketch), for bit-for-bit checks."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    flat = t.contiguous().reshape(-1)
    shape = list(global_shape) if global_shape is not None else list(t.shape)
    tables = _get_tables()
    words, per_element = _words(flat)
    lhash = 0
    for start, length, block, inside in _pieces(offset * per_element, words.numel()):
        product = torch.mul(
            words[start : start + length],
            tables.weights[inside : inside + length],
            out=_buffer(length),
        )
        # Summed mod 2**32 (int32 accumulation: one pass over the products).
        lhash += int(product.sum(dtype=torch.int32)) * (_mix_int(block, 5) | 1)
    part: dict[str, Any] = {
        "shape": shape,
        "dtype": str(t.dtype).removeprefix("torch."),
        "lhash": lhash & _MASK32,
    }
    if not full:
        return part
    total = 0.0
    squares = 0.0
    sketch = torch.zeros(SKETCH, dtype=torch.float64)
    for start, length, block, inside in _pieces(offset, flat.numel()):
        values = flat[start : start + length].to(torch.float32)
        total += float(values.sum(dtype=torch.float64))
        squares += float(torch.sum(values * values, dtype=torch.float64))
        sketch += _sketch_piece(values, inside, block, tables).to(torch.float64)
    part.update(sum=total, sumsq=squares, sketch=[float(v) for v in sketch])
    return part


def _bytes(flat: torch.Tensor) -> bytes:
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def digest(value: Any) -> str:
    """sha256 of a JSON-able value's canonical form (tensors by their bytes)."""
    return hashlib.sha256(_canonical(value).encode()).hexdigest()


def _canonical(value: Any) -> str:
    def convert(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            flat = obj.detach().cpu().contiguous().reshape(-1)
            return {
                "tensor": str(obj.dtype),
                "shape": list(obj.shape),
                "sha256": hashlib.sha256(_bytes(flat)).hexdigest(),
            }
        if isinstance(obj, np.ndarray):
            return {"ndarray": str(obj.dtype), "data": obj.tolist()}
        if isinstance(obj, dict):
            return {str(k): convert(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [convert(v) for v in obj]
        if isinstance(obj, float) and not math.isfinite(obj):
            return repr(obj)
        return obj

    return json.dumps(convert(value), sort_keys=True, separators=(",", ":"), default=repr)


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One global tensor fingerprint from its shards' contributions."""
    if len(parts) == 1:
        return dict(parts[0])
    first = parts[0]
    combined: dict[str, Any] = {
        "shape": first["shape"],
        "dtype": first["dtype"],
        "lhash": sum(int(p["lhash"]) for p in parts) & _MASK32,
    }
    slices = [entry for p in parts for entry in p.get("shards", [])]
    if slices:
        combined["shards"] = sorted(slices, key=lambda entry: (entry["start"], entry["rank"]))
    if all("sketch" in p for p in parts):
        combined.update(
            sum=sum(float(p["sum"]) for p in parts),
            sumsq=sum(float(p["sumsq"]) for p in parts),
            sketch=[sum(float(p["sketch"][j]) for p in parts) for j in range(SKETCH)],
        )
    return combined


def merge(rank_parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The global fingerprint from every rank's part (``rank_part``)."""
    tensors: dict[str, list[dict[str, Any]]] = {}
    scalars: dict[str, str] = {}
    rng: dict[str, str] = {}
    data: dict[str, Any] = {}
    step = None
    for part in rank_parts:
        for key, value in part.get("tensors", {}).items():
            tensors.setdefault(key, []).extend(value if isinstance(value, list) else [value])
        scalars.update(part.get("scalars", {}))
        rng.update(part.get("rng", {}))
        if part.get("rank") == 0:
            data = dict(part.get("data", {}))
            step = part.get("step")
    return {
        "format": FORMAT,
        "step": step,
        "world_size": len(rank_parts),
        "tensors": {key: combine(parts) for key, parts in sorted(tensors.items())},
        "scalars": dict(sorted(scalars.items())),
        "data": data,
        "rng": dict(sorted(rng.items(), key=lambda item: int(item[0]))),
    }


# ---------------------------------------------------------------- comparing


def norm(entry: dict[str, Any]) -> float:
    return math.sqrt(max(0.0, float(entry["sumsq"])))


def relative_l2(observed: dict[str, Any], reference: dict[str, Any]) -> float:
    """Estimated ||observed - reference|| / ||reference|| from the two sketches (a random
    projection estimate: within a factor of about 2 with 8 projections)."""
    diffs = [
        float(a) - float(b) for a, b in zip(observed["sketch"], reference["sketch"], strict=True)
    ]
    estimate = math.sqrt(sum(d * d for d in diffs) / len(diffs))
    scale = norm(reference)
    if scale == 0.0:
        return 0.0 if estimate == 0.0 else math.inf
    return estimate / scale


def compare(
    observed: dict[str, Any],
    reference: dict[str, Any],
    *,
    exact: bool,
    tolerance: float,
    compare_rng: bool,
) -> list[dict[str, Any]]:
    """Differences between two fingerprints, one entry per differing item: exact (every
    bit) or within ``tolerance`` (relative L2 per tensor). Non-tensor state and the data
    position are always compared exactly; RNG states only when ``compare_rng``."""
    problems: list[dict[str, Any]] = []
    seen, wanted = observed.get("tensors", {}), reference.get("tensors", {})
    for key in sorted(set(wanted) - set(seen)):
        problems.append({"key": key, "kind": "missing", "detail": "not in the loaded state"})
    for key in sorted(set(seen) - set(wanted)):
        problems.append({"key": key, "kind": "unexpected", "detail": "not in the saved state"})
    for key in sorted(set(seen) & set(wanted)):
        problem = _tensor_problem(key, seen[key], wanted[key], exact, tolerance)
        if problem is not None:
            problems.append(problem)
    for group in ("scalars", "data"):
        mine, theirs = observed.get(group, {}), reference.get(group, {})
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) != theirs.get(key):
                problems.append(
                    {
                        "key": f"{group}/{key}",
                        "kind": "differs",
                        "detail": f"{mine.get(key)!r} != saved {theirs.get(key)!r}",
                    }
                )
    if compare_rng:
        mine, theirs = observed.get("rng", {}), reference.get("rng", {})
        for rank in sorted(set(mine) & set(theirs), key=int):
            if mine[rank] != theirs[rank]:
                problems.append(
                    {"key": f"rng/rank{rank}", "kind": "differs", "detail": "RNG state differs"}
                )
    return problems


def _tensor_problem(
    key: str, seen: dict[str, Any], wanted: dict[str, Any], exact: bool, tolerance: float
) -> dict[str, Any] | None:
    if list(seen["shape"]) != list(wanted["shape"]) or seen["dtype"] != wanted["dtype"]:
        return {
            "key": key,
            "kind": "shape",
            "detail": f"{seen['dtype']}{seen['shape']} != saved {wanted['dtype']}{wanted['shape']}",
        }
    if exact:
        if int(seen["lhash"]) == int(wanted["lhash"]):
            return None
        if "sketch" not in seen or "sketch" not in wanted:
            return {"key": key, "kind": "bits", "detail": "differs bit for bit"}
        distance = relative_l2(seen, wanted)
        return {
            "key": key,
            "kind": "bits",
            "detail": f"differs bit for bit (estimated relative L2 {distance:.3g})",
            "rel_l2": distance,
        }
    if "sketch" not in seen or "sketch" not in wanted:
        # Fail closed: without the numbers a distance needs, no tolerance can be judged.
        return {"key": key, "kind": "distance", "detail": "no sketch to estimate a distance"}
    distance = relative_l2(seen, wanted)
    scale = norm(wanted)
    norm_gap = abs(norm(seen) - scale) / scale if scale else abs(norm(seen))
    if distance <= tolerance and norm_gap <= tolerance:
        return None
    return {
        "key": key,
        "kind": "distance",
        "detail": f"relative L2 {distance:.3g} (norm {norm_gap:.3g}) > tolerance {tolerance:g}",
        "rel_l2": distance,
    }


# ---------------------------------------------------------------- one rank's state


def rank_part(
    state: dict[str, Any], *, rank: int, param_names: list[str], full: bool = True
) -> dict[str, Any]:
    """This rank's contribution to the fingerprint of a checkpoint state (the rank's
    snapshot: ``model``, ``optimizer``, ``scheduler`` where it holds them, its ``shards``
    table, and always ``rng``, ``data``, ``meta``). ``param_names``: the model's parameter
    names in the optimizer's order, so optimizer state is keyed by name whatever the world
    size or strategy. A dim-0 slice counts at its global position and its entry lists the
    slice (``shards``: rank, start row, rows, its own ``lhash``), so a drill can name the
    rank whose slice differs. ``full`` False: exact digests only (enough for bit for bit)."""
    tensors: dict[str, Any] = {}
    scalars: dict[str, str] = {}
    shards = state.get(SHARDS) or {}
    for key, value in state_leaves(state, param_names):
        if isinstance(value, torch.Tensor):
            tensors[key] = _slice_part(value, shards.get(key), rank, full)
        elif key.startswith("optimizer/"):
            scalars[key] = digest(value)
    optimizer = state.get("optimizer")
    if optimizer is not None and "param_groups" in optimizer:
        scalars["optimizer/param_groups"] = digest(
            group_params(optimizer["param_groups"], param_names)
        )
    if state.get("scheduler") is not None:
        scalars["scheduler"] = digest(state["scheduler"])
    meta = state.get("meta") or {}
    data = state.get("data") or {}
    return {
        "rank": rank,
        "step": meta.get("step"),
        "tensors": tensors,
        "scalars": scalars,
        "rng": {str(rank): digest(state.get("rng"))},
        "data": {
            "step": meta.get("step"),
            "samples_consumed": data.get("samples_consumed"),
            "global_batch": data.get("global_batch"),
            "dataset_sha256": data.get("dataset_sha256"),
        },
    }


def _slice_part(
    value: torch.Tensor, shard: dict[str, Any] | None, rank: int, full: bool
) -> dict[str, Any]:
    """A tensor's contribution: the whole tensor, or a dim-0 slice at its global rows."""
    if shard is None or shard.get("placement") != SHARD0:
        return tensor_part(value, full=full)
    global_shape = [int(n) for n in shard["global_shape"]]
    start = int(shard["start"])
    part = tensor_part(
        value, offset=start * row_elements(global_shape), global_shape=global_shape, full=full
    )
    part["shards"] = [
        {"rank": rank, "start": start, "rows": int(shard["rows"]), "lhash": part["lhash"]}
    ]
    return part
