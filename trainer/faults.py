"""Test-only fault injection, in one place: ``TRAINER_FAULT=<kind>@<where>`` in a rank's
environment makes the trainer fail as a real fault would, so tests and the fault suite can
prove what Gantry does about it. Unset (every real run), nothing here does anything.

- ``crash_before_manifest@STEP``: the process dies (exit 137) after writing a
  checkpoint's files and before its manifest (``checkpoint.writer``);
- ``nan_weights@STEP``: one weight becomes NaN after that step's update, as a silent
  corruption would make it (the losses after it, and the checkpoints saved after it, are NaN
  for real);
- ``exit_rank@STEP`` (the last rank) or ``exit_rank=R@STEP`` (rank R): after that step's
  update the rank exits at once with ``EXIT_RANK_FAULT`` (no clean-up, as a crashed process
  would), so srun reports the task and ends the others;
- ``collective_corrupt@OP``: the last rank corrupts its result of collective OP
  (``collectives``).

A run that resumed from a checkpoint fires none of the per-step faults: a recovery goes on
past the step instead of failing again. Torch is imported only when a weight is poisoned.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .schema import EXIT_RANK_FAULT

FAULT_ENV = "TRAINER_FAULT"


def _spec() -> str:
    return os.environ.get(FAULT_ENV, "")


def fault_at(kind: str, step: int) -> bool:
    """Whether the fault ``<kind>@<step>`` is set for this step."""
    return _spec() == f"{kind}@{step}"


def crash_point(kind: str, step: int) -> None:
    """Die here, as a killed process would, when ``<kind>@<step>`` is set."""
    if fault_at(kind, step):
        os._exit(137)


def corrupt_collective_op() -> str | None:
    """The collective whose result the last rank corrupts (``collective_corrupt@OP``)."""
    spec = _spec()
    return spec.split("@", 1)[1] if spec.startswith("collective_corrupt@") else None


def after_step(*, model: Any, rank: int, world_size: int, step: int, resumed: bool) -> None:
    """The per-step faults, called by the training loop after each step's update."""
    if resumed:
        return
    if fault_at("nan_weights", step):
        poison_weights(model)
    exit_rank_fault(rank=rank, world_size=world_size, step=step)


def poison_weights(model: Any) -> None:
    """One weight of ``model`` becomes NaN."""
    import torch

    with torch.no_grad():
        first = next(iter(model.parameters()))
        first.view(-1)[0] = float("nan")


def exit_rank_fault(*, rank: int, world_size: int, step: int) -> None:
    """``exit_rank[=R]@STEP``: rank R (default: the last) exits with ``EXIT_RANK_FAULT``."""
    spec = _spec()
    if not spec.startswith("exit_rank"):
        return
    who, _, at = spec.partition("@")
    if not at.isdigit() or int(at) != step:
        return
    if who == "exit_rank":
        target = world_size - 1
    elif who.startswith("exit_rank=") and who[len("exit_rank=") :].isdigit():
        target = int(who[len("exit_rank=") :])
    else:
        return
    if rank == target:
        print(
            f"trainer: {FAULT_ENV}={spec}: rank {rank} exits with {EXIT_RANK_FAULT} at step {step}",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(EXIT_RANK_FAULT)
