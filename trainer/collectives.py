"""``python -m trainer collectives``: all-reduce, all-gather, reduce-scatter and broadcast over
a range of message sizes; time, algbw and busbw (the nccl-tests formulas); every result
checked against values known exactly. Gloo on CPU, NCCL on CUDA; launched by srun, torchrun
or as one process. Rank 0 prints one JSON document (``trainer/SCHEMA.md``, "Collectives").

Size convention (nccl-tests'): ``bytes`` is the whole buffer of the operation. All-reduce and
broadcast: the buffer every rank holds. All-gather: the gathered output (each rank sends
``bytes / n``); reduce-scatter: the input (each rank receives ``bytes / n``). A requested
size is rounded down to a whole number of elements (per rank for all-gather and
reduce-scatter); ``bytes`` is the size actually moved, ``requested_bytes`` the size asked for.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as tdist

from . import dist, faults
from .schema import COLLECTIVE_DTYPES, COLLECTIVE_OPS, COLLECTIVES_SCHEMA

OPS = COLLECTIVE_OPS
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in COLLECTIVE_DTYPES}
# The largest integer up to which every integer is exact (all partial sums stay exact).
EXACT_INTEGER_LIMIT = {"float32": 1 << 24, "bfloat16": 256}
# Values of the non-summing patterns: 0..250. 251 is prime, so a block shifted by any power
# of two elements (a misplaced chunk) never lines up with itself; every value is exact in bf16.
GATHER_MODULUS = 251
CHECK_CHUNK = 1 << 20  # elements compared at a time: the check's extra memory stays bounded
CHECK_OVERHEAD_BYTES = CHECK_CHUNK * 32  # index, expected, comparison temporaries
ROOT = 0
EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 5
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class OptionError(ValueError):
    """An invalid option: the CLI prints it on one line and exits 2."""


def parse_size(text: str) -> int:
    """``4096``, ``1KiB``, ``256MiB``, ``1G`` (binary units; ``B`` and ``iB`` optional)."""
    raw = text.strip().lower().replace("ib", "").rstrip("b") if text else ""
    digits = raw.rstrip("kmgt")
    unit = raw[len(digits) :]
    if not digits.isdigit() or unit not in _UNITS:
        raise OptionError(f"not a size: {text!r} (e.g. 4096, 1KiB, 256MiB)")
    return int(digits) * _UNITS[unit]


def busbw_factor(op: str, world: int) -> float:
    """nccl-tests: all-reduce 2(n-1)/n; all-gather and reduce-scatter (n-1)/n; broadcast 1."""
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op in ("all_gather", "reduce_scatter"):
        return (world - 1) / world
    if op == "broadcast":
        return 1.0
    raise OptionError(f"unknown op {op!r}")


def size_ladder(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min, min*factor, ... up to max (max itself included when the ladder lands on it)."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


@dataclass(frozen=True)
class Options:
    ops: tuple[str, ...] = OPS
    min_bytes: int = 1 << 10
    max_bytes: int = 256 << 20
    factor: int = 2
    warmup: int = 5
    iters: int = 20
    dtype: str = "float32"
    device: str = "auto"
    max_memory: int = 1 << 30
    timeout_s: float = 300.0

    def validate(self) -> Options:
        unknown = [op for op in self.ops if op not in OPS]
        if unknown or not self.ops:
            raise OptionError(f"--ops: choose from {', '.join(OPS)} (got {', '.join(unknown)})")
        if self.dtype not in DTYPES:
            raise OptionError(f"--dtype: choose from {', '.join(DTYPES)}")
        if not 1 <= self.min_bytes <= self.max_bytes <= 1 << 40:
            raise OptionError("need 1 <= --min-bytes <= --max-bytes <= 1TiB")
        if not 2 <= self.factor <= 1024:
            raise OptionError("--factor must be 2..1024")
        if not 0 <= self.warmup <= 10_000 or not 1 <= self.iters <= 100_000:
            raise OptionError("--warmup must be 0..10000 and --iters 1..100000")
        if self.max_memory < 1:
            raise OptionError("--max-memory must be positive")
        if not 1 <= self.timeout_s <= 86_400:
            raise OptionError("--timeout must be 1..86400 seconds")
        return self


def options_from_args(args: Any) -> Options:
    ops = tuple(op.strip().replace("-", "_") for op in args.ops.split(",") if op.strip())
    return Options(
        ops=ops,
        min_bytes=parse_size(args.min_bytes),
        max_bytes=parse_size(args.max_bytes),
        factor=args.factor,
        warmup=args.warmup,
        iters=args.iters,
        dtype=args.dtype,
        device=args.device,
        max_memory=parse_size(args.max_memory),
        timeout_s=args.timeout,
    ).validate()


# ---------------------------------------------------------------- expected values


def sum_modulus(world: int, dtype: str) -> int | None:
    """The largest prime p <= 251 with (p-1)*world <= the dtype's exact-integer limit: rank r
    then contributes ``(i + r) % p`` at element i and every partial sum, in any order, is an
    exact integer. None when even p = 2 does not fit (bf16 beyond 256 ranks): one-hot then."""
    limit = EXACT_INTEGER_LIMIT[dtype]
    for p in range(GATHER_MODULUS, 1, -1):
        if all(p % d for d in range(2, int(p**0.5) + 1)) and (p - 1) * world <= limit:
            return p
    return None


def sum_table(world: int, p: int) -> list[int]:
    """T[j] = sum over ranks r of (j + r) % p: the all-reduce of element i is T[i % p]."""
    full, rest = divmod(world, p)
    return [full * p * (p - 1) // 2 + sum((j + r) % p for r in range(rest)) for j in range(p)]


@dataclass
class Pattern:
    """What each rank puts in and what every result must hold, for one op and size."""

    world: int
    rank: int
    dtype: torch.dtype
    device: torch.device
    modulus: int | None  # sum ops: see sum_modulus; None = one-hot
    table: torch.Tensor | None = None

    def _idx(self, start: int, stop: int) -> torch.Tensor:
        return torch.arange(start, stop, device=self.device, dtype=torch.int64)

    def sum_input(self, start: int, stop: int) -> torch.Tensor:
        i = self._idx(start, stop)
        if self.modulus is None:
            values = (i % self.world == self.rank).to(torch.int64)
        else:
            values = (i + self.rank) % self.modulus
        return values.to(self.dtype)

    def sum_expected(self, start: int, stop: int) -> torch.Tensor:
        i = self._idx(start, stop)
        if self.modulus is None:
            return torch.ones(stop - start, dtype=self.dtype, device=self.device)
        if self.table is None:
            values = sum_table(self.world, self.modulus)
            self.table = torch.tensor(values, dtype=torch.int64, device=self.device)
        return self.table[i % self.modulus].to(self.dtype)

    def gather_block(self, rank: int, start: int, stop: int) -> torch.Tensor:
        return ((self._idx(start, stop) + rank) % GATHER_MODULUS).to(self.dtype)

    def broadcast_values(self, start: int, stop: int) -> torch.Tensor:
        return (self._idx(start, stop) % GATHER_MODULUS + 1).to(self.dtype)


def fill(buf: torch.Tensor, values: Callable[[int, int], torch.Tensor]) -> None:
    for start in range(0, buf.numel(), CHECK_CHUNK):
        stop = min(buf.numel(), start + CHECK_CHUNK)
        buf[start:stop] = values(start, stop)


@dataclass
class Check:
    ok: bool = True
    bad_elements: int = 0
    first_bad: dict[str, Any] | None = None


def compare(
    got: torch.Tensor, expected: Callable[[int, int], torch.Tensor], check: Check, where: str
) -> None:
    """Every element of ``got`` equals ``expected`` exactly (NaN never does)."""
    for start in range(0, got.numel(), CHECK_CHUNK):
        stop = min(got.numel(), start + CHECK_CHUNK)
        want = expected(start, stop)
        wrong = got[start:stop] != want
        count = int(wrong.sum().item())
        if count:
            check.ok = False
            check.bad_elements += count
            if check.first_bad is None:
                index = int(wrong.nonzero()[0].item())
                value = float(got[start + index].item())
                check.first_bad = {
                    "call": where,
                    "index": start + index,
                    "got": value if math.isfinite(value) else repr(value),
                    "expected": float(want[index].item()),
                }


# ---------------------------------------------------------------- one op at one size


@dataclass
class Case:
    """Buffers, the call and its checks for one op at one size on this rank."""

    op: str
    elements: int  # of the whole buffer (see the size convention)
    pattern: Pattern
    call: Callable[[], None] = field(init=False)
    check_after: Callable[[Check, str], None] = field(init=False)
    result: torch.Tensor = field(init=False)


def _zeros(n: int, pat: Pattern) -> torch.Tensor:
    return torch.zeros(n, dtype=pat.dtype, device=pat.device)


def build_case(op: str, elements: int, pat: Pattern) -> Case:
    case = Case(op, elements, pat)
    world, rank = pat.world, pat.rank
    per_rank = elements // world
    if op == "all_reduce":
        buf = _zeros(elements, pat)
        fill(buf, pat.sum_input)
        case.result = buf
        case.call = lambda: tdist.all_reduce(buf)
        case.check_after = lambda c, w: compare(buf, pat.sum_expected, c, w)
    elif op == "all_gather":
        src, out = _zeros(per_rank, pat), _zeros(elements, pat)
        fill(src, lambda a, b: pat.gather_block(rank, a, b))
        gather = getattr(tdist, "all_gather_single", None) or tdist.all_gather_into_tensor
        case.result = out
        case.call = lambda: gather(out, src)
        case.check_after = lambda c, w: compare(out, _gathered(per_rank, pat), c, w)
    elif op == "reduce_scatter":
        src, out = _zeros(elements, pat), _zeros(per_rank, pat)
        fill(src, pat.sum_input)
        scatter = getattr(tdist, "reduce_scatter_single", None) or tdist.reduce_scatter_tensor
        offset = rank * per_rank
        case.result = out
        case.call = lambda: scatter(out, src)
        case.check_after = lambda c, w: compare(
            out, lambda a, b: pat.sum_expected(offset + a, offset + b), c, w
        )
    else:
        buf = _zeros(elements, pat)
        if rank == ROOT:
            fill(buf, pat.broadcast_values)
        case.result = buf
        case.call = lambda: tdist.broadcast(buf, src=ROOT)
        case.check_after = lambda c, w: compare(buf, pat.broadcast_values, c, w)
    return case


def _gathered(per_rank: int, pat: Pattern) -> Callable[[int, int], torch.Tensor]:
    """Expected all-gather output: block r is rank r's pattern."""

    def expected(start: int, stop: int) -> torch.Tensor:
        k = torch.arange(start, stop, device=pat.device, dtype=torch.int64)
        return ((k % per_rank + k // per_rank) % GATHER_MODULUS).to(pat.dtype)

    return expected


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_case(case: Case, opts: Options, device: torch.device) -> tuple[float, Check]:
    """First call checked (untimed), ``warmup`` calls, ``iters`` timed calls between a barrier
    plus device sync and a device sync, then the buffers checked again. In-place all-reduce
    would grow the values n-fold per call: after its first check its buffer is zeroed, so the
    second check expects zeros (it catches corruption, not misplacement)."""
    pat, check = case.pattern, Check()
    case.call()
    _sync(device)
    if faults.corrupt_collective_op() == case.op and pat.rank == pat.world - 1:
        case.result.view(-1)[0] = -1  # test-only: a wrong value (no pattern is negative)
    case.check_after(check, "first")
    if case.op == "all_reduce":
        case.result.zero_()
        case.check_after = lambda c, w: compare(case.result, lambda a, b: _zeros(b - a, pat), c, w)
    for _ in range(opts.warmup):
        case.call()
    _sync(device)
    tdist.barrier()
    _sync(device)
    started = time.perf_counter()
    for _ in range(opts.iters):
        case.call()
    _sync(device)
    elapsed = (time.perf_counter() - started) / opts.iters
    case.check_after(check, "last")
    return elapsed, check


# ---------------------------------------------------------------- the whole run


def memory_budget(device: torch.device, local_ranks: int, max_memory: int) -> int:
    """min(--max-memory, 80% of the free memory): the device's, or this rank's share of the
    host's MemAvailable."""
    if device.type == "cuda":
        free = int(torch.cuda.mem_get_info(device)[0])
    else:
        free = _mem_available() // max(1, local_ranks)
    return min(max_memory, int(free * 0.8))


def _mem_available() -> int:
    try:
        with open("/proc/meminfo", "rb") as fh:
            text = fh.read(1 << 16).decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 30  # unknown: assume 1 GiB free rather than trusting --max-memory alone


def plan(opts: Options, world: int, budget: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """(cases to run as {op, requested_bytes, elements}, skipped with the reason)."""
    esize = torch.tensor([], dtype=DTYPES[opts.dtype]).element_size()
    runs: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for op in opts.ops:
        split = op in ("all_gather", "reduce_scatter")
        for size in size_ladder(opts.min_bytes, opts.max_bytes, opts.factor):
            unit = esize * (world if split else 1)
            elements = (size // unit) * (world if split else 1)
            need = elements * esize + (elements // world * esize if split else 0)
            entry = {"op": op, "requested_bytes": size}
            if elements == 0:
                skipped.append({**entry, "reason": f"smaller than {unit} bytes"})
            elif need + CHECK_OVERHEAD_BYTES > budget:
                reason = f"needs {need + CHECK_OVERHEAD_BYTES} bytes, budget {budget}"
                skipped.append({**entry, "reason": reason})
            else:
                runs.append({**entry, "elements": elements, "bytes": elements * esize})
    return runs, skipped


def _rank_info(env: dist.DistEnv, device: torch.device) -> dict[str, Any]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "rank": env.rank,
        "local_rank": env.local_rank,
        "node": env.node,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(device),
        "device_name": name,
    }


def measure_all(
    opts: Options, env: dist.DistEnv, device: torch.device, runs: list[dict[str, Any]]
) -> list[tuple[float, dict[str, Any]]]:
    """This rank's (seconds per call, check) for every planned case, in order."""
    out = []
    modulus = sum_modulus(env.world_size, opts.dtype)
    for entry in runs:
        pat = Pattern(env.world_size, env.rank, DTYPES[opts.dtype], device, modulus)
        case = build_case(entry["op"], entry["elements"], pat)
        seconds, check = run_case(case, opts, device)
        out.append((seconds, asdict(check)))
        del case
    return out


def summarise(
    runs: list[dict[str, Any]], per_rank: list[list[tuple[float, dict[str, Any]]]], world: int
) -> list[dict[str, Any]]:
    """One result per case: time = the slowest rank's mean call (the collective is not done
    before it is); algbw = bytes / time; busbw = algbw x the op's factor; checks of all ranks."""
    results = []
    for i, entry in enumerate(runs):
        times = [rank_rows[i][0] for rank_rows in per_rank]
        checks = [rank_rows[i][1] for rank_rows in per_rank]
        bad = [r for r, c in enumerate(checks) if not c["ok"]]
        seconds = max(times)
        algbw = entry["bytes"] / seconds if seconds > 0 else 0.0
        first = next((dict(checks[r]["first_bad"], rank=r) for r in bad), None)
        results.append(
            {
                **entry,
                "time_s": seconds,
                "time_s_min": min(times),
                "time_s_mean": sum(times) / len(times),
                "algbw": algbw,
                "busbw": algbw * busbw_factor(entry["op"], world),
                "correct": not bad,
                "check": {
                    "bad_ranks": bad,
                    "bad_elements": sum(c["bad_elements"] for c in checks),
                    "first_bad": first,
                },
            }
        )
    return results


def peaks(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per op, the highest busbw among correct results and the size it was reached at."""
    best: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["correct"] and (r["op"] not in best or r["busbw"] > best[r["op"]]["busbw"]):
            best[r["op"]] = {"busbw": r["busbw"], "algbw": r["algbw"], "bytes": r["bytes"]}
    return best


def verdict_of(results: list[dict[str, Any]]) -> str:
    if not results:
        return "inconclusive"
    return "passed" if all(r["correct"] for r in results) else "failed"


EXIT_FOR_VERDICT = {"passed": EXIT_OK, "failed": EXIT_FAILED, "inconclusive": EXIT_INCONCLUSIVE}


def _init_group(env: dist.DistEnv, device: torch.device, timeout_s: float) -> str:
    backend = dist.init(env, device, timeout_s=timeout_s)
    if backend is not None:
        return backend
    # One process: a one-rank group (busbw is 0 by the formulas, except broadcast).
    import datetime

    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    tdist.init_process_group(
        backend,
        store=tdist.HashStore(),
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )
    return backend


def run(opts: Options) -> tuple[int, dict[str, Any] | None, int]:
    """Every rank: (exit code, the document on rank 0 else None, world size)."""
    env = dist.detect()
    dist.set_threads(env)
    device = dist.pick_device(env, opts.device)
    started = time.time()
    backend = _init_group(env, device, opts.timeout_s)
    try:
        local = memory_budget(device, env.local_world_size, opts.max_memory)
        infos = dist.all_gather_object({**_rank_info(env, device), "budget": local}, env)
        budget = min(int(info.pop("budget")) for info in infos)
        runs, skipped = plan(opts, env.world_size, budget)
        mine = measure_all(opts, env, device, runs)
        per_rank = dist.all_gather_object(mine, env)
    finally:
        dist.teardown()
    results = summarise(runs, per_rank, env.world_size)
    verdict = verdict_of(results)
    if env.rank != 0:
        return EXIT_FOR_VERDICT[verdict], None, env.world_size
    doc = {
        "schema": COLLECTIVES_SCHEMA,
        "verdict": verdict,
        "started": started,
        "wall_s": time.time() - started,
        "world_size": env.world_size,
        "backend": backend,
        "device": device.type,
        "device_name": infos[0]["device_name"],
        "dtype": opts.dtype,
        "launch": env.source,
        "slurm_job_id": env.job_id,
        "versions": dist.versions(),
        "nodes": [info["node"] for info in infos],
        "unique_nodes": sorted({info["node"] for info in infos}),
        "ranks": infos,
        "options": {**asdict(opts), "ops": list(opts.ops), "memory_budget_bytes": budget},
        "root": ROOT,
        "results": results,
        "skipped": skipped,
        "peak": peaks(results),
    }
    return EXIT_FOR_VERDICT[verdict], doc, env.world_size
