"""Checkpoint layout: names, formats, the error type every check raises."""

from __future__ import annotations

import os
import re

from ..schema import CHECKPOINT_FORMAT, RANK_INDEX_FORMAT

MANIFEST = "manifest.json"
FORMAT = CHECKPOINT_FORMAT
INDEX_FORMAT = RANK_INDEX_FORMAT
STEP_RE = re.compile(r"^step-(\d{6,})$")
RANK0_KEYS = ("model", "optimizer", "scheduler", "rng", "data", "meta")
RANK_KEYS = ("rng", "data", "meta")
DATA_CHUNK = 32 << 20  # max bytes per data file


class CheckpointError(Exception):
    """A checkpoint that cannot be used; ``code`` is one of the drill reason codes."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def rank_file_name(rank: int) -> str:
    """The rank's index file (its data files are ``data_file_name(rank, i)``)."""
    return f"rank-{rank:05d}.pt"


def data_file_name(rank: int, i: int) -> str:
    return f"rank-{rank:05d}-{i:04d}.bin"


def sidecar_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def required_keys(rank: int) -> tuple[str, ...]:
    return RANK0_KEYS if rank == 0 else RANK_KEYS


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def fault_point(kind: str, step: int) -> None:
    """Test-only fault injection: TRAINER_FAULT=crash_before_manifest@STEP."""
    spec = os.environ.get("TRAINER_FAULT", "")
    if spec == f"{kind}@{step}":
        os._exit(137)
