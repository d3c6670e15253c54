"""What the generic Slurm lifecycle writes on an object's timeline: a fixed set of kinds.

Each kind of tracked object keeps its own timeline table (``jobs.models.JobEvent`` for
jobs); its kind choices include every value here, and a test checks that they do.
"""

from __future__ import annotations

from enum import StrEnum


class RunEventKind(StrEnum):
    # A state change (from_state → to_state).
    STATE = "state"
    # A further sbatch attempt after the first.
    SUBMIT_ATTEMPT = "submit_attempt"
    # A cancel asked, scancel sent (by a person, or for a Slurm job submitted while a cancel
    # was asked), or a cancel that failed (the message says which).
    CANCEL = "cancel"
    # A second Slurm job carrying the object's tag was cancelled.
    DUPLICATE = "duplicate"
    # Slurm's reason for the current state changed.
    REASON = "reason"
    # A hold / release asked, sent (``scontrol``), or failed (the message says which).
    HOLD = "hold"
    RELEASE = "release"
