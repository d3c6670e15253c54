"""The watcher's reading of jobs' run directories: what the cycle's one listing
(``runs.rundir``: metrics size, acceptance, checkpoint manifests) shows is new is read and
handed to ``jobs.ingest``. Directories the batched reader listed (``runs.rundir_batch``: one
command as the service account, which the owners let read their run directories) have
their new bytes read by it too, in one more command for all of them (each file bounded:
``METRICS_BATCH_MAX_BYTES`` of metrics per job and cycle, the evidence limits below for
the rest); the others, and a file the service account may not read, over SFTP as the
job's own account, as before (metric bytes by offset, the rest ``read_bounded``).

The cycle's metric bytes are shared fairly between accounts, then between one account's
jobs (``jobs.read_shares``: the bound is stated there), over both ways of reading. A job
counts as read (``RunFilesResult.seen``: the only jobs whose quiet recovery may judge, and
the only ended ones marked ``files_final``) only when everything the listing showed new was
read this cycle; a read that was deferred or cut short is no evidence of anything, and the
next cycle continues from where it stopped.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs import checkpoint_state
from jobs.ingest import checkpoint_register, metrics_ingest
from jobs.lifecycle import job_event
from jobs.models import Checkpoint, Job, JobEvent
from jobs.read_shares import fair_shares, interleaved
from jobs.stack_change import stack_changes
from nodes.access.cluster import transport_as
from nodes.models import Cluster
from runs.rundir import RunDirectories, RunDirectory
from runs.rundir_batch import BATCH_BUDGET_BYTES, MAX_BATCH_COMMANDS, FileRead, FileRequest
from runs.runtime import run_dir
from slurm import errors as slurm_errors

logger = logging.getLogger(__name__)


@dataclass
class RunFilesResult:
    sftp_reads: int = 0
    bytes_read: int = 0
    metric_points: int = 0
    checkpoints: int = 0
    errors: list[str] = field(default_factory=list)
    # Jobs whose run directory the listing reached and whose new files were read whole.
    seen: set[Any] = field(default_factory=set)
    # Jobs listed whose reads were deferred or cut short (their share, the reader's
    # budget): read on from where they stopped next cycle, no evidence this one.
    incomplete: set[Any] = field(default_factory=set)
    # Files of directories the batched reader listed that it could not read (no grant on
    # them), read as the job's account instead.
    owner_reads: int = 0
    # What each of those directories showed, by job (heartbeats, srun's error lines).
    listed: dict[Any, RunDirectory] = field(default_factory=dict)


# The most of a user-written file the worker reads as evidence (see ``read_bounded``).
ACCEPTANCE_MAX_BYTES = 1 << 20
MANIFEST_MAX_BYTES = 16 << 20
# The most of one job's metrics the batched reader reads in a cycle (the rest next cycle).
METRICS_BATCH_MAX_BYTES = 8 << 20
# One SFTP read of metrics.
METRICS_READ_CHUNK = 8 << 20


def cycle_metrics_bytes(listing: RunDirectories) -> int:
    """The metric bytes one cycle reads over all jobs: half of what the batched reader's
    commands of one round may answer (base64 costs 4/3); the other half is room for the
    files read whole. The same figure bounds the SFTP reads of directories it did not list."""
    batch = listing.batch
    budget, commands = (
        (batch.budget, batch.max_commands)
        if batch is not None
        else (BATCH_BUDGET_BYTES, MAX_BATCH_COMMANDS)
    )
    return budget * commands * 3 // 4 // 2


def metric_shares(
    jobs: list[Job], listed: dict[Any, RunDirectory], capacity: int
) -> dict[Any, int]:
    """Each job's bytes of new metrics this cycle: its fair share (``jobs.read_shares``) of
    ``capacity``, at most ``METRICS_BATCH_MAX_BYTES``."""
    wants = {}
    for job in jobs:
        size = listed[job.id].metrics_size
        new = size - job.metrics_offset if size is not None else 0
        wants[job.id] = (job.run_as, max(0, min(new, METRICS_BATCH_MAX_BYTES)))
    return fair_shares(wants, capacity)


def _turn() -> int:
    """Which account goes first this cycle (``read_shares.interleaved``): it moves on
    with each watcher interval."""
    return int(timezone.now().timestamp() // max(1, settings.RECONCILE_INTERVAL_SECONDS))


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


def _read_metrics(
    job: Job, size: int | None, transport: Any, result: RunFilesResult, share: int
) -> bool:
    """The job's new metric bytes up to its ``share``; True when every byte up to the listed
    ``size`` was read (a last line without its newline yet is read, and waits for it)."""
    if size is None or size <= job.metrics_offset:
        return True
    path = f"{run_dir(job.cluster.workdir, str(job.id), job.run_as)}/metrics.jsonl"
    offset = job.metrics_offset
    end = min(size, offset + share)
    reached = offset
    while offset < end:
        chunk = transport.read_from(path, offset, min(end - offset, METRICS_READ_CHUNK))
        result.sftp_reads += 1
        result.bytes_read += len(chunk)
        if not chunk:
            break
        reached = max(reached, offset + len(chunk))
        stored, new_offset = metrics_ingest(job=job, data=chunk, start_offset=offset)
        result.metric_points += stored
        if new_offset == offset:
            break
        offset = new_offset
    return reached >= size


def _read_run_files(
    job: Job,
    files: RunDirectory,
    transport: Any,
    result: RunFilesResult,
    known_steps: set[str],
    share: int,
) -> bool:
    """What is new in the job's directory, read and ingested; True when all of it was."""
    directory = run_dir(job.cluster.workdir, str(job.id), job.run_as)
    complete = _read_metrics(job, files.metrics_size, transport, result, share)
    if files.acceptance and job.acceptance is None:
        acceptance = _json_evidence(
            job, transport, f"{directory}/acceptance.json", ACCEPTANCE_MAX_BYTES, result
        )
        if acceptance is not None:
            acceptance_store(job, acceptance)
    present = {path.rsplit("/", 2)[-2] for path in files.manifests}
    # The trainer's retention (checkpoint_keep) deleted these: keep the rows, say so.
    checkpoint_state.checkpoints_retire(
        job=job,
        steps=[int(name.split("-")[1]) for name in sorted(known_steps - present)],
        now=timezone.now(),
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
    return complete


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


def acceptance_store(job: Job, acceptance: Any) -> None:
    """Keep the job's acceptance manifest (once); a resume onto another software stack
    than its checkpoint's goes on the timeline."""
    if not Job.objects.filter(id=job.id, acceptance__isnull=True).update(acceptance=acceptance):
        return
    job.acceptance = acceptance
    changes = stack_changes(job)
    if changes:
        job_event(
            job,
            JobEvent.Kind.RESUMED,
            message="resumed onto another software stack than its checkpoint's: "
            + ", ".join(changes),
        )


def run_files_read(
    *, cluster: Cluster, jobs: list[Job], listing: RunDirectories | None = None
) -> RunFilesResult:
    """Read what is new in the run directories of ``jobs``: what the cycle's ``listing``
    shows (listed now where it was not yet), then the new metric bytes, the acceptance
    manifest and new checkpoint manifests: through the batched reader where it listed the
    directory, else over SFTP as each job's account. A job that has ended is marked
    ``files_final`` after a complete read: nothing more will appear. An account Gantry
    cannot log in as, or whose listing failed, is an error of its jobs only (they are read
    next cycle); the other accounts' jobs are read."""
    result = RunFilesResult()
    listing = listing if listing is not None else RunDirectories()
    listed = listing.look(run_directories_of(cluster, jobs), result.errors)
    directories = {job.id: run_dir(cluster.workdir, str(job.id), job.run_as) for job in jobs}
    # A directory the listing could not reach is unknown, not empty: read next cycle.
    jobs = [job for job in jobs if directories[job.id] in listed]
    result.listed.update({job.id: listed[directories[job.id]] for job in jobs})
    known: dict[Any, set[str]] = {job.id: set() for job in jobs}
    for job_id, step in Checkpoint.objects.filter(job__in=jobs).values_list("job_id", "step"):
        known[job_id].add(f"step-{step:06d}")
    fresh = Job.objects.select_related("cluster").in_bulk([job.id for job in jobs])
    jobs = [fresh.get(job.id, job) for job in jobs]
    shares = metric_shares(
        jobs, {job.id: listed[directories[job.id]] for job in jobs}, cycle_metrics_bytes(listing)
    )
    jobs = interleaved(jobs, lambda job: job.run_as, _turn())
    batched = [job for job in jobs if listing.batched(directories[job.id])]
    files = _batch_read(batched, directories, listed, known, listing, result, shares)
    by_account: dict[str, list[Job]] = {}
    for job in jobs:
        by_account.setdefault(job.run_as, []).append(job)
    for account, group in by_account.items():
        owner = _LazyOwner(cluster, account)
        try:
            for job in group:
                source = files.get(job.id) or owner
                if isinstance(source, PrefetchedFiles):
                    source.fallback = owner
                _read_one(
                    job, listed[directories[job.id]], source, result, known[job.id], shares[job.id]
                )
        except slurm_errors.SlurmError as error:
            if not account:
                raise
            logger.warning("run directories of %s on %s: %s", account, cluster.name, error)
            result.errors.append(f"run directories of {account}: {error}")
    return result


def _read_one(
    job: Job,
    files: RunDirectory,
    source: Any,
    result: RunFilesResult,
    known: set[str],
    share: int,
) -> None:
    try:
        complete = _read_run_files(job, files, source, result, known, share)
    except slurm_errors.SlurmError:
        raise
    except Exception as error:
        # One job's unreadable files never stop the others; it is tried again next cycle.
        logger.exception("job %s: reading its run directory failed", job.id)
        result.errors.append(f"job {job.id}: {type(error).__name__}: {error}")
        return
    if isinstance(source, PrefetchedFiles):
        result.errors += [f"job {job.id}: {error}" for error in source.errors]
        result.owner_reads += source.fallback_reads
        complete = complete and not source.incomplete
    if not complete:
        result.incomplete.add(job.id)
        return
    result.seen.add(job.id)
    if job.is_final:
        Job.objects.filter(id=job.id).update(files_final=True)


class _LazyOwner:
    """The job's account's transport, resolved (and logged in) only when a read needs it."""

    def __init__(self, cluster: Cluster, account: str) -> None:
        self.cluster, self.account = cluster, account
        self._transport: Any = None

    def _get(self) -> Any:
        if self._transport is None:
            self._transport = transport_as(self.cluster, self.account)
        return self._transport

    def read_from(self, path: str, offset: int, max_bytes: int) -> bytes:
        data: bytes = self._get().read_from(path, offset, max_bytes)
        return data

    def read_bounded(self, path: str, max_bytes: int) -> bytes:
        data: bytes = self._get().read_bounded(path, max_bytes)
        return data


class PrefetchedFiles:
    """A job's files as the batched reader read them, answering ``read_from`` and
    ``read_bounded`` as the SFTP transport does. A file the service account may not read
    is read as the job's own account (``fallback``); a read the batch deferred, or past the
    bytes it fetched, marks the job ``incomplete`` (not final yet: read next cycle)."""

    def __init__(self, directory: str, reads: dict[str, FileRead], sizes: dict[str, int]) -> None:
        self.directory = directory
        self.reads = reads
        self.sizes = sizes
        self.fallback: Any = None
        self.incomplete = False
        self.fallback_reads = 0
        self.errors: list[str] = []

    def _answer(self, path: str) -> FileRead | None:
        name = path.removeprefix(self.directory + "/")
        return self.reads.get(name) if name != path else None

    def read_from(self, path: str, offset: int, max_bytes: int) -> bytes:
        read = self._answer(path)
        if read is not None and read.code == "denied" and self.fallback is not None:
            self.fallback_reads += 1
            data: bytes = self.fallback.read_from(path, offset, max_bytes)
            return data
        if read is None or read.data is None:
            if read is not None and read.code == "refused":
                self.errors.append(f"{path}: {read.error}")
            self.incomplete = True
            return b""
        start = offset - read.offset
        if start < 0 or start > len(read.data):
            self.incomplete = True
            return b""
        chunk = read.data[start : start + max_bytes]
        if not chunk and offset < self.sizes.get(path, 0):
            self.incomplete = True
        return chunk

    def read_bounded(self, path: str, max_bytes: int) -> bytes:
        read = self._answer(path)
        if read is not None and read.data is not None:
            return read.data
        if read is not None and read.code == "absent":
            raise slurm_errors.RemoteFileNotFound(f"{path} does not exist", path=path)
        if read is not None and read.code == "refused":
            raise slurm_errors.RemoteFileRefused(f"{path}: {read.error}", path=path)
        if (read is None or read.code == "denied") and self.fallback is not None:
            self.fallback_reads += 1
            data: bytes = self.fallback.read_bounded(path, max_bytes)
            return data
        # Deferred past the reader's budget: as if not there yet, read next cycle.
        self.incomplete = True
        raise slurm_errors.RemoteFileNotFound(f"{path}: not read this cycle", path=path)


def _wanted(job: Job, files: RunDirectory, known: set[str], share: int) -> list[FileRequest]:
    """What ``_read_run_files`` will read of this job: the same choices, as requests."""
    wanted = []
    if files.metrics_size is not None and files.metrics_size > job.metrics_offset and share > 0:
        size = min(files.metrics_size - job.metrics_offset, share)
        wanted.append(FileRequest("metrics.jsonl", size, offset=job.metrics_offset))
    if files.acceptance and job.acceptance is None:
        wanted.append(FileRequest("acceptance.json", ACCEPTANCE_MAX_BYTES, whole=True))
    for manifest in files.manifests:
        step_dir = manifest.rsplit("/", 2)[-2]
        if step_dir not in known:
            name = f"checkpoints/{step_dir}/manifest.json"
            wanted.append(FileRequest(name, MANIFEST_MAX_BYTES, whole=True))
    return wanted


def _batch_read(
    jobs: list[Job],
    directories: dict[Any, str],
    listed: dict[str, RunDirectory],
    known: dict[Any, set[str]],
    listing: RunDirectories,
    result: RunFilesResult,
    shares: dict[Any, int],
) -> dict[Any, PrefetchedFiles]:
    """One command (more only past the reader's budget) for the new bytes of every job the
    batched reader listed; {} for none, or when that command failed (each job is then
    read as its account)."""
    requests = {
        directories[job.id]: _wanted(
            job, listed[directories[job.id]], known[job.id], shares[job.id]
        )
        for job in jobs
    }
    requests = {directory: wanted for directory, wanted in requests.items() if wanted}
    answers: dict[str, dict[str, FileRead]] = {}
    if requests:
        try:
            answers = listing.read(requests)
        except slurm_errors.SlurmError as error:
            logger.warning("batched reads of run files failed: %s", error)
            result.errors.append(f"batched reads of run files: {error}")
            return {}
    files: dict[Any, PrefetchedFiles] = {}
    for job in jobs:
        directory = directories[job.id]
        size = listed[directory].metrics_size
        sizes = {f"{directory}/metrics.jsonl": size} if size is not None else {}
        files[job.id] = PrefetchedFiles(directory, answers.get(directory, {}), sizes)
    return files
