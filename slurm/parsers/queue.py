"""The pending queue: ``squeue --start`` (expected start times) and each pending job's
place in its partition's queue, in Slurm's own (priority) order."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from slurm.parsers.common import as_int, as_text, guarded, normalise_job_state
from slurm.parsers.inventory import kv_time, split_fields

# ``squeue --start -h -o`` fields of commands.squeue_start(): job id, partition, state,
# priority (integer), expected start, submit time, scheduled nodes, reason (free text, last).
SQUEUE_START_FORMAT = "%i|%P|%T|%Q|%S|%V|%Y|%r"
_SQUEUE_START_FIELDS = 8
_REASON_INDEX = 7


@dataclass(frozen=True)
class PendingStart:
    """One pending job as ``squeue --start`` shows it.

    ``expected_start`` is the scheduler's estimate (the backfill scheduler's plan), None
    while Slurm has none; ``scheduled_nodes`` the nodes it plans to use, "" when none.
    """

    job_id: str
    partition: str | None
    state: str
    priority: int | None
    expected_start: datetime | None
    submit_time: datetime | None
    scheduled_nodes: str
    reason: str | None


@dataclass(frozen=True)
class QueuePlace:
    """Where a pending job stands in its partition's queue: 1 = next to be considered."""

    position: int
    of: int
    partition: str


def _from_fields(fields: list[str]) -> PendingStart:
    job_id, partition, state_text, priority, start, submit, nodes, reason = (
        item.strip() for item in fields
    )
    if not job_id or not job_id.replace("_", "").isdigit():
        raise ValueError(f"not a job id: {job_id!r}")
    state, _flags = normalise_job_state(state_text)
    scheduled = as_text(nodes) or ""
    return PendingStart(
        job_id=job_id,
        partition=as_text(partition),
        state=state,
        priority=as_int(priority),
        expected_start=kv_time(start),
        submit_time=kv_time(submit),
        scheduled_nodes="" if scheduled.lower() in {"(null)", "n/a"} else scheduled,
        reason=as_text(reason),
    )


def parse_squeue_start(text: str) -> list[PendingStart]:
    """Output of ``commands.squeue_start()`` -> pending jobs with their expected start."""
    jobs: list[PendingStart] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = split_fields(line, _SQUEUE_START_FIELDS, _REASON_INDEX, "squeue --start line")
        jobs.append(guarded("squeue --start line", line, _from_fields, fields))
    return jobs


def _order_key(job: PendingStart) -> tuple[int, float, int, int]:
    main, _, task = job.job_id.partition("_")
    submitted = job.submit_time.timestamp() if job.submit_time else float("inf")
    # Higher priority first; then, as Slurm breaks ties, the earlier submission, lower id.
    return (-(job.priority or 0), submitted, int(main), int(task) if task.isdigit() else -1)


def queue_places(jobs: Iterable[PendingStart]) -> dict[str, QueuePlace]:
    """Each pending job's place among the pending jobs of its partition, by priority.

    That is the order in which Slurm's main scheduler considers them; backfill may still
    start a later, smaller job first when it does not delay the earlier ones.
    """
    by_partition: dict[str, list[PendingStart]] = defaultdict(list)
    for job in jobs:
        if job.state == "PENDING":
            by_partition[job.partition or ""].append(job)
    places: dict[str, QueuePlace] = {}
    for partition, members in by_partition.items():
        members.sort(key=_order_key)
        for index, job in enumerate(members):
            places[job.job_id] = QueuePlace(
                position=index + 1, of=len(members), partition=partition
            )
    return places
