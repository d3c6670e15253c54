"""The trainer's data-parallel scaling on this machine: 2 gloo ranks vs 1 process, pinned.

    .venv/bin/python bench/scaling_bench.py [--quick] [--reps 5] [--steps 30]

Both sides train the same model on the same global batch with the same total number of
threads on the same cores, so neither side can collapse alone when another process takes
a core:

* 1 process: ``batch_size = G``, 2 intra-op threads, pinned with ``taskset -c 0,1``;
* 2 ranks (gloo over loopback): ``batch_size = G/2`` each, 1 thread each, rank r pinned
  with ``taskset -c r``.

Ratio = samples/s of the 2 ranks / samples/s of the 1 process (ideal >= 1.0: no intra-op
threading loss, minus the all-reduce; goal >= 0.9). The sides alternate rep by rep
(A B, B A, A B, ...) so a slow moment hits both; the ratio is taken per rep and reported as
median, min and max. Samples/s are step-time weighted over the steps after warm-up, from
each run's own metrics.jsonl. MFU for fp32 and bf16: model FLOPs ((6N + 12·L·T·d) per
token, from acceptance.json) × tokens/s over the best 1024³ matmul rate on the same 2
threads, for both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def matmul_peak(threads: int, dtype: torch.dtype, seconds: float) -> float:
    torch.set_num_threads(threads)
    n = 1024
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(5):
            a @ b
        best = max(best, 5 * 2 * n**3 / (time.perf_counter() - t0))
    return best


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train(work: Path, name: str, cfg: dict, *, world: int, cpus: list[str]) -> dict[str, float]:
    """One ``python -m trainer train`` run (``world`` ranks, rank r pinned to ``cpus[r]``)."""
    run = work / name
    cfg_path = work / f"{name}.json"
    cfg_path.write_text(json.dumps(cfg))
    port = str(free_port())
    threads = "2" if world == 1 else "1"
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK"))}
        env.update(OMP_NUM_THREADS=threads, TRAINER_NUM_THREADS=threads, PYTHONPATH=str(REPO))
        if world > 1:
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                GLOO_SOCKET_IFNAME="lo",
            )
        argv = ["taskset", "-c", cpus[rank], sys.executable, "-m", "trainer", "train"]
        argv += ["--config", str(cfg_path), "--run-dir", str(run)]
        procs.append(
            subprocess.Popen(
                argv,
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} failed: {err[-2000:]}")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "event" not in x]
    acceptance = json.loads((run / "acceptance.json").read_text())
    body = steps[max(3, len(steps) // 5) :]
    total = sum(x["step_time"] for x in body)
    shutil.rmtree(run, ignore_errors=True)
    return {
        "samples_per_s": sum(x["samples_per_s"] * x["step_time"] for x in body) / total,
        "tokens_per_s": sum(x["tokens_per_s"] * x["step_time"] for x in body) / total,
        "flops_per_token": acceptance["flops_per_token"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 reps, 20 steps")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    reps = args.reps or (3 if args.quick else 5)
    steps = args.steps or (20 if args.quick else 30)
    if (os.cpu_count() or 1) < 2 or shutil.which("taskset") is None:
        print("needs 2 cores and taskset (util-linux)")
        return 1
    started = time.perf_counter()
    global_batch = 32
    model = {
        "vocab_size": 128,
        "d_model": 192,
        "n_layers": 3,
        "n_heads": 4,
        "seq_len": 64,
        "steps": steps,
        "checkpoint_every": 0,
        "log_every": 1,
        "data": {"order": 1},
    }
    work = Path(tempfile.mkdtemp(prefix="scaling-bench-"))
    results: dict[str, list[dict[str, float]]] = {}
    try:
        peak = {
            "fp32": matmul_peak(2, torch.float32, 2.0),
            "bf16": matmul_peak(2, torch.bfloat16, 2.0),
        }
        for precision in ("fp32", "bf16"):
            cfg = {**model, "precision": precision}
            for rep in range(reps):
                sides = ["one", "two"] if rep % 2 == 0 else ["two", "one"]
                for side in sides:
                    if side == "one":
                        got = train(
                            work,
                            f"{precision}-1p-{rep}",
                            {**cfg, "batch_size": global_batch},
                            world=1,
                            cpus=["0,1"],
                        )
                    else:
                        got = train(
                            work,
                            f"{precision}-2r-{rep}",
                            {**cfg, "batch_size": global_batch // 2},
                            world=2,
                            cpus=["0", "1"],
                        )
                    results.setdefault(f"{precision}-{side}", []).append(got)
                one = results[f"{precision}-one"][-1]["samples_per_s"]
                two = results[f"{precision}-two"][-1]["samples_per_s"]
                print(
                    f"  {precision} rep {rep}: 1 process {one:.1f} samples/s, 2 ranks "
                    f"{two:.1f} samples/s, ratio {two / one:.3f}",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    print(
        f"\n# scaling bench: torch {torch.__version__}, global batch {global_batch}, "
        f"{steps} steps, {reps} reps per side, alternating; 1 process x 2 threads on cores 0,1 "
        f"vs 2 gloo ranks x 1 thread on cores 0 and 1; load average {load:.1f} after the run"
    )
    print(
        f"{'precision':9} {'1p samples/s':>13} {'2r samples/s':>13} {'ratio median':>13} "
        f"{'min':>6} {'max':>6} {'MFU 1p':>7} {'MFU 2r':>7}  goal"
    )
    ok = True
    for precision in ("fp32", "bf16"):
        ones, twos = results[f"{precision}-one"], results[f"{precision}-two"]
        ratios = [b["samples_per_s"] / a["samples_per_s"] for a, b in zip(ones, twos, strict=True)]
        median = statistics.median(ratios)

        def mfu(runs: list[dict[str, float]], precision: str = precision) -> float:
            rate = statistics.median(r["tokens_per_s"] * r["flops_per_token"] for r in runs)
            return rate / peak[precision]

        passed = median >= 0.9
        ok = ok and (passed or precision == "bf16")
        print(
            f"{precision:9} {statistics.median(r['samples_per_s'] for r in ones):13.1f} "
            f"{statistics.median(r['samples_per_s'] for r in twos):13.1f} {median:13.3f} "
            f"{min(ratios):6.3f} {max(ratios):6.3f} {mfu(ones):7.3f} {mfu(twos):7.3f}  "
            f">= 0.90 {'PASS' if passed else 'FAIL'}"
        )
    print(
        f"matmul peak on 2 threads: fp32 {peak['fp32'] / 1e9:.1f} GFLOP/s, "
        f"bf16 {peak['bf16'] / 1e9:.1f} GFLOP/s; total {time.perf_counter() - started:.0f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
