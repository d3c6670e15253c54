"""Slurm's job states, as phases Gantry moves objects by."""

from __future__ import annotations


class Phase:
    """Where a Slurm job is, in Gantry's words (the values are also Job states)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETING = "completing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    NODE_FAIL = "node_fail"

    FINAL = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL})


# Slurm's job states, as phases.
SLURM_STATE_MAP: dict[str, str] = {
    "PENDING": Phase.PENDING,
    "CONFIGURING": Phase.PENDING,
    "REQUEUED": Phase.PENDING,
    "REQUEUE_FED": Phase.PENDING,
    "REQUEUE_HOLD": Phase.PENDING,
    "RESV_DEL_HOLD": Phase.PENDING,
    "RUNNING": Phase.RUNNING,
    "SUSPENDED": Phase.RUNNING,
    "STOPPED": Phase.RUNNING,
    "RESIZING": Phase.RUNNING,
    "SIGNALING": Phase.RUNNING,
    "STAGE_OUT": Phase.COMPLETING,
    "COMPLETING": Phase.COMPLETING,
    "COMPLETED": Phase.COMPLETED,
    "FAILED": Phase.FAILED,
    "BOOT_FAIL": Phase.FAILED,
    "OUT_OF_MEMORY": Phase.FAILED,
    "PREEMPTED": Phase.FAILED,
    "SPECIAL_EXIT": Phase.FAILED,
    "CANCELLED": Phase.CANCELLED,
    "REVOKED": Phase.CANCELLED,
    "DEADLINE": Phase.TIMEOUT,
    "TIMEOUT": Phase.TIMEOUT,
    "NODE_FAIL": Phase.NODE_FAIL,
}


def slurm_phase(slurm_state: str) -> str | None:
    """The phase of a Slurm state; None for a state Gantry does not know (left alone)."""
    return SLURM_STATE_MAP.get(slurm_state.upper())


def is_final_phase(slurm_state: str) -> bool:
    return slurm_phase(slurm_state) in Phase.FINAL
