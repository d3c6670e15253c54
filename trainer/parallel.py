"""Distribution strategies: DDP replicas or FSDP2 shards, and the state each rank saves.

FSDP2 (``torch.distributed.fsdp.fully_shard``) shards every parameter on dim 0 over a 1-D
device mesh of all ranks: each transformer block is one unit (gathered for its forward and
backward, resharded after), the root holds the rest (embeddings, final norm, head).
Gradients and AdamW state follow the parameters' sharding. bf16 runs compute with bf16
parameters and reduce gradients in fp32 (``MixedPrecisionPolicy``); the sharded master
weights stay fp32. The sharded state is read with ``get_state_dict`` (DTensors) and each
rank keeps only its local slices plus where they sit in the global tensor.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard
from torch.nn.parallel import DistributedDataParallel as DDP

from .config import Config
from .dist import DistEnv
from .model import TinyGPT
from .statekeys import SHARD0, WHOLE, model_key, optimizer_key, state_leaves


def ensure_process_group(device: torch.device) -> None:
    """FSDP needs a process group even for one rank: a single-rank group on an in-process
    store (no port, no peers) when no launcher made one."""
    if tdist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    tdist.init_process_group(backend, store=tdist.HashStore(), rank=0, world_size=1, **kwargs)


def mixed_precision(cfg: Config) -> MixedPrecisionPolicy:
    if cfg.precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_model(model: TinyGPT, cfg: Config, env: DistEnv, device: torch.device) -> DeviceMesh:
    """Apply FSDP2 to ``model`` in place: each block, then the root. Returns the mesh."""
    ensure_process_group(device)
    mesh = init_device_mesh(device.type, (env.world_size,))
    policy = mixed_precision(cfg)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return mesh


def fixed_buckets(cfg: Config, device: torch.device) -> bool:
    """Whether DDP keeps its gradient buckets as built (parameter order) for the whole run.

    By default DDP rebuilds its buckets once, after the first step, in the order gradients
    became ready. A ring all-reduce over three or more ranks sums each element in an order
    set by its position in the bucket, so a run resumed from a checkpoint (whose first
    step is again "the first") sums some gradients in another order than the run that
    saved it: losses one ulp apart a few steps later, and a drill's bit-for-bit comparison
    fails for nothing (two ranks never show it: a + b == b + a). DDP never rebuilds with
    ``find_unused_parameters`` (a graph walk per step, small next to the step), so every
    run of the same world size sums in the same order. Where runs compare bit for bit: on
    CPUs always, on GPUs when deterministic."""
    return device.type == "cpu" or cfg.deterministic


def wrap(model: TinyGPT, cfg: Config, env: DistEnv, device: torch.device) -> nn.Module:
    """The module the training step calls: the model (FSDP, sharded in place), DDP around
    it, or the bare model (one DDP rank)."""
    if cfg.strategy == "fsdp":
        shard_model(model, cfg, env, device)
        return model
    if env.distributed:
        return DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=fixed_buckets(cfg, device),
        )
    return model


def _whole(value: torch.Tensor) -> dict[str, Any]:
    return {
        "placement": WHOLE,
        "global_shape": list(value.shape),
        "dtype": str(value.dtype).removeprefix("torch."),
        "nbytes": value.numel() * value.element_size(),
    }


def _local(value: torch.Tensor, key: str, shards: dict[str, Any]) -> torch.Tensor:
    """The rank's slice of a DTensor sharded on dim 0, its placement noted in ``shards``."""
    if not isinstance(value, DTensor):
        shards[key] = _whole(value)
        return value
    if tuple(value.placements) != (Shard(0),):
        raise RuntimeError(f"{key}: placement {value.placements} is not Shard(0)")
    local = value.to_local()
    chunks = value.__create_chunk_list__()  # the DCP protocol: this rank's offsets
    start = int(chunks[0].offsets[0]) if chunks and local.dim() else 0
    shards[key] = {
        "placement": SHARD0,
        "global_shape": list(value.shape),
        "start": start,
        "rows": int(local.shape[0]) if local.dim() else 0,
        "dtype": str(value.dtype).removeprefix("torch."),
        "nbytes": local.numel() * local.element_size(),
    }
    return local


def sharded_state(model: nn.Module, opt: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
    """This rank's part of an FSDP state: ``model`` and ``optimizer`` with local slices
    (optimizer state keyed by parameter name); replicated entries (AdamW's step counts, the
    param groups) only on rank 0; ``shards``: every slice's placement."""
    model_sd, optim_state = get_state_dict(model, opt)
    optim_sd: dict[str, Any] = dict(optim_state)  # FQN-keyed: {state, param_groups}
    shards: dict[str, Any] = {}
    model_out = {
        name: _local(value, model_key(name), shards)
        for name, value in model_sd.items()
        if isinstance(value, torch.Tensor) and (isinstance(value, DTensor) or rank == 0)
    }
    state_out: dict[str, dict[str, Any]] = {}
    for name, entries in optim_sd["state"].items():
        mine: dict[str, Any] = {}
        for entry, value in entries.items():
            if isinstance(value, DTensor) or (rank == 0 and isinstance(value, torch.Tensor)):
                mine[entry] = _local(value, optimizer_key(name, entry), shards)
            elif rank == 0:
                mine[entry] = value
        state_out[str(name)] = mine
    optimizer: dict[str, Any] = {"state": state_out}
    if rank == 0:
        optimizer["param_groups"] = optim_sd["param_groups"]
    return {"model": model_out, "optimizer": optimizer, "shards": shards}


def whole_shards(state: dict[str, Any], param_names: list[str]) -> dict[str, Any]:
    """The ``shards`` table of a DDP rank 0: every tensor whole on that rank."""
    return {
        key: _whole(value)
        for key, value in state_leaves(state, param_names)
        if isinstance(value, torch.Tensor)
    }
