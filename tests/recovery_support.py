"""Helpers of the recovery tests on the dev cluster: the trainer processes of a run (found in
/proc, as an operator would with ps), the node each runs on (its slurmd's SLURMD_NODENAME),
and a lineage cancelled at the end so nothing is left running on the shared cluster."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from rest_framework.test import APIClient

from jobs.models import Checkpoint, Job


def rank_pids(run_dir: str) -> list[int]:
    """The trainer processes of this run (their command line names its run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [part.decode(errors="replace") for part in cmdline if part]
        # The rank's Python itself (not srun, its bash wrapper or tee), started for this run.
        if (
            args
            and Path(args[0]).name.startswith("python")
            and "train" in args
            and any(run_dir in arg for arg in args)
        ):
            found.append(int(entry.name))
    return sorted(found)


def node_of(pid: int) -> str:
    """The dev-cluster node a process runs on (every node is a slurmd on this host)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    for item in environ:
        if item.startswith(b"SLURMD_NODENAME="):
            return item.split(b"=", 1)[1].decode()
    raise AssertionError(f"process {pid} has no SLURMD_NODENAME")


def rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    for item in environ:
        if item.startswith(b"SLURM_PROCID="):
            return int(item.split(b"=", 1)[1])
    raise AssertionError(f"process {pid} has no SLURM_PROCID")


def run_dir_of(job: Job) -> str:
    checkpoint = Checkpoint.objects.filter(job=job).order_by("-step").first()
    assert checkpoint is not None
    return checkpoint.path.rsplit("/checkpoints/", 1)[0]


def losses(job: Job, low: int, high: int) -> dict[int, float]:
    return dict(job.metric_points.filter(step__gt=low, step__lte=high).values_list("step", "loss"))


def cancel_lineage(api: APIClient, job: Job) -> None:
    """Leave nothing running on the shared dev cluster: the job and all that resumed it."""
    todo = [job]
    while todo:
        each = todo.pop()
        api.post(f"/api/v1/jobs/{each.id}/cancel/")
        todo.extend(Job.objects.filter(parent=each))


def resume(pids: list[int]) -> None:
    """SIGCONT whatever is still there (a stopped process must not outlive the test)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def submit(api: APIClient, *, name: str, nodes: int, steps: int, every: int, **extra: Any) -> Job:
    response = api.post(
        "/api/v1/jobs/submit/",
        {
            "name": name,
            "partition": "batch",
            "nodes": nodes,
            "gpus_per_node": 1,
            "tasks_per_node": 1,
            "time_limit_minutes": 10,
            "config": {
                "preset": "tiny",
                "steps": steps,
                "checkpoint_every": every,
                "checkpoint_keep": 50,
            },
            **extra,
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    return Job.objects.get(id=response.json()["id"])
