"""The contract between the trainer and Gantry, as names: file formats, metric keys, event
names and drill reason codes. Django-free and torch-free: the trainer writes with these
names and Gantry (jobs, drills) reads with them. ``trainer/SCHEMA.md`` documents them; a
test checks the two agree.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

CHECKPOINT_FORMAT = "gantry-trainer-checkpoint/3"
# Formats a reader loads: 3 adds the strategy and the sharding table (FSDP); 2 is DDP.
CHECKPOINT_FORMATS_READ = ("gantry-trainer-checkpoint/2", CHECKPOINT_FORMAT)
RANK_INDEX_FORMAT = "gantry-trainer-rank-index/2"
DRILL_SCHEMA = "gantry-trainer-drill/2"
DRILL_REFERENCE_SCHEMA = "gantry-drill-reference/1"
FINGERPRINT_FORMAT = "gantry-state-fingerprint/1"
ACCEPTANCE_SCHEMA = "gantry-trainer-acceptance/1"
# ``python -m trainer probe``'s document (trainer/probe.py; read by health.document).
PROBE_SCHEMA = "gantry-node-probe/1"
COLLECTIVES_SCHEMA = "gantry-trainer-collectives/1"
# ``python -m trainer collectives``: the operations (torch.distributed's names) and dtypes.
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
COLLECTIVE_DTYPES = ("float32", "bfloat16")

# The exit status of a rank the test-only fault ``TRAINER_FAULT=exit_rank[=R]@STEP`` ends
# (srun then reports ``Exited with exit code 42`` for its task).
EXIT_RANK_FAULT = 42

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


class Verdict:
    """A drill's verdict. Only ``passed`` proves a checkpoint restorable; only ``failed``
    (the checkpoint is at fault) blocks resuming from it; ``inconclusive`` means the drill
    could not judge; ``error`` means the infrastructure failed."""

    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"

    ALL = (PASSED, FAILED, INCONCLUSIVE, ERROR)


class Reason:
    """Drill reason codes (``reason_code`` in drill.json and ``verify --json``), each in
    exactly one verdict class."""

    # failed: the checkpoint is at fault
    INTEGRITY_HASH_MISMATCH = "integrity_hash_mismatch"
    INTEGRITY_SIZE_MISMATCH = "integrity_size_mismatch"
    MISSING_FILE = "missing_file"
    MISSING_MANIFEST = "missing_manifest"
    MISSING_STATE = "missing_state"
    INCONSISTENT_STATE = "inconsistent_state"
    STATE_MISMATCH = "state_mismatch"
    LOSS_DIVERGED = "loss_diverged"
    LOAD_ERROR = "load_error"
    STEP_ERROR = "step_error"
    # The checkpoint directory holds another checkpoint than the one Gantry registered
    # (another step, another manifest), however complete and self-consistent it is.
    NOT_AS_REGISTERED = "not_as_registered"
    # inconclusive: the drill could not judge the checkpoint
    ALLOCATION_INCOMPATIBLE = "allocation_incompatible"
    REFERENCE_MISSING = "reference_missing"
    REFERENCE_INCOMPLETE = "reference_incomplete"
    STEPS_SHORT = "steps_short"
    TRAINER_UNAVAILABLE = "trainer_unavailable"
    DATASET_CHANGED = "dataset_changed"
    # error: the infrastructure failed
    INFRASTRUCTURE_ERROR = "infrastructure_error"

    FAILED = frozenset(
        {
            INTEGRITY_HASH_MISMATCH,
            INTEGRITY_SIZE_MISMATCH,
            MISSING_FILE,
            MISSING_MANIFEST,
            MISSING_STATE,
            INCONSISTENT_STATE,
            STATE_MISMATCH,
            LOSS_DIVERGED,
            LOAD_ERROR,
            STEP_ERROR,
            NOT_AS_REGISTERED,
        }
    )
    INCONCLUSIVE = frozenset(
        {
            ALLOCATION_INCOMPATIBLE,
            REFERENCE_MISSING,
            REFERENCE_INCOMPLETE,
            STEPS_SHORT,
            TRAINER_UNAVAILABLE,
            DATASET_CHANGED,
        }
    )
    ERROR = frozenset({INFRASTRUCTURE_ERROR})
    ALL = FAILED | INCONCLUSIVE | ERROR
    # The checkpoint's files or state are damaged (a subset of FAILED).
    INTEGRITY = frozenset(
        {
            INTEGRITY_HASH_MISMATCH,
            INTEGRITY_SIZE_MISMATCH,
            MISSING_FILE,
            MISSING_MANIFEST,
            MISSING_STATE,
        }
    )


def verdict_for(reason_code: str | None) -> str:
    """The verdict class of a reason code: None is a pass; an unknown code is an error
    (fail closed: it never proves anything and never blocks on a guess)."""
    if not reason_code:
        return Verdict.PASSED
    if reason_code in Reason.FAILED:
        return Verdict.FAILED
    if reason_code in Reason.INCONCLUSIVE:
        return Verdict.INCONCLUSIVE
    return Verdict.ERROR


def json_digest(value: Any) -> str:
    """sha256 of a JSON value's canonical form (sorted keys, no spaces, non-finite floats
    as their repr): Gantry and the trainer name the same reference by the same digest."""

    def convert(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {str(k): convert(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [convert(v) for v in obj]
        if isinstance(obj, float) and not math.isfinite(obj):
            return repr(obj)
        return obj

    canonical = json.dumps(convert(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# The manifest key left out of its digest: the state fingerprint, which Gantry keeps in its
# own table (``StateFingerprint``) and a drill compares with the loaded state itself.
MANIFEST_DIGEST_EXCLUDES = ("fingerprint",)


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The digest Gantry registers a checkpoint's manifest by, and the trainer checks the
    checkpoint directory's manifest against: ``json_digest`` of the parsed manifest less
    its ``fingerprint``. Every file's name, size and sha256, the step, the world size and
    the save id are in it, so any other checkpoint (another step, another save, files
    rewritten with their hashes) has another digest."""
    return json_digest({k: v for k, v in manifest.items() if k not in MANIFEST_DIGEST_EXCLUDES})
