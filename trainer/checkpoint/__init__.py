"""Checkpoints: per-rank files + a manifest written last; verification; retention.

Layout ``<root>/step-NNNNNN/`` (format ``gantry-trainer-checkpoint/3``; 2 is still read):

* ``rank-KKKKK.pt``        per-rank *index*: ``torch.save`` of the state with every tensor
  replaced by a reference, plus the tensor table (dtype, shape, offset, nbytes) and the list
  of data files. Small; loadable with ``torch.load(weights_only=True)``.
* ``rank-KKKKK-NNNN.bin``  the rank's tensor bytes, concatenated in table order and cut into
  files of at most ``DATA_CHUNK`` bytes. Written straight from tensor memory (no serialised
  copy); each file is hashed, written and fsynced by a worker of a small thread pool, so
  sha256 (which releases the GIL) runs on every core while other files are written/flushed.
* ``rank-KKKKK.json``      sidecar written atomically by rank K after all its files are
  fsynced: every file's name, role, size and sha256, the state keys, and the ``save_id``.
* ``manifest.json``        written LAST by rank 0 once every rank's sidecar for this save_id
  is present: temp file + fsync + rename + fsync of the directory. Lists every file of every
  rank with its size and sha256.

A directory without ``manifest.json`` is not a checkpoint. Sidecars are how rank 0 learns the
other ranks' file hashes without a collective in a background thread (collectives would race
with DDP's); they need the shared filesystem the checkpoint directory lives on anyway.
Loading reads each data file with large reads straight into the new tensors' memory and
hashes the same bytes (files in parallel); a mismatch names the file. Sharded state (FSDP)
is saved as each rank's own dim-0 slices, listed in the manifest's ``sharding`` table
(``sharding``); a loading rank reads only the byte ranges of the rows it will hold from
every rank's files (``reshard``).
"""

from __future__ import annotations

from ..sharding import rank_summary, sharding_problems, sharding_table
from .durable import (
    atomic_write_json,
    fsync_dir,
    io_workers,
    sha256_file,
    sha256_files,
    write_durable,
)
from .layout import (
    DATA_CHUNK,
    FORMAT,
    INDEX_FORMAT,
    MANIFEST,
    RANK0_KEYS,
    RANK_KEYS,
    READ_FORMATS,
    CheckpointError,
    data_file_name,
    rank_file_name,
    required_keys,
    sidecar_name,
    step_dir_name,
    strategy_of,
)
from .listing import Entry, apply_retention, complete_checkpoints, list_checkpoints
from .rankfile import deserialize, load_rank, rank_files, read_index, save_rank, serialize
from .snapshot import clone_into, clone_to_cpu, copy_tensors
from .verify import load_manifest, rank_consistency, read_rank, resolve, verify
from .writer import CheckpointWriter

__all__ = [
    "DATA_CHUNK",
    "FORMAT",
    "INDEX_FORMAT",
    "MANIFEST",
    "RANK0_KEYS",
    "RANK_KEYS",
    "READ_FORMATS",
    "CheckpointError",
    "CheckpointWriter",
    "Entry",
    "apply_retention",
    "atomic_write_json",
    "clone_into",
    "clone_to_cpu",
    "complete_checkpoints",
    "copy_tensors",
    "data_file_name",
    "deserialize",
    "fsync_dir",
    "io_workers",
    "list_checkpoints",
    "load_manifest",
    "load_rank",
    "rank_consistency",
    "rank_file_name",
    "rank_files",
    "rank_summary",
    "read_index",
    "read_rank",
    "required_keys",
    "resolve",
    "save_rank",
    "serialize",
    "sha256_file",
    "sha256_files",
    "sharding_problems",
    "sharding_table",
    "sidecar_name",
    "step_dir_name",
    "strategy_of",
    "verify",
    "write_durable",
]
