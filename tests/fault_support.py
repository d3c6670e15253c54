"""Helpers for the fault-injection suite."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from rest_framework.test import APIClient

import lanes
from devcluster_support import DevCluster
from jobs.models import Job, JobEvent
from slurm import commands as slurm_commands

TRIALS = int(os.environ.get("GANTRY_FAULT_TRIALS", "10"))


@dataclass
class FaultRow:
    fault: str
    trials: int = 0
    faults_injected: int = 0
    duplicates: int = 0
    lost: int = 0
    wrong: int = 0
    notes: str = ""


@dataclass
class FaultReport:
    rows: list[FaultRow] = field(default_factory=list)

    def row(self, fault: str) -> FaultRow:
        row = FaultRow(fault=fault)
        self.rows.append(row)
        return row


REPORT = FaultReport()


def submit_tiny(
    api: APIClient, count: int, *, name: str, steps: int = 3, **extra: Any
) -> list[str]:
    ids = []
    for number in range(count):
        body: dict[str, Any] = {
            "name": f"{name}-{number}",
            "partition": lanes.assigned_partition(),
            "nodes": 1,
            "gpus_per_node": 0,
            "tasks_per_node": 1,
            "time_limit_minutes": 5,
            "config": {"preset": "tiny", "steps": steps, "checkpoint_every": 0},
        }
        body.update(extra)
        response = api.post("/api/v1/jobs/submit/", body, format="json")
        assert response.status_code == 202, response.json()
        ids.append(str(response.json()["id"]))
    return ids


# slurmdbd gets a job's row seconds after slurmctld has the job (on the dev cluster the
# first sacct row came 2.3-5.0 s after sbatch; for a 3 s job, after it had already ended in
# 5 runs of 8), and a job Gantry finishes from its exit record (a cycle whose sacct failed,
# a cluster without accounting) is final about a second after it ends. Slurm's view is read
# again for this long before a job is called lost.
EVIDENCE_WAIT_SECONDS = 30


def slurm_jobs_by_tag(devcluster: DevCluster) -> dict[str, set[str]]:
    """Every Slurm job of the last hour, grouped by job name: accounting (sacct) and the
    controller (squeue --states=all, which keeps an ended job for MinJobAge, 300 s, so a
    job slurmdbd has not recorded yet still shows)."""
    found: dict[str, set[str]] = defaultdict(set)
    accounting = devcluster.slurm(
        ["sacct", "-n", "-X", "-P", "-a", "-o", "JobID,JobName%80", "-S", "now-1hours"]
    ).stdout
    queue = devcluster.slurm(["squeue", "-h", "-a", "--states=all", "-o", "%i|%j"]).stdout
    for line in (accounting + "\n" + queue).splitlines():
        if "|" in line:
            job_id, name = line.split("|", 1)
            found[name.strip()].add(job_id.strip())
    return found


def duplicates_and_lost(devcluster: DevCluster, job_ids: list[str]) -> tuple[int, int, list[str]]:
    """(jobs with more than one Slurm job, jobs with none and no clear failure, details).

    A job is lost only if Slurm still shows no such job after ``EVIDENCE_WAIT_SECONDS``
    (the answer is final as soon as nothing is missing)."""
    deadline = time.monotonic() + EVIDENCE_WAIT_SECONDS
    while True:
        duplicates, lost, details = _duplicates_and_lost(slurm_jobs_by_tag(devcluster), job_ids)
        if not lost or time.monotonic() >= deadline:
            return duplicates, lost, details
        time.sleep(1)


def _duplicates_and_lost(
    by_tag: dict[str, set[str]], job_ids: list[str]
) -> tuple[int, int, list[str]]:
    duplicates = lost = 0
    details = []
    for job_id in job_ids:
        job = Job.objects.get(id=job_id)
        slurm_ids = by_tag.get(slurm_commands.job_tag(job_id), set())
        if len(slurm_ids) > 1:
            duplicates += 1
            details.append(f"{job.name}: {len(slurm_ids)} Slurm jobs {sorted(slurm_ids)}")
        elif not slurm_ids and not (job.state == Job.State.FAILED and job.state_reason):
            lost += 1
            details.append(f"{job.name}: no Slurm job, state {job.state}")
        elif slurm_ids and job.slurm_job_id not in slurm_ids:
            lost += 1
            details.append(
                f"{job.name}: tracks {job.slurm_job_id!r}, Slurm has {sorted(slurm_ids)}"
            )
    return duplicates, lost, details


def wrong_transitions(job_ids: list[str]) -> list[str]:
    """State changes no fault should cause: to failed/lost/node_fail, or running → pending."""
    wrong = []
    for event in JobEvent.objects.filter(job_id__in=job_ids, kind="state"):
        if event.to_state in {"failed", "lost", "node_fail", "timeout"}:
            wrong.append(f"{event.job_id}: {event.from_state} → {event.to_state} {event.message}")
        if event.from_state == "running" and event.to_state == "pending":
            wrong.append(f"{event.job_id}: running → pending")
    return wrong


def wait_all(predicate: Any, *, timeout: float, every: float = 0.5, on_tick: Any = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on_tick is not None:
            on_tick()
        if predicate():
            return True
        time.sleep(every)
    return bool(predicate())


# Submission faults run this many trials each (make faults: 30, make test: fewer).
SUBMIT_TRIALS = int(os.environ.get("GANTRY_SUBMIT_FAULT_TRIALS", "4"))

# The watcher and workers of the submission fault tests: a short SSH command timeout (so
# a slow sbatch outlasts it) and a grace for unknown outcomes longer than the slowest
# sbatch the tests make.
SLOW_SBATCH_SECONDS = 10
SUBMIT_FAULT_ENV = {
    "GANTRY_RECONCILE_INTERVAL": "1",
    "GANTRY_SYNC_INTERVAL": "30",
    "GANTRY_SSH_COMMAND_TIMEOUT": "6",
    "GANTRY_SUBMIT_UNKNOWN_GRACE": str(SLOW_SBATCH_SECONDS + 15),
    "GANTRY_DUPLICATE_WATCH": "300",
    "GANTRY_SUBMIT_LEASE": "30",
    "GANTRY_SUBMIT_REQUEUE_AFTER": "5",
    "GANTRY_DRILL_POLICY_INTERVAL": "3600",
    "GANTRY_DRILL_SUBMIT_RETRIES": "4",
}

SLOW_SBATCH = f"""#!/bin/sh
# Gantry fault test: a busy controller. sbatch answers after {SLOW_SBATCH_SECONDS} s, longer
# than Gantry's SSH command timeout, and then really submits.
sleep {SLOW_SBATCH_SECONDS}
exec /usr/bin/sbatch "$@"
"""

LOST_ANSWER_SBATCH = """#!/bin/sh
# Gantry fault test: the answer is lost. sbatch really submits, then the SSH connection
# this command runs in is dropped before the answer goes back.
/usr/bin/sbatch "$@" >/dev/null 2>&1
pid=$$
while [ "$pid" -gt 1 ]; do
  pid=$(awk '{print $4}' "/proc/$pid/stat")
  case "$(cat "/proc/$pid/comm")" in sshd*) kill -9 "$pid"; sleep 5; exit 0 ;; esac
done
exit 1
"""

SACCT_DOWN = """#!/bin/sh
# Gantry fault test: the accounting database does not answer.
echo "sacct: error: Problem talking to the database: Connection refused" >&2
exit 1
"""

ACCOUNTING_DISABLED = """#!/bin/sh
# Gantry fault test: a cluster without accounting, as sacct says it.
echo "sacct: error: Slurm accounting storage is disabled" >&2
exit 1
"""


def unknown_outcomes(model: Any, object_ids: list[str]) -> int:
    """How many times an sbatch's outcome was unknown (objects that went submit_unknown)."""
    if model is Job:
        return JobEvent.objects.filter(
            job_id__in=object_ids, kind="state", to_state="submit_unknown"
        ).count()
    return 0
