"""State fingerprints: what a checkpoint's training state was, in a few numbers per tensor,
the same however the state is sharded across ranks.

Per tensor (keyed ``model/<name>``, ``optimizer/<param name>/<key>``):

* ``lhash`` — an exact 64-bit linear hash of the tensor's raw bits, each element weighted
  by a pseudo-random function of its *global* position (mod 2**64). Shards' contributions
  add up, so every world size and sharding of the same global tensor gives the same value,
  and any changed bit changes it (not a cryptographic digest: it guards against damage and
  drift, not against someone forging a matching tensor);
* ``sha256`` of its bytes, when one rank holds the whole tensor;
* float64 ``sum`` and ``sumsq`` (the L2 norm is its square root);
* ``sketch`` — ``SKETCH`` float64 random projections (signs by global position), from which
  the relative L2 distance between two states is estimated where they cannot be equal bit
  for bit (another allocation, a GPU).

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
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from .schema import FINGERPRINT_FORMAT

FORMAT = FINGERPRINT_FORMAT
SKETCH = 8
CHUNK = 1 << 20  # elements per pass: bounded memory for any tensor size
_MASK64 = (1 << 64) - 1
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
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
    """splitmix64 of global element positions (int64, wrapping), one value per element."""
    x = index * _C1 + _signed(salt * 0xD6E8FEB86659FD93)
    x = (x ^ _lshr(x, 30)) * _C2
    x = (x ^ _lshr(x, 27)) * _C3
    return x ^ _lshr(x, 31)


def _raw_bits(flat: torch.Tensor) -> torch.Tensor:
    """The elements' raw bits as non-negative int64 values."""
    size = flat.element_size()
    if flat.dtype == torch.bool:
        return flat.to(torch.int64)
    view = flat.view(_BITS[size]).to(torch.int64)
    return view if size == 8 else view & ((1 << (8 * size)) - 1)


def _chunks(flat: torch.Tensor, offset: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for start in range(0, flat.numel(), CHUNK):
        piece = flat[start : start + CHUNK]
        index = torch.arange(offset + start, offset + start + piece.numel(), dtype=torch.int64)
        yield piece, index


def tensor_part(
    tensor: torch.Tensor, *, offset: int = 0, global_shape: Iterable[int] | None = None
) -> dict[str, Any]:
    """The fingerprint contribution of ``tensor``, which holds the elements
    ``[offset, offset + numel)`` of the flattened global tensor (``global_shape``; the
    tensor itself when None). ``sha256`` only when it is the whole tensor."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    flat = t.contiguous().reshape(-1)
    shape = list(global_shape) if global_shape is not None else list(t.shape)
    whole = offset == 0 and math.prod(shape) == flat.numel()
    lhash = torch.zeros((), dtype=torch.int64)
    total = 0.0
    squares = 0.0
    sketch = [0.0] * SKETCH
    for piece, index in _chunks(flat, offset):
        lhash = lhash + (_raw_bits(piece) * _mix(index, 1)).sum()
        values = piece.to(torch.float64)
        total += float(values.sum())
        squares += float((values * values).sum())
        signs = _mix(index, 2)
        for j in range(SKETCH):
            sign = (_lshr(signs, j) & 1).to(torch.float64) * 2 - 1
            sketch[j] += float((values * sign).sum())
    part: dict[str, Any] = {
        "shape": shape,
        "dtype": str(t.dtype).removeprefix("torch."),
        "lhash": int(lhash) & _MASK64,
        "sum": total,
        "sumsq": squares,
        "sketch": sketch,
    }
    if whole:
        part["sha256"] = hashlib.sha256(_bytes(flat)).hexdigest()
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
        "lhash": sum(int(p["lhash"]) for p in parts) & _MASK64,
        "sum": sum(float(p["sum"]) for p in parts),
        "sumsq": sum(float(p["sumsq"]) for p in parts),
        "sketch": [sum(float(p["sketch"][j]) for p in parts) for j in range(SKETCH)],
    }
    whole = [p for p in parts if "sha256" in p]
    if len(whole) == 1:
        combined["sha256"] = whole[0]["sha256"]
    return combined


def merge(rank_parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The global fingerprint from every rank's part (see ``Fingerprinter.part``)."""
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
        same = int(seen["lhash"]) == int(wanted["lhash"])
        if same and "sha256" in seen and "sha256" in wanted:
            same = seen["sha256"] == wanted["sha256"]
        if same:
            return None
        distance = relative_l2(seen, wanted)
        return {
            "key": key,
            "kind": "bits",
            "detail": f"differs bit for bit (estimated relative L2 {distance:.3g})",
            "rel_l2": distance,
        }
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


def rank_part(state: dict[str, Any], *, rank: int, param_names: list[str]) -> dict[str, Any]:
    """This rank's contribution to the fingerprint of a checkpoint state (the rank's
    snapshot: ``model``, ``optimizer``, ``scheduler`` where it holds them, and always
    ``rng``, ``data``, ``meta``). ``param_names``: the model's parameter names in the
    optimizer's order, so optimizer state is keyed by name whatever the world size."""
    tensors: dict[str, Any] = {}
    scalars: dict[str, str] = {}
    for name, value in (state.get("model") or {}).items():
        if isinstance(value, torch.Tensor):
            tensors[f"model/{name}"] = tensor_part(value)
    optimizer = state.get("optimizer")
    if optimizer is not None:
        for index, entries in optimizer.get("state", {}).items():
            name = param_names[int(index)] if int(index) < len(param_names) else f"#{index}"
            for key, value in entries.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"optimizer/{name}/{key}"] = tensor_part(value)
                else:
                    scalars[f"optimizer/{name}/{key}"] = digest(value)
        groups = [
            {
                **{k: v for k, v in group.items() if k != "params"},
                "params": [
                    param_names[int(i)] if int(i) < len(param_names) else f"#{i}"
                    for i in group.get("params", [])
                ],
            }
            for group in optimizer.get("param_groups", [])
        ]
        scalars["optimizer/param_groups"] = digest(groups)
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
