"""Helpers of the recovery tests on the dev cluster: the trainer processes of a run (found in
/proc, as an operator would with ps), the node each runs on (its slurmd's SLURMD_NODENAME),
and a lineage cancelled at the end so nothing is left running on the shared cluster."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rest_framework.test import APIClient

import lanes
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
            "partition": lanes.assigned_partition(),
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


TRIALS_FILE = Path(__file__).resolve().parent.parent / "test-artifacts" / "recovery-trials.jsonl"


def trial_record(kind: str, incident: Any, **extra: Any) -> dict[str, Any]:
    """One recovery trial's figures, appended to test-artifacts/recovery-trials.jsonl (read
    by bench/recovery_bench.py): time to detect against the budget, and where the time
    from detection to the resumed run's first step went: Gantry's own part (detected →
    cancel sent, the later of cancelled / proving drill finished → resume recorded, and
    each submission: record → sbatch answered) against the rest (Slurm ending the job, the
    proving drill running, the queue, start-up)."""
    from drills.models import RestoreDrill
    from jobs.models import MetricPoint

    incident.refresh_from_db()
    record: dict[str, Any] = {
        "kind": kind,
        "signal": incident.signal,
        "outcome": incident.outcome,
        "detect_s": incident.time_to_detect_s,
        "budget_s": (incident.evidence or {}).get("budget_s"),
        "lost_steps": incident.lost_steps,
        "suspects": list(incident.suspect_nodes or []),
        "resumed_from": incident.resumed_from.step if incident.resumed_from else None,
        **extra,
    }
    resumed = incident.resumed_job
    first = (
        MetricPoint.objects.filter(job=resumed)
        .order_by("step")
        .values_list("wall_time", flat=True)
        .first()
        if resumed is not None
        else None
    )
    if resumed is not None and first is not None and incident.resumed_at:
        detected = incident.detected_at
        gantry = 0.0
        if incident.cancel_requested_at:
            gantry += (incident.cancel_requested_at - detected).total_seconds()
        ready = incident.cancelled_at or detected
        drill = (
            RestoreDrill.objects.filter(checkpoint=incident.resumed_from, trigger="recovery")
            .order_by("-finished_at")
            .first()
        )
        if drill is not None and drill.finished_at and drill.finished_at > ready:
            ready = drill.finished_at
        gantry += max(0.0, (incident.resumed_at - ready).total_seconds())
        # Submitting is Gantry's too: the Celery task, the SSH command and sbatch, from the
        # resumed job's record to Slurm's answer (and the same for the proving drill).
        submits = [(resumed.created_at, resumed.submitted_at)]
        if drill is not None:
            submits.append((drill.created_at, drill.submitted_at))
        submit = sum(
            max(0.0, (answered - made).total_seconds()) for made, answered in submits if answered
        )
        gantry += submit
        total = (first - detected).total_seconds()
        record.update(
            gantry_s=round(gantry, 3),
            gantry_submit_s=round(submit, 3),
            detect_to_first_step_s=round(total, 3),
            gantry_share=round(gantry / total, 4) if total > 0 else None,
        )
    append_trial(record)
    return record


def append_trial(record: dict[str, Any]) -> None:
    TRIALS_FILE.parent.mkdir(parents=True, exist_ok=True)
    with TRIALS_FILE.open("a") as handle:
        handle.write(json.dumps(record, default=str) + "\n")


CGROUP_CPU = Path("/sys/fs/cgroup/cpu")


@contextlib.contextmanager
def cpu_quota(percent: int, name: str) -> Iterator[Callable[[int], None]]:
    """A cgroup (v1 cpu controller) with a CPU quota of ``percent`` of one CPU; yields a
    function that moves a process into it. On the way out every process goes back to the
    root group and the cgroup is removed. A slow node here: nothing the code under test
    reads, only less CPU for that node's processes."""
    group = CGROUP_CPU / f"gantry-{name}-{os.getpid()}"
    group.mkdir()

    def add(pid: int) -> None:
        with contextlib.suppress(OSError):
            (group / "cgroup.procs").write_text(str(pid))

    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(percent * 1000))
        yield add
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CGROUP_CPU / "cgroup.procs").write_text(pid)
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)


def collective_ranks_on(node: str) -> list[int]:
    """Pids of ``python -m trainer collectives`` ranks that Slurm started on ``node``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"collectives" in args and f"SLURMD_NODENAME={node}".encode() in environ:
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def slowed_collectives(node: str, percent: int) -> Iterator[None]:
    """Every collective rank that starts on ``node`` goes into a cgroup with a CPU quota."""
    with cpu_quota(percent, "accept") as slow_down:
        stop = threading.Event()

        def keep_moving() -> None:
            while not stop.is_set():
                for pid in collective_ranks_on(node):
                    slow_down(pid)
                time.sleep(0.05)

        mover = threading.Thread(target=keep_moving, daemon=True)
        mover.start()
        try:
            yield
        finally:
            stop.set()
            mover.join(timeout=5)


def crash_incident(job: Any, **values: Any) -> Any:
    """An open crash incident of ``job`` (its own lineage root), detected now."""
    from django.utils import timezone

    from recovery.models import Incident

    now = timezone.now()
    fields: dict[str, Any] = {
        "job": job,
        "lineage_root": job,
        "cluster": job.cluster,
        "signal": Incident.Signal.CRASH,
        "stopped_at": now,
        "detected_at": now,
        "detail": "Slurm ended it FAILED",
        **values,
    }
    return Incident.objects.create(**fields)
