"""The watcher's reading of jobs' run directories: what the cycle's one listing
(``runs.rundir``: metrics size, acceptance, checkpoint manifests; one command per account,
a run directory being readable by its own account only) shows is new is read over SFTP
(metric bytes by offset) and handed to ``jobs.ingest``.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q
from django.utils import timezone

from jobs.ingest import checkpoint_register, metrics_ingest
from jobs.models import Checkpoint, Job
from nodes.cluster_access import transport_as
from nodes.models import Cluster
from nodes.slurm import errors as slurm_errors
from runs.rundir import RunDirectories, RunDirectory
from runs.runtime import run_dir

logger = logging.getLogger(__name__)


@dataclass
class RunFilesResult:
    sftp_reads: int = 0
    bytes_read: int = 0
    metric_points: int = 0
    checkpoints: int = 0
    errors: list[str] = field(default_factory=list)
    # Jobs whose run directory the listing reached this time (read or not).
    seen: set[Any] = field(default_factory=set)


# The most of a user-written file the worker reads as evidence (see ``read_bounded``).
ACCEPTANCE_MAX_BYTES = 1 << 20
MANIFEST_MAX_BYTES = 16 << 20


def _json_evidence(
    job: Job, transport: Any, path: str, max_bytes: int, result: RunFilesResult
) -> Any:
    """A JSON file of the job's run directory, read bounded; None when it is missing, not
    JSON, or refused (not a regular file, too large: an error of this job, listed)."""
    try:
        data = transport.read_bounded(path, max_bytes)
    except slurm_errors.RemoteFileNotFound:
        return None
    except slurm_errors.RemoteFileRefused as refused:
        result.errors.append(f"job {job.id}: {refused}")
        return None
    result.sftp_reads += 1
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _read_run_files(
    job: Job, files: RunDirectory, transport: Any, result: RunFilesResult, known_steps: set[str]
) -> None:
    directory = run_dir(job.cluster.workdir, str(job.id), job.run_as)
    if files.metrics_size is not None and files.metrics_size > job.metrics_offset:
        wanted = files.metrics_size - job.metrics_offset
        offset = job.metrics_offset
        while wanted > 0:
            chunk = transport.read_from(f"{directory}/metrics.jsonl", offset, min(wanted, 8 << 20))
            result.sftp_reads += 1
            result.bytes_read += len(chunk)
            if not chunk:
                break
            stored, new_offset = metrics_ingest(job=job, data=chunk, start_offset=offset)
            result.metric_points += stored
            if new_offset == offset:
                break
            wanted -= new_offset - offset
            offset = new_offset
    if files.acceptance and job.acceptance is None:
        acceptance = _json_evidence(
            job, transport, f"{directory}/acceptance.json", ACCEPTANCE_MAX_BYTES, result
        )
        if acceptance is not None:
            Job.objects.filter(id=job.id, acceptance__isnull=True).update(acceptance=acceptance)
    present = {path.rsplit("/", 2)[-2] for path in files.manifests}
    for step_name in sorted(known_steps - present):
        # The trainer's retention (checkpoint_keep) deleted it: keep the row, say so.
        step_number = int(step_name.split("-")[1])
        Checkpoint.objects.filter(job=job, step=step_number, deleted_at__isnull=True).update(
            deleted_at=timezone.now()
        )
    for manifest_path in files.manifests:
        step_dir = manifest_path.rsplit("/", 2)[-2]
        if step_dir in known_steps:
            continue
        manifest = _json_evidence(job, transport, manifest_path, MANIFEST_MAX_BYTES, result)
        if not isinstance(manifest, dict):
            continue
        if checkpoint_register(job=job, manifest_path=manifest_path, manifest=manifest):
            result.checkpoints += 1


def jobs_to_read(cluster: Cluster) -> list[Job]:
    """Jobs whose run directory may still hold something new: running, or ended and not
    yet read for the last time."""
    return list(
        Job.objects.filter(cluster=cluster, files_final=False)
        .filter(
            Q(state__in=[Job.State.RUNNING, Job.State.COMPLETING]) | Q(state__in=Job.FINAL_STATES)
        )
        .exclude(slurm_job_id="")
        .select_related("cluster")
    )


def run_directories_of(cluster: Cluster, jobs: list[Job]) -> list[tuple[str, Any]]:
    """(run directory, its account's transport) of each job, for the cycle's listing."""
    return [
        (
            run_dir(cluster.workdir, str(job.id), job.run_as),
            functools.partial(transport_as, cluster, job.run_as),
        )
        for job in jobs
    ]


def run_files_read(
    *, cluster: Cluster, jobs: list[Job], listing: RunDirectories | None = None
) -> RunFilesResult:
    """Read what is new in the run directories of ``jobs``, as each job's account: what
    the cycle's ``listing`` shows (listed now, one command per account, where it was not
    yet), then SFTP reads of new metric bytes, the acceptance manifest and new checkpoint
    manifests. A job that has ended is marked ``files_final`` after this read: nothing
    more will appear. An account Gantry cannot log in as, or whose listing failed, is an
    error of its jobs only (they are read next cycle); the other accounts' jobs are read."""
    result = RunFilesResult()
    listing = listing if listing is not None else RunDirectories()
    listed = listing.look(run_directories_of(cluster, jobs), result.errors)
    by_account: dict[str, list[Job]] = {}
    for job in jobs:
        by_account.setdefault(job.run_as, []).append(job)
    for account, group in by_account.items():
        try:
            transport = transport_as(cluster, account)
            _read_group(cluster, group, transport, result, listed)
        except slurm_errors.SlurmError as error:
            if not account:
                raise
            logger.warning("run directories of %s on %s: %s", account, cluster.name, error)
            result.errors.append(f"run directories of {account}: {error}")
    return result


def _read_group(
    cluster: Cluster,
    jobs: list[Job],
    transport: Any,
    result: RunFilesResult,
    listed: dict[str, RunDirectory],
) -> None:
    directories = {job.id: run_dir(cluster.workdir, str(job.id), job.run_as) for job in jobs}
    # A directory the listing could not reach is unknown, not empty: read next cycle.
    jobs = [job for job in jobs if directories[job.id] in listed]
    result.seen.update(job.id for job in jobs)
    known: dict[Any, set[str]] = {job.id: set() for job in jobs}
    for job_id, step in Checkpoint.objects.filter(job__in=jobs).values_list("job_id", "step"):
        known[job_id].add(f"step-{step:06d}")
    fresh = Job.objects.select_related("cluster").in_bulk([job.id for job in jobs])
    for job in jobs:
        job = fresh.get(job.id, job)
        try:
            _read_run_files(job, listed[directories[job.id]], transport, result, known[job.id])
        except slurm_errors.SlurmError:
            raise
        except Exception as error:
            # One job's unreadable files never stop the others; it is tried again next cycle.
            logger.exception("job %s: reading its run directory failed", job.id)
            result.errors.append(f"job {job.id}: {type(error).__name__}: {error}")
            continue
        if job.is_final:
            Job.objects.filter(id=job.id).update(files_final=True)
