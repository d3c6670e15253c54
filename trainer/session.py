"""A training session: model, optimizer, scheduler, data position and RNG on one rank;
one optimizer step, a snapshot for a checkpoint, loading a checkpoint (also resharded)."""

from __future__ import annotations

import math
import random
import time
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from . import checkpoint as ck
from . import dist, fingerprint
from .config import Config
from .data import IGNORE_INDEX, MarkovSource
from .model import TinyGPT, flops_per_token, n_params
from .schema import Reason


def lr_lambda_for(cfg: Config):
    warm, total, floor = cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio

    def f(i: int) -> float:
        if warm > 0 and i < warm:
            return (i + 1) / warm
        span = max(1, total - warm)
        prog = min(1.0, (i - warm) / span)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * prog))

    return f


def rng_state(device: torch.device) -> dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)
    return {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": np_state["state"]["key"].tolist(),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": np.array(n["key"], dtype=np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(state["torch"].cpu())
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def seed_all(seed: int, rank: int) -> None:
    random.seed(seed * 1000 + rank)
    np.random.seed((seed * 1000 + rank) % (2**32))
    torch.manual_seed(seed)


class Session:
    def __init__(self, cfg: Config, env: dist.DistEnv, device: torch.device) -> None:
        self.cfg = cfg
        self.env = env
        self.device = device
        self.rank = env.rank
        self.world = env.world_size
        self.source = MarkovSource(cfg)
        seed_all(cfg.seed, env.rank)
        torch.manual_seed(cfg.seed)  # identical init on every rank
        self.model = TinyGPT(cfg).to(device)
        self.n_params = n_params(self.model)
        self.net: torch.nn.Module = self.model
        if env.distributed:
            self.net = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None)
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95)
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda_for(cfg))
        torch.manual_seed(cfg.seed + 7919 * env.rank)  # per-rank stream from here on
        self.step = 0
        self.samples_consumed = 0
        self.per_rank_batch = cfg.batch_size
        self._snap_cache: dict[str, torch.Tensor] = {}  # reused async snapshot buffers
        # The training session's id, recorded in every rank's checkpoint files.
        self.save_id: str | None = None
        self.autocast = (
            torch.autocast(device_type=device.type, dtype=torch.bfloat16)
            if cfg.precision == "bf16"
            else nullcontext()
        )

    @property
    def global_batch(self) -> int:
        return self.per_rank_batch * self.world

    def optimizer_param_names(self) -> list[str]:
        """The model's parameter names in the optimizer's order (its state is by index)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        return [names.get(id(p), "?") for group in self.opt.param_groups for p in group["params"]]

    def fingerprint_part(self, state: dict[str, Any], full: bool = True) -> dict[str, Any]:
        """This rank's part of the state fingerprint, from a snapshot of its state."""
        return fingerprint.rank_part(
            state, rank=self.rank, param_names=self.optimizer_param_names(), full=full
        )

    def fingerprint_now(self, full: bool = True) -> dict[str, Any]:
        """Collective: the fingerprint of the live training state (every rank's part);
        ``full`` False: exact digests only, enough for a bit-for-bit comparison."""
        part = self.fingerprint_part(self.snapshot(copy=False), full=full)
        return fingerprint.merge(dist.all_gather_object(part, self.env))

    def flops_per_token(self) -> float:
        return flops_per_token(self.cfg, self.n_params)

    # -- one optimizer step -------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        start = self.samples_consumed + self.rank * self.per_rank_batch
        x, y = self.source.batch(start, self.per_rank_batch)
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        t_data = time.perf_counter() - t0
        lr = float(self.opt.param_groups[0]["lr"])
        with self.autocast if self.cfg.precision == "bf16" else nullcontext():
            logits = self.net(x)
        loss = F.cross_entropy(
            logits.float().reshape(-1, self.cfg.vocab_size),
            y.reshape(-1),
            ignore_index=IGNORE_INDEX,
        )
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        g = loss.detach().clone()
        if dist.is_initialized():
            tdist.all_reduce(g)
            g = g / self.world
        value = float(g.item())
        self.step += 1
        self.samples_consumed += self.global_batch
        return {
            "loss": value,
            "data_time": t_data,
            "lr": lr,
            "compute_time": time.perf_counter() - t0 - t_data,
        }

    # -- state ---------------------------------------------------------------------------------
    def data_state(self) -> dict[str, Any]:
        return {
            "samples_consumed": self.samples_consumed,
            "global_batch": self.global_batch,
            "per_rank_batch": self.per_rank_batch,
            "world_size": self.world,
            "rank_next_sample": self.samples_consumed + self.rank * self.per_rank_batch,
            "dataset_sha256": self.source.definition_sha256(),
        }

    def meta(self) -> dict[str, Any]:
        return {
            "save_id": self.save_id,
            "step": self.step,
            "rank": self.rank,
            "world_size": self.world,
            "config": self.cfg.to_dict(),
            "device": str(self.device),
            "precision": self.cfg.precision,
            "torch_threads": torch.get_num_threads(),
            "torch": str(torch.__version__),
        }

    def snapshot(self, copy: bool = True) -> dict[str, Any]:
        """This rank's checkpoint state; ``copy`` clones every tensor to CPU (async saves)."""
        cache = self._snap_cache
        jobs: list[tuple[torch.Tensor, torch.Tensor]] = []

        def conv(obj: Any, key: str) -> Any:
            if copy or self.device.type != "cpu":
                return ck.clone_into(obj, cache, key, jobs)
            return obj

        state: dict[str, Any] = {
            "rng": ck.clone_to_cpu(rng_state(self.device)),
            "data": self.data_state(),
            "meta": self.meta(),
        }
        if self.rank == 0:
            state["model"] = conv(self.model.state_dict(), "model")
            state["optimizer"] = conv(self.opt.state_dict(), "optimizer")
            state["scheduler"] = ck.clone_to_cpu(self.sched.state_dict())
        ck.copy_tensors(jobs)  # the bulk memcpy, split over the cores
        return state

    def load(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """Load a verified checkpoint onto this rank. Raises CheckpointError."""
        t0 = time.perf_counter()
        ranks = {int(f["rank"]) for f in manifest["files"] if f.get("role") == "index"}
        w_save = int(manifest["world_size"])
        report: dict[str, Any] = {"files_verified": [], "bytes": 0, "notes": []}

        def read(rank: int, into: dict[str, Any] | None = None) -> dict[str, Any]:
            # sizes + sha256 of the index and every data file, checked while reading
            obj, names, nbytes = ck.load_rank(path, manifest, rank, into)
            report["bytes"] += nbytes
            report["files_verified"] += names
            missing = [k for k in ck.required_keys(rank) if k not in obj]
            if missing:
                raise ck.CheckpointError(
                    Reason.MISSING_STATE,
                    f"{names[0]}: required state {', '.join(missing)} missing",
                )
            return obj

        if 0 not in ranks:
            raise ck.CheckpointError(Reason.MISSING_FILE, "manifest lists no rank-0 index file")
        # the weights are read straight into the parameters (load_state_dict then checks
        # keys/shapes and copies nothing); on failure the session is unusable anyway
        with torch.no_grad():
            st0 = read(0, {"model": self.model.state_dict()})
        try:
            self.model.load_state_dict(st0["model"], strict=True)
            # the loaded tensors are fresh private memory: no copy needed
            self.opt.load_state_dict(st0["optimizer"])
            self.sched.load_state_dict(st0["scheduler"])
        except (RuntimeError, ValueError, KeyError) as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ck.CheckpointError(
                Reason.LOAD_ERROR, f"state does not fit this config/model: {msg}"
            ) from None
        mine = st0 if self.rank == 0 else (read(self.rank) if self.rank in ranks else None)
        if mine is not None:
            set_rng_state(mine["rng"], self.device)
        else:
            seed_all(self.cfg.seed + int(st0["meta"]["step"]), self.rank)
            torch.manual_seed(self.cfg.seed + 7919 * self.rank + int(st0["meta"]["step"]))
            report["notes"].append(
                f"rank {self.rank} has no saved RNG state (world size at save {w_save}); "
                "seeded deterministically"
            )
        d = st0["data"]
        self.step = int(st0["meta"]["step"])
        self.samples_consumed = int(d["samples_consumed"])
        g_save = int(d["global_batch"])
        if self.world == w_save:
            self.per_rank_batch = self.cfg.batch_size
        elif g_save % self.world == 0:
            self.per_rank_batch = g_save // self.world
            report["notes"].append(
                f"resharded {w_save} -> {self.world} ranks: per-rank batch "
                f"{self.per_rank_batch} keeps the global batch {g_save}"
            )
        else:
            self.per_rank_batch = self.cfg.batch_size
            report["notes"].append(
                f"resharded {w_save} -> {self.world} ranks: global batch {g_save} is not "
                f"divisible by {self.world}; global batch becomes {self.global_batch}"
            )
        report.update(
            step=self.step,
            samples_consumed=self.samples_consumed,
            world_size_at_save=w_save,
            per_rank_batch=self.per_rank_batch,
            global_batch=self.global_batch,
            global_batch_at_save=g_save,
            load_s=time.perf_counter() - t0,
        )
        return report
