"""A training session: model, optimizer, scheduler, data position and RNG on one rank;
one optimizer step, a snapshot for a checkpoint, loading a checkpoint (also resharded)."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as tdist
import torch.nn.functional as F

from . import checkpoint as ck
from . import dist, fingerprint, parallel, restore
from .config import Config
from .data import IGNORE_INDEX, MarkovSource
from .model import TinyGPT, flops_per_token, n_params
from .rng import rng_state, seed_all, set_rng_state
from .schema import Reason
from .statekeys import SHARDS


def lr_lambda_for(cfg: Config):
    warm, total, floor = cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio

    def f(i: int) -> float:
        if warm > 0 and i < warm:
            return (i + 1) / warm
        span = max(1, total - warm)
        prog = min(1.0, (i - warm) / span)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * prog))

    return f


__all__ = ["Session", "lr_lambda_for", "rng_state", "seed_all", "set_rng_state"]


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
        # FSDP shards the model in place (before the optimizer sees its parameters).
        self.net: torch.nn.Module = parallel.wrap(self.model, cfg, env, device)
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
        # This rank's own work before any collective of the step (DDP's forward has none):
        # a rank slower here than its peers is a straggler (its node, not the network).
        t_forward = time.perf_counter() - t0 - t_data
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
            "forward_time": t_forward,
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
        if self.cfg.strategy == "fsdp":
            sharded = parallel.sharded_state(self.model, self.opt, self.rank)
            state["model"] = conv(sharded["model"], "model")
            state["optimizer"] = conv(sharded["optimizer"], "optimizer")
            state[SHARDS] = sharded[SHARDS]
        elif self.rank == 0:
            state["model"] = conv(self.model.state_dict(), "model")
            state["optimizer"] = conv(self.opt.state_dict(), "optimizer")
            state[SHARDS] = parallel.whole_shards(state, self.optimizer_param_names())
        if self.rank == 0:
            state["scheduler"] = ck.clone_to_cpu(self.sched.state_dict())
        ck.copy_tensors(jobs)  # the bulk memcpy, split over the cores
        return state

    def load(
        self,
        path: str,
        manifest: dict[str, Any],
        expected: dict[str, Any] | None = None,
        mismatch_code: str = Reason.INCONSISTENT_STATE,
    ) -> dict[str, Any]:
        """Load a verified checkpoint onto this rank (collective for sharded state).
        Raises CheckpointError. ``expected``: the state fingerprint of the checkpoint
        (the manifest's when None) that every slice read by byte range is checked
        against; a mismatch raises ``mismatch_code``."""
        t0 = time.perf_counter()
        if self.cfg.strategy == "ddp" and ck.strategy_of(manifest) == "ddp":
            report = restore.load_replicated(self, path, manifest)
        else:
            if expected is None:
                expected = manifest.get("fingerprint")
            report = restore.load_sharded(self, path, manifest, expected, mismatch_code)
        report.update(
            strategy=self.cfg.strategy,
            strategy_at_save=ck.strategy_of(manifest),
            load_s=time.perf_counter() - t0,
        )
        return report
