"""Trainer benchmarks, measured side by side in one run (issue 4, "Performance").

    .venv/bin/python bench/trainer_bench.py [--quick] [--dir DIR]

Prints: durable checkpoint save MB/s vs `dd ... conv=fdatasync` of a size-matched file; load
MB/s vs cold `dd` read (page cache dropped); async save blocking time vs synchronous save
time; 2-rank DDP (gloo) vs 1-process throughput at the same per-rank batch; model FLOP
utilisation against a measured matmul peak; tokens/s for fp32 and bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import _benchlib as lib  # noqa: E402
import torch  # noqa: E402

from trainer import checkpoint as ck  # noqa: E402
from trainer import dist  # noqa: E402
from trainer.config import validate  # noqa: E402
from trainer.session import Session  # noqa: E402

MB = 1e6


def drop_caches(paths: list[Path]) -> str:
    """Evict ``paths`` (files, or directories: every file in them) from the page cache."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return "drop_caches"
    except OSError:
        files = [f for p in paths for f in (sorted(p.iterdir()) if p.is_dir() else [p])]
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"


def dd_write(path: Path, nbytes: int) -> float:
    """`dd bs=1M conv=fdatasync` of exactly ``nbytes`` (iflag=count_bytes): the baseline."""
    t0 = time.perf_counter()
    subprocess.run(
        [
            "dd",
            "if=/dev/zero",
            f"of={path}",
            "bs=1M",
            f"count={nbytes}",
            "iflag=count_bytes",
            "conv=fdatasync",
        ],
        check=True,
        capture_output=True,
    )
    assert path.stat().st_size == nbytes
    return nbytes / (time.perf_counter() - t0) / MB


def dd_read(path: Path) -> float:
    n = path.stat().st_size
    drop_caches([path])
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    return n / (time.perf_counter() - t0) / MB


def checkpoint_bench(work: Path, quick: bool) -> dict[str, float]:
    d_model, layers = (256, 4) if quick else (512, 6)
    cfg = validate(
        {
            "vocab_size": 256,
            "d_model": d_model,
            "n_layers": layers,
            "n_heads": 8,
            "seq_len": 32,
            "batch_size": 2,
            "steps": 10,
        }
    )
    s = Session(cfg, dist.DistEnv(), torch.device("cpu"))
    s.train_step()  # optimizer state exists
    res: dict[str, float] = {"params": float(s.n_params)}
    reps = 2 if quick else 5
    sync_t, async_block, save_mbs, load_mbs, dd_w, dd_r = [], [], [], [], [], []
    for i in range(reps):
        root = work / f"ck-sync-{i}"
        w = ck.CheckpointWriter(str(root), 0, 1, "b", False, 5)
        t = w.save(1, s.snapshot, {"config": cfg.to_dict()})
        assert not w.errors, w.errors
        nbytes = ck.load_manifest(str(root / "step-000001"))["total_bytes"]
        sync_t.append(t)
        save_mbs.append(nbytes / t / MB)
        # size-matched dd with fdatasync, right after
        ddf = work / f"dd-{i}.bin"
        dd_w.append(dd_write(ddf, nbytes))
        # async: blocked time for the same state
        aroot = work / f"ck-async-{i}"
        aw = ck.CheckpointWriter(str(aroot), 0, 1, "b", True, 5)
        if i == 0:  # first async save allocates the reusable snapshot buffers
            aw.save(0, s.snapshot, {"config": cfg.to_dict()})
            aw.wait()  # steady state: the previous save finished long ago
        async_block.append(aw.save(1, s.snapshot, {"config": cfg.to_dict()}))
        aw.wait()
        assert not aw.errors, aw.errors
        # cold load (read + sha256 + torch.load + load_state_dict) vs cold dd read
        path = root / "step-000001"
        man = ck.load_manifest(str(path))
        mode = drop_caches([path])
        t0 = time.perf_counter()
        s.load(str(path), man)
        load_mbs.append(nbytes / (time.perf_counter() - t0) / MB)
        dd_r.append(dd_read(ddf))
        print(
            f"  rep {i}: save {save_mbs[-1]:.0f} MB/s vs dd {dd_w[-1]:.0f} "
            f"({save_mbs[-1] / dd_w[-1]:.2f}); load {load_mbs[-1]:.0f} vs dd read {dd_r[-1]:.0f} "
            f"({load_mbs[-1] / dd_r[-1]:.2f}); async blocked {async_block[-1] * 1e3:.1f} ms vs "
            f"sync {sync_t[-1] * 1e3:.0f} ms ({async_block[-1] / sync_t[-1]:.3f}); "
            f"{len(man['files'])} files",
            flush=True,
        )
        ddf.unlink()
        shutil.rmtree(aroot)
        shutil.rmtree(root)
    res.update(
        ckpt_bytes=float(nbytes),
        save_mbs=statistics.median(save_mbs),
        dd_write_mbs=statistics.median(dd_w),
        load_mbs=statistics.median(load_mbs),
        dd_read_mbs=statistics.median(dd_r),
        sync_save_s=statistics.median(sync_t),
        async_block_s=statistics.median(async_block),
        # each rep measures ours and the baseline back to back: the median of the paired
        # ratios is less sensitive to a slow moment (other jobs share the disk/cores) than a
        # ratio of medians taken at different moments
        save_ratio=statistics.median(a / b for a, b in zip(save_mbs, dd_w, strict=True)),
        load_ratio=statistics.median(a / b for a, b in zip(load_mbs, dd_r, strict=True)),
        async_ratio=statistics.median(a / b for a, b in zip(async_block, sync_t, strict=True)),
    )
    res["cache_drop"] = 1.0 if mode == "drop_caches" else 0.0
    return res


def matmul_peak(threads: int, dtype: torch.dtype, seconds: float) -> float:
    torch.set_num_threads(threads)
    n = 1024
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    best = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(5):
            a @ b
        best = max(best, 5 * 2 * n**3 / (time.perf_counter() - t0))
    return best


def train_run(
    work: Path, name: str, world: int, cfg: dict, threads: int, cpus: list[str] | None = None
) -> dict[str, float]:
    """One ``python -m trainer train`` run of ``world`` ranks with ``threads`` each; with
    ``cpus``, rank r is pinned with ``taskset -c cpus[r]``. Step-time weighted throughput
    over the steps after warm-up, from the run's own metrics.jsonl."""
    run = work / name
    cfgp = work / f"{name}.json"
    cfgp.write_text(json.dumps(cfg))
    port = str(lib.free_port())
    procs = []
    for r in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK"))}
        env.update(
            OMP_NUM_THREADS=str(threads), TRAINER_NUM_THREADS=str(threads), PYTHONPATH=str(REPO)
        )
        if world > 1:
            env.update(
                RANK=str(r),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(r),
                LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                GLOO_SOCKET_IFNAME="lo",
            )
        pin = ["taskset", "-c", cpus[r]] if cpus else []
        procs.append(
            subprocess.Popen(
                [
                    *pin,
                    sys.executable,
                    "-m",
                    "trainer",
                    "train",
                    "--config",
                    str(cfgp),
                    "--run-dir",
                    str(run),
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"{name} failed: {err[-2000:]}")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "event" not in x]
    acc = json.loads((run / "acceptance.json").read_text())
    warm = max(3, len(steps) // 5)
    body = steps[warm:]
    total_t = sum(x["step_time"] for x in body)
    return {
        "samples_per_s": sum(x["samples_per_s"] * x["step_time"] for x in body) / total_t,
        "tokens_per_s": sum(x["tokens_per_s"] * x["step_time"] for x in body) / total_t,
        "flops_per_token": acc["flops_per_token"],
    }


def throughput_runs(work: Path, quick: bool, cores: int) -> dict[str, Any]:
    """The matmul peaks, then a small model trained by 1 process, by 2 ranks (gloo) at the
    same per-rank batch, and by 1 process in bf16."""
    peak32 = matmul_peak(cores, torch.float32, 1.0 if quick else 2.0)
    peak16 = matmul_peak(cores, torch.bfloat16, 1.0 if quick else 2.0)
    model = {
        "vocab_size": 64,
        "d_model": 128,
        "n_layers": 2,
        "n_heads": 4,
        "seq_len": 64,
        "batch_size": 16,
        "steps": 25 if quick else 50,
        "checkpoint_every": 0,
        "data": {"order": 1},
    }
    return {
        "peak32": peak32,
        "peak16": peak16,
        "one": train_run(work, "w1-fp32", 1, model, cores),
        "two": train_run(work, "w2-fp32", 2, model, max(1, cores // 2)),
        "bf": train_run(work, "w1-bf16", 1, {**model, "precision": "bf16"}, cores),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", default=None, help="scratch dir (default: a temp dir)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trainer-bench-", dir=args.dir))
    cores = os.cpu_count() or 1
    t_all = time.perf_counter()
    try:
        print(
            f"# trainer bench: torch {torch.__version__}, {cores} cores, scratch {work}", flush=True
        )
        c = checkpoint_bench(work, args.quick)
        print(
            f"checkpoint: {c['ckpt_bytes'] / MB:.1f} MB ({c['params'] / 1e6:.1f}M params)",
            flush=True,
        )
        t = throughput_runs(work, args.quick, cores)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_rows(result_rows(c, t))
    two = t["two"]
    print(
        f"\n2-rank tokens/s {two['tokens_per_s']:.0f}; 2-rank MFU "
        f"{two['tokens_per_s'] * two['flops_per_token'] / t['peak32']:.3f}; cache drop: "
        f"{'drop_caches' if c['cache_drop'] else 'posix_fadvise'}; "
        f"total {time.perf_counter() - t_all:.0f}s"
    )
    return 0


def result_rows(
    c: dict[str, float], t: dict[str, Any]
) -> list[tuple[str, float, str, float, float, str]]:
    """(measure, value, baseline, its value, ratio, goal) per row of the table."""
    one, two, bf, peak32, peak16 = t["one"], t["two"], t["bf"], t["peak32"], t["peak16"]
    return [
        (
            "save MB/s (durable, sync)",
            c["save_mbs"],
            "dd write+fdatasync MB/s",
            c["dd_write_mbs"],
            c["save_ratio"],
            ">= 0.60",
        ),
        (
            "load MB/s (cold, verified)",
            c["load_mbs"],
            "dd cold read MB/s",
            c["dd_read_mbs"],
            c["load_ratio"],
            ">= 0.50",
        ),
        (
            "async blocking s",
            c["async_block_s"],
            "sync save s",
            c["sync_save_s"],
            c["async_ratio"],
            "<= 0.20",
        ),
        (
            "2-rank samples/s",
            two["samples_per_s"],
            "1-proc samples/s",
            one["samples_per_s"],
            two["samples_per_s"] / one["samples_per_s"],
            ">= 0.90",
        ),
        (
            "fp32 model TFLOP/s (1p)",
            one["tokens_per_s"] * one["flops_per_token"] / 1e12,
            "fp32 matmul peak TFLOP/s",
            peak32 / 1e12,
            one["tokens_per_s"] * one["flops_per_token"] / peak32,
            "MFU",
        ),
        (
            "bf16 model TFLOP/s (1p)",
            bf["tokens_per_s"] * bf["flops_per_token"] / 1e12,
            "bf16 matmul peak TFLOP/s",
            peak16 / 1e12,
            bf["tokens_per_s"] * bf["flops_per_token"] / peak16,
            "MFU",
        ),
        (
            "tokens/s bf16",
            bf["tokens_per_s"],
            "tokens/s fp32",
            one["tokens_per_s"],
            bf["tokens_per_s"] / one["tokens_per_s"],
            "info",
        ),
    ]


def print_rows(rows: list[tuple[str, float, str, float, float, str]]) -> None:
    print("\nvalues: medians over the reps; checkpoint ratios: median of the per-rep ratios")
    print(f"{'measure':28} {'value':>10}   {'baseline':26} {'value':>10}  {'ratio':>6}  goal")
    for a, av, b, bv, r, goal in rows:
        ok = ""
        if goal.startswith(">="):
            ok = "PASS" if r >= float(goal[3:]) else "FAIL"
        elif goal.startswith("<="):
            ok = "PASS" if r <= float(goal[3:]) else "FAIL"
        print(f"{a:28} {av:10.4g}   {b:26} {bv:10.4g}  {r:6.3f}  {goal} {ok}")


if __name__ == "__main__":
    sys.exit(main())
