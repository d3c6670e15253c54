"""Slurm output (JSON and text) -> typed dataclasses.

JSON is the primary source (Slurm 21.08+: ``--json``; field names of the
openapi v0.0.38 data format of Slurm 22.05, with the cheap parts of later
shapes accepted too: states as lists, numbers as ``{"set", "number"}``).
Text forms are the fallback. Unknown fields are ignored, missing optional
fields become None; a document of the wrong shape raises ``SlurmParseError``
with a snippet of what we got.

Conventions: node states are normalised lower-case words (``idle``,
``mixed``, ``allocated``, ``drained``, ``draining``, ``down``, ...) with
Slurm's flags kept upper-case in ``state_flags``; job states stay Slurm's
upper-case base names (``COMPLETED``, ``FAILED``, ``CANCELLED``, ...); times are
aware UTC datetimes; memory is MB; time limits are minutes (None = unlimited).
"""

from __future__ import annotations

from slurm.parsers.common import (
    load_json,
    normalise_job_state,
    normalise_node_state,
    parse_kv_records,
)
from slurm.parsers.inventory import (
    SINFO_TEXT_FORMAT,
    TEXT_SEPARATOR,
    iter_gpu_gres,
    parse_partitions,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_sinfo_text,
    parse_topology,
)
from slurm.parsers.jobs import (
    SACCT_TEXT_FIELDS,
    SQUEUE_TEXT_FORMAT,
    parse_sacct_json,
    parse_sacct_text,
    parse_scontrol_jobs,
    parse_squeue_json,
    parse_squeue_text,
)
from slurm.parsers.misc import parse_config, parse_sbatch_parsable, parse_version
from slurm.parsers.models import (
    ACTIVE_JOB_STATES,
    FINAL_JOB_STATES,
    ClusterInfo,
    Inventory,
    Partition,
    SlurmJob,
    SlurmNode,
    Switch,
)
from slurm.parsers.queue import (
    SQUEUE_START_FORMAT,
    PendingStart,
    QueuePlace,
    parse_squeue_start,
    queue_places,
)
from slurm.units import Gres, parse_count

__all__ = [
    "ACTIVE_JOB_STATES",
    "FINAL_JOB_STATES",
    "SACCT_TEXT_FIELDS",
    "SINFO_TEXT_FORMAT",
    "SQUEUE_START_FORMAT",
    "SQUEUE_TEXT_FORMAT",
    "TEXT_SEPARATOR",
    "ClusterInfo",
    "Gres",
    "Inventory",
    "Partition",
    "PendingStart",
    "QueuePlace",
    "SlurmJob",
    "SlurmNode",
    "Switch",
    "iter_gpu_gres",
    "load_json",
    "normalise_job_state",
    "normalise_node_state",
    "parse_config",
    "parse_count",
    "parse_kv_records",
    "parse_partitions",
    "parse_sacct_json",
    "parse_sacct_text",
    "parse_sbatch_parsable",
    "parse_scontrol_jobs",
    "parse_scontrol_nodes",
    "parse_sinfo_json",
    "parse_sinfo_text",
    "parse_squeue_json",
    "parse_squeue_start",
    "parse_squeue_text",
    "parse_topology",
    "parse_version",
    "queue_places",
]
