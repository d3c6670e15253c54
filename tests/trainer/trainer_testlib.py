"""Helpers for the trainer tests: tiny configs, in-process and multi-process launches.

(Not named conftest: tests/conftest.py exists and module names would clash.)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable

torch.set_num_threads(1)  # same thread count in-process and in subprocesses: bit-exact runs


def tiny_config(**over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "preset": "tiny",
        "d_model": 32,
        "n_layers": 1,
        "n_heads": 2,
        "seq_len": 16,
        "batch_size": 4,
        "steps": 6,
        "checkpoint_every": 3,
        "warmup_steps": 2,
        "data": {"order": 2, "branching": 3},
    }
    data = over.pop("data", None)
    cfg.update(over)
    if data:
        cfg["data"] = {**cfg["data"], **data}
    return cfg


def write_config(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(json.dumps(cfg))
    return path


def sub_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra)
    return env


def run_trainer(args: list[str], timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    """``python -m trainer ARGS`` as a single process."""
    return subprocess.run(
        [PY, "-m", "trainer", *args],
        cwd=REPO,
        env=sub_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_ranks(
    world: int, args: list[str], timeout: float = 240, **env: str
) -> list[subprocess.CompletedProcess]:
    """Launch ``python -m trainer ARGS`` as ``world`` processes (torchrun-style env)."""
    port = str(free_port())
    procs = []
    for r in range(world):
        e = sub_env(
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            GLOO_SOCKET_IFNAME="lo",
            **env,
        )
        procs.append(
            subprocess.Popen(
                [PY, "-m", "trainer", *args],
                cwd=REPO,
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append(subprocess.CompletedProcess(p.args, p.returncode, so, se))
    return out


def cli(args: list[str]) -> int:
    """Run the CLI in-process (single process only)."""
    from trainer.cli import main

    return main(args)


def read_lines(run_dir: Path) -> list[dict[str, Any]]:
    from trainer.metrics import read_jsonl

    return read_jsonl(str(run_dir / "metrics.jsonl"))


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_lines(run_dir) if "event" not in r}


def ckpt(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def ok(procs: list[subprocess.CompletedProcess]) -> list[subprocess.CompletedProcess]:
    """Every rank exited 0 (else the first failing rank's stderr)."""
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
    return procs


def drill_ranks(
    world: int, checkpoint: Path, reference: Path, out: Path, steps: int = 3, *extra: str
) -> tuple[list[int], dict[str, Any]]:
    """A drill on ``world`` ranks (in-process for one); (exit codes, drill.json)."""
    args = [
        "drill",
        "--checkpoint",
        str(checkpoint),
        "--reference",
        str(reference),
        "--steps",
        str(steps),
        "--out",
        str(out),
        *extra,
    ]
    codes = [cli(args)] if world == 1 else [p.returncode for p in launch_ranks(world, args)]
    return codes, json.loads(out.read_text())
