"""Checkpoint layout: names, formats, the error type every check raises."""

from __future__ import annotations

import re

from ..schema import CHECKPOINT_FORMAT, CHECKPOINT_FORMATS_READ, RANK_INDEX_FORMAT

MANIFEST = "manifest.json"
FORMAT = CHECKPOINT_FORMAT
READ_FORMATS = CHECKPOINT_FORMATS_READ
INDEX_FORMAT = RANK_INDEX_FORMAT
STEP_RE = re.compile(r"^step-(\d{6,})$")
RANK0_KEYS = ("model", "optimizer", "scheduler", "rng", "data", "meta")
RANK_KEYS = ("rng", "data", "meta")
# FSDP: every rank holds its slices of the model and optimizer state, and their table.
SHARDED_RANK0_KEYS = (*RANK0_KEYS, "shards")
SHARDED_RANK_KEYS = ("model", "optimizer", "shards", *RANK_KEYS)
DATA_CHUNK = 32 << 20  # max bytes per data file


class CheckpointError(Exception):
    """A checkpoint that cannot be used; ``code`` is one of the drill reason codes.
    ``collective``: every rank raised the same error (found together, e.g. a shard's
    digest summed over the ranks that read it); its reason names the rank at fault."""

    def __init__(self, code: str, reason: str, collective: bool = False) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.collective = collective


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def rank_file_name(rank: int) -> str:
    """The rank's index file (its data files are ``data_file_name(rank, i)``)."""
    return f"rank-{rank:05d}.pt"


def data_file_name(rank: int, i: int) -> str:
    return f"rank-{rank:05d}-{i:04d}.bin"


def sidecar_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def required_keys(rank: int, strategy: str = "ddp") -> tuple[str, ...]:
    if strategy == "fsdp":
        return SHARDED_RANK0_KEYS if rank == 0 else SHARDED_RANK_KEYS
    return RANK0_KEYS if rank == 0 else RANK_KEYS


def strategy_of(manifest: dict[str, object]) -> str:
    """The strategy a checkpoint was saved with (format 2 knew only DDP)."""
    return str(manifest.get("strategy") or "ddp")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
