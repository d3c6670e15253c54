"""FSDP memory: peak memory per rank of an FSDP run at world size N against the DDP run's
model + optimizer state (parameters, their gradients, AdamW's two moments), side by side in
one run: DDP and FSDP at each N, the real trainer session (``trainer.session.Session``:
FSDP2 per block + root, AdamW, grad clipping), CPU, gloo, one thread per rank.

Peak memory of a rank = its peak anonymous (heap) memory over the measured training steps
minus its anonymous memory before the model was built (interpreter, torch, the process
group): the process's peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs`` after two
warm-up steps, so the full model each rank builds before sharding is not counted) less the
file-backed and shared pages resident at the end (torch's code paged in while training:
they stop growing after warm-up), less ``RssAnon`` before the model. glibc is told to map
every allocation above 128 KiB (``MALLOC_MMAP_THRESHOLD_``), so a freed tensor leaves the
resident set at once and RSS follows the live tensors.

Goal per rank: FSDP peak <= (1/N + 0.15) x DDP's model + optimizer state.

usage: .venv/bin/python bench/fsdp_memory_bench.py [--quick] [--worlds 2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import _benchlib as lib  # noqa: E402

# 50M parameters in 16 blocks: a block (the unit FSDP gathers) is 1/16 of the model, and
# the fixed cost of the distributed machinery (~27 MiB a rank, measured) is small next to it.
MODEL: dict[str, Any] = {
    "vocab_size": 64,
    "d_model": 512,
    "n_layers": 16,
    "n_heads": 8,
    "seq_len": 32,
    "batch_size": 1,
    "steps": 1000,
    "checkpoint_every": 0,
    "warmup_steps": 2,
    "data": {"order": 1, "branching": 4},
}
QUICK: dict[str, Any] = {**MODEL, "d_model": 384, "n_layers": 12, "n_heads": 6}
WARM_STEPS, MEASURED_STEPS = 2, 3
SLACK = 0.15


# ---------------------------------------------------------------- one rank


def _status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        match = re.search(rf"^{field}:\s+(\d+) kB", fh.read(), re.MULTILINE)
    assert match, field
    return int(match.group(1))


def _reset_peak() -> None:
    """VmHWM := current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")


def _local_bytes(t: Any) -> int:
    from torch.distributed.tensor import DTensor

    local = t.to_local() if isinstance(t, DTensor) else t
    return int(local.numel() * local.element_size())


def _state_bytes(session: Any) -> dict[str, int]:
    """What this rank holds between steps: parameters, gradients, optimizer state."""
    import torch

    params = list(session.model.parameters())
    moments = [
        v for s in session.opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    ]
    return {
        "params": sum(_local_bytes(p) for p in params),
        "grads": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(_local_bytes(v) for v in moments),
    }


def worker(strategy: str, model: dict[str, Any], out: str) -> None:
    import torch

    from trainer import dist
    from trainer.config import validate
    from trainer.session import Session

    env = dist.detect()
    dist.set_threads(env)
    device = torch.device("cpu")
    dist.init(env, device)
    dist.barrier()
    baseline_kb = _status_kb("RssAnon")
    session = Session(validate({**model, "strategy": strategy}), env, device)
    for _ in range(WARM_STEPS):
        session.train_step()
    dist.barrier()
    _reset_peak()
    t0 = time.perf_counter()
    for _ in range(MEASURED_STEPS):
        session.train_step()
    step_s = (time.perf_counter() - t0) / MEASURED_STEPS
    # VmHWM counts code pages too; those resident now were resident all along the steps.
    peak_kb = _status_kb("VmHWM") - _status_kb("RssFile") - _status_kb("RssShmem")
    result = {
        "rank": env.rank,
        "world": env.world_size,
        "strategy": strategy,
        "baseline_bytes": baseline_kb * 1024,
        "peak_bytes": (peak_kb - baseline_kb) * 1024,
        "state": _state_bytes(session),
        "n_params": session.n_params,
        "step_s": step_s,
    }
    Path(f"{out}.{env.rank}").write_text(json.dumps(result))
    dist.teardown()


# ---------------------------------------------------------------- the launcher


def launch(world: int, strategy: str, model: dict[str, Any], scratch: Path) -> list[dict]:
    out = scratch / f"{strategy}-{world}"
    port = str(lib.free_port())
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))
    }
    procs = []
    for rank in range(world):
        env = {
            **base,
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
            "MALLOC_MMAP_THRESHOLD_": str(128 << 10),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "GLOO_SOCKET_IFNAME": "lo",
        }
        argv = [sys.executable, __file__, "--worker", strategy, "--model", json.dumps(model)]
        procs.append(subprocess.Popen([*argv, "--out", str(out)], env=env, cwd=REPO))
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        raise SystemExit(f"{strategy} x {world}: exit codes {codes}")
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]


def _mb(n: float) -> str:
    return f"{n / 1e6:8.1f}"


def report(world: int, ddp: list[dict], fsdp: list[dict]) -> list[tuple[str, float, float]]:
    """Print one world size's rows; returns (what, ratio, goal) per FSDP rank."""
    ddp_state = max(sum(r["state"].values()) for r in ddp)
    ddp_peak = max(r["peak_bytes"] for r in ddp)
    goal = 1 / world + SLACK
    print(f"\nworld size {world}: DDP model + optimizer state per rank {_mb(ddp_state)} MB")
    print("  strategy rank  peak MB  state MB (params+grads+adam)  step s")
    for r in ddp + fsdp:
        state = r["state"]
        parts = "+".join(_mb(state[k]).strip() for k in ("params", "grads", "optimizer"))
        print(
            f"  {r['strategy']:8} {r['rank']:4} {_mb(r['peak_bytes'])} "
            f"{_mb(sum(state.values()))} ({parts})  {r['step_s']:.2f}"
        )
    rows = []
    for r in fsdp:
        ratio = r["peak_bytes"] / ddp_state
        rows.append((f"FSDP N={world} rank {r['rank']} peak / DDP state", ratio, goal))
        print(
            f"  rank {r['rank']}: FSDP peak / DDP state {ratio:.3f} (goal <= {goal:.3f} "
            f"{'PASS' if ratio <= goal else 'FAIL'}); / DDP peak {r['peak_bytes'] / ddp_peak:.3f}"
            f"; FSDP state / DDP state {sum(r['state'].values()) / ddp_state:.3f}"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--worker")
    parser.add_argument("--model")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, json.loads(args.model), args.out)
        return 0
    import torch

    model = QUICK if args.quick else MODEL
    t0 = time.time()
    print(
        f"# fsdp memory bench: torch {torch.__version__}, {os.cpu_count()} cores, gloo, "
        f"model {json.dumps({k: model[k] for k in ('d_model', 'n_layers', 'vocab_size')})}"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="fsdp-memory-bench-") as scratch:
        for world in [int(w) for w in args.worlds.split(",")]:
            ddp = launch(world, "ddp", model, Path(scratch))
            fsdp = launch(world, "fsdp", model, Path(scratch))
            if world == int(args.worlds.split(",")[0]):
                print(f"# {ddp[0]['n_params'] / 1e6:.1f}M parameters")
            rows += report(world, ddp, fsdp)
    failed = [r for r in rows if r[1] > r[2]]
    within = len(rows) - len(failed)
    print(f"\n{within}/{len(rows)} ranks within the goal; total {time.time() - t0:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
