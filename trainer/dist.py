"""Rank/world discovery (Slurm, torchrun, single process), process-group setup, teardown."""

from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    source: str = "single"  # slurm | torchrun | single
    master_addr: str | None = None
    master_port: int | None = None
    node: str = ""
    job_id: str | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int_env(name: str) -> int | None:
    val = os.environ.get(name)
    if val is None or val.strip() == "":
        return None
    try:
        return int(val.split("(")[0].split(",")[0])
    except ValueError:
        return None


def _scontrol(*args: str) -> str:
    return subprocess.run(
        ["scontrol", *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout


def _slurm_master_addr() -> str:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise RuntimeError("MASTER_ADDR unset and SLURM_JOB_NODELIST unset")
    first = _scontrol("show", "hostnames", nodelist).split()[0]
    out = _scontrol("show", "node", first)
    for tok in out.split():
        if tok.startswith("NodeAddr="):
            return tok.split("=", 1)[1]
    return first


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def detect() -> DistEnv:
    env = DistEnv(node=node_name(), job_id=os.environ.get("SLURM_JOB_ID"))
    if os.environ.get("SLURM_PROCID") is not None and _int_env("SLURM_NTASKS") is not None:
        env.source = "slurm"
        env.rank = _int_env("SLURM_PROCID") or 0
        env.world_size = _int_env("SLURM_NTASKS") or 1
        env.local_rank = _int_env("SLURM_LOCALID") or 0
        env.local_world_size = (
            _int_env("SLURM_NTASKS_PER_NODE") or _int_env("SLURM_STEP_TASKS_PER_NODE") or 1
        )
        if env.world_size > 1:
            env.master_addr = os.environ.get("MASTER_ADDR") or _slurm_master_addr()
            port = _int_env("MASTER_PORT")
            if port is None:
                port = 20000 + int(env.job_id or "0") % 10000
            env.master_port = port
    elif os.environ.get("RANK") is not None and _int_env("WORLD_SIZE") is not None:
        env.source = "torchrun"
        env.rank = _int_env("RANK") or 0
        env.world_size = _int_env("WORLD_SIZE") or 1
        env.local_rank = _int_env("LOCAL_RANK") or 0
        env.local_world_size = _int_env("LOCAL_WORLD_SIZE") or 1
        env.master_addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        env.master_port = _int_env("MASTER_PORT") or 29500
    return env


def set_threads(env: DistEnv) -> int:
    """TRAINER_NUM_THREADS wins; else OMP_NUM_THREADS (torch honours it); else share cores."""
    explicit = _int_env("TRAINER_NUM_THREADS")
    if explicit:
        torch.set_num_threads(explicit)
    elif os.environ.get("OMP_NUM_THREADS") is None and env.local_world_size > 1:
        cpus = _int_env("SLURM_CPUS_PER_TASK") or max(
            1, (os.cpu_count() or 1) // env.local_world_size
        )
        torch.set_num_threads(cpus)
    return torch.get_num_threads()


def set_deterministic(device: torch.device) -> None:
    """The same results for the same inputs on this device: deterministic kernels only,
    cuDNN without autotuning, no TF32. ``CUBLAS_WORKSPACE_CONFIG`` must be set before CUDA
    starts: call before the first CUDA operation."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    if device.type == "cuda":
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def pick_device(env: DistEnv, want: str) -> torch.device:
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("config device='cuda' but CUDA is not available")
        idx = env.local_rank % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    return torch.device("cpu")


def init(env: DistEnv, device: torch.device, timeout_s: float = 600.0) -> str | None:
    """Initialise the default process group; returns the backend or None if single process."""
    if not env.distributed:
        return None
    os.environ["MASTER_ADDR"] = str(env.master_addr)
    os.environ["MASTER_PORT"] = str(env.master_port)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )
    return backend


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if is_initialized():
        dist.barrier()


def all_gather_object(obj: Any, env: DistEnv) -> list[Any]:
    if not is_initialized():
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    if not is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def teardown() -> None:
    """Barrier then destroy; errors at shutdown are reported, never raised."""
    if not is_initialized():
        return
    try:
        dist.barrier()
    except Exception as exc:  # a peer that already exited must not fail a finished run
        print(f"trainer: warning: barrier at shutdown failed: {exc}", file=sys.stderr)
    try:
        dist.destroy_process_group()
    except Exception as exc:
        print(f"trainer: warning: destroy_process_group failed: {exc}", file=sys.stderr)


def versions() -> dict[str, Any]:
    from . import __version__, source_digest

    nccl: str | None = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            nccl = None
    return {
        "trainer": __version__,
        "trainer_digest": source_digest(),
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "nccl": nccl,
        "numpy": _numpy_version(),
        "platform": platform.platform(),
    }


def _numpy_version() -> str | None:
    try:
        import numpy

        return str(numpy.__version__)
    except Exception:
        return None


def devices() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(
                {
                    "type": "cuda",
                    "index": i,
                    "name": p.name,
                    "memory_bytes": int(p.total_memory),
                    "capability": f"{p.major}.{p.minor}",
                }
            )
    else:
        out.append(
            {
                "type": "cpu",
                "name": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
            }
        )
    return out


def describe() -> dict[str, Any]:
    env = detect()
    return {
        "versions": versions(),
        "devices": devices(),
        "cuda_available": torch.cuda.is_available(),
        "backend": "nccl" if torch.cuda.is_available() else "gloo",
        "gloo_available": dist.is_available() and dist.is_gloo_available(),
        "nccl_available": dist.is_available() and dist.is_nccl_available(),
        "bf16_supported_cpu": True,
        "bf16_supported_cuda": bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported()),
        "node": env.node,
        "launch": {
            "source": env.source,
            "rank": env.rank,
            "world_size": env.world_size,
            "local_rank": env.local_rank,
            "slurm_job_id": env.job_id,
        },
    }
