"""Which ranks stopped, and on which nodes, from what the cycle's listing of the run
directory showed (``runs.rundir.RunDirectory``):

- after a crash, srun's own error lines at the end of the job's output file
  (``srun: error: n2: task 1: Killed``): the first one names the task that ended badly
  first; srun then stops the others (``--kill-on-bad-exit``), and their lines come after;
- during a hang, the ranks' heartbeats (``trainer/heartbeat.py``): a rank whose heartbeat
  file went stale while the others' kept being rewritten stopped (its process is stopped
  or gone); all fresh means every rank is alive and waiting on something else, and nobody
  is named.

Both live in the job's own run directory, so they are what the job claims: a node is named
only when it is one of the job's own allocated nodes (checked here and again where every
suspect is recorded), and what a hostile job could do with
a false claim is send its own retry elsewhere and put a suspect record (with the evidence
shown) in front of operators, who decide.
"""

from __future__ import annotations

from collections.abc import Iterable

from jobs.models import Job
from runs.rundir import RunDirectory

# Node states (and state flags) in which Slurm itself says a node is at fault: the
# inventory's copy of Slurm's view, which no job's files can change.
FAULTY_NODE_STATES = frozenset(
    {"down", "drain", "drained", "draining", "fail", "failing", "not_responding"}
)


def node_is_faulty(*, state: str, flags: Iterable[object] | None) -> bool:
    """Whether Slurm's state (or one of its flags) of a node says the node is at fault."""
    named = {str(flag).lower() for flag in (flags or [])}
    return (state or "").lower() in FAULTY_NODE_STATES or bool(named & FAULTY_NODE_STATES)


# A heartbeat this much older than the freshest one of the same job is stale: the trainer
# rewrites it every 2 s (``trainer.heartbeat.INTERVAL_S``); file times have 1 s steps.
STALE_BEAT_S = 10


def _allocated(job: Job) -> set[str]:
    """The nodes Slurm allocated to the job (``recovery.services._name_suspects`` holds
    every suspect to the same set)."""
    return set(job.allocated_node_names)


def crash_suspects(job: Job, directory: RunDirectory | None) -> list[tuple[str, str]]:
    """The node of the first task srun reported ending badly, with the line."""
    if directory is None or not job.slurm_job_id:
        return []
    allocated = _allocated(job)
    for node, tasks, what in directory.srun_errors.get(job.slurm_job_id, []):
        if node in allocated:
            return [
                (
                    node,
                    f"job {job.slurm_job_id}: srun reported task {tasks} on {node} first: "
                    f"{what} (the job's output file)",
                )
            ]
    return []


def hang_suspects(job: Job, directory: RunDirectory | None) -> list[tuple[str, str]]:
    """Nodes of the ranks whose heartbeat went stale while the others' stayed fresh."""
    if directory is None or len(directory.beats) < 2:
        return []
    allocated = _allocated(job)
    freshest = max(beat.modified for beat in directory.beats.values())
    stale = [
        beat
        for beat in directory.beats.values()
        if freshest - beat.modified > STALE_BEAT_S and beat.node in allocated
    ]
    if len(stale) == len(directory.beats):
        return []
    by_node: dict[str, list[str]] = {}
    for beat in sorted(stale, key=lambda b: b.rank):
        by_node.setdefault(beat.node, []).append(
            f"rank {beat.rank} (at step {beat.step}, last heartbeat "
            f"{freshest - beat.modified} s before the freshest)"
        )
    return [
        (
            node,
            f"job {job.slurm_job_id}: {', '.join(ranks)} on {node} stopped while the other "
            "ranks kept beating",
        )
        for node, ranks in sorted(by_node.items())
    ]
