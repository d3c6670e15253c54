"""One trainer per run directory: rank 0 holds an exclusive lock on ``.trainer.lock`` in the
directory it writes to, for the life of the process, with the Slurm job id that holds it.

A second Slurm job for the same run (a duplicate submission) finds the lock held and
refuses to start, so it can never interleave metrics or checkpoints with the first. The
lock is released by the kernel when the holding process ends, however it ends. On a shared
file system this needs working ``flock`` (NFSv4 emulates it with byte-range locks).
"""

from __future__ import annotations

import fcntl
import json
import os
import time

from . import dist

LOCK_NAME = ".trainer.lock"

# Held for the life of the process: closing it would release the lock.
_held: dict[str, int] = {}


def _try_lock(directory: str, env: dist.DistEnv) -> str | None:
    """Lock ``directory`` for this process; None on success, else who holds it."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            holder = {}
        os.close(fd)
        return (
            f"{directory} is in use by Slurm job {holder.get('slurm_job_id') or '?'} "
            f"(pid {holder.get('pid', '?')} on {holder.get('node', '?')}); "
            "refusing to start a second trainer in it"
        )
    record = {
        "slurm_job_id": env.job_id,
        "node": env.node,
        "pid": os.getpid(),
        "started": time.time(),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    _held[os.path.abspath(directory)] = fd
    return None


def release(directory: str) -> None:
    """Give the directory back (the trainer is done; ending the process does it too)."""
    fd = _held.pop(os.path.abspath(directory), None)
    if fd is not None:
        os.close(fd)


def lock_run_directory(directory: str, env: dist.DistEnv) -> str | None:
    """Collective: rank 0 takes the lock, every rank learns the outcome. None when this
    run holds the directory; otherwise why it may not start (the same on every rank)."""
    refusal = _try_lock(directory, env) if env.rank == 0 else None
    return dist.broadcast_object(refusal)
