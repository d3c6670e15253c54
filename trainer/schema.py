"""The contract between the trainer and Gantry, as names: file formats, metric keys, event
names and drill reason codes. Django-free and torch-free: the trainer writes with these
names and Gantry (jobs, drills) reads with them. ``trainer/SCHEMA.md`` documents them; a
test checks the two agree.
"""

from __future__ import annotations

CHECKPOINT_FORMAT = "gantry-trainer-checkpoint/2"
RANK_INDEX_FORMAT = "gantry-trainer-rank-index/2"
DRILL_SCHEMA = "gantry-trainer-drill/1"
ACCEPTANCE_SCHEMA = "gantry-trainer-acceptance/1"

# Keys of a step line in metrics.jsonl (a line without "event").
METRIC_KEYS = (
    "step",
    "time",
    "elapsed",
    "loss",
    "lr",
    "samples_per_s",
    "tokens_per_s",
    "step_time",
    "data_time",
    "checkpoint_blocking_time",
    "world_size",
    "global_batch",
)


class Event:
    """Values of ``event`` in metrics.jsonl event lines."""

    START = "start"
    RESUMED = "resumed"
    TARGET_REACHED = "target_reached"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_FAILED = "checkpoint_failed"
    DONE = "done"

    ALL = frozenset({START, RESUMED, TARGET_REACHED, CHECKPOINT, CHECKPOINT_FAILED, DONE})


class Reason:
    """Drill reason codes (``reason_code`` in drill.json and ``verify --json``)."""

    INTEGRITY_HASH_MISMATCH = "integrity_hash_mismatch"
    INTEGRITY_SIZE_MISMATCH = "integrity_size_mismatch"
    MISSING_FILE = "missing_file"
    MISSING_MANIFEST = "missing_manifest"
    MISSING_STATE = "missing_state"
    ALLOCATION_INCOMPATIBLE = "allocation_incompatible"
    LOSS_DIVERGED = "loss_diverged"
    REFERENCE_MISSING = "reference_missing"
    LOAD_ERROR = "load_error"
    INFRASTRUCTURE_ERROR = "infrastructure_error"

    ALL = frozenset(
        {
            INTEGRITY_HASH_MISMATCH,
            INTEGRITY_SIZE_MISMATCH,
            MISSING_FILE,
            MISSING_MANIFEST,
            MISSING_STATE,
            ALLOCATION_INCOMPATIBLE,
            LOSS_DIVERGED,
            REFERENCE_MISSING,
            LOAD_ERROR,
            INFRASTRUCTURE_ERROR,
        }
    )
    # The checkpoint's files or state are damaged: resuming from it is blocked.
    INTEGRITY = frozenset(
        {
            INTEGRITY_HASH_MISMATCH,
            INTEGRITY_SIZE_MISMATCH,
            MISSING_FILE,
            MISSING_MANIFEST,
            MISSING_STATE,
        }
    )
