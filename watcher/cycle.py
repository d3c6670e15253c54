"""One watcher cycle for one cluster: every kind of Slurm-tracked object (jobs, drills) in
one ``squeue`` by job id, at most one ``sacct`` (or, without accounting, the exit records
from the run-directory listing) and one listing of every run directory it reads, as the
service account (``runs.rundir_batch``: the owners let it read their run directories with
an ACL; it checks ownership and links there), then one command of reads of only the new
bytes; while an sbatch's outcome is unknown or one went out recently, one more ``squeue``
and ``sacct`` by tag; while jobs are pending, one ``squeue --start`` at most every
``PENDING_REFRESH_SECONDS`` (``jobs.pending_queue``). A run directory the service account
may not read (an area from before the grant, an owner who removed it) is listed and read
as its own account, one login and command per such account (``directory_fallbacks``).

Cost in remote commands and SSH logins does not grow with the number of jobs or accounts
(``commands``, ``logins``; the listing and the reads take more commands only past the
reader's budget of bytes, see ``runs.rundir_batch``). Safe to re-run anytime:
every change is a conditional update on the state it was read in. The cycle degrades
rather than stops: what squeue said is applied even when sacct fails (sacct is then
retried with back-off and the failure shown on the cluster), and one object's bad data
never aborts the others.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from acceptance.lifecycle import STEPS
from acceptance.orchestrate import acceptance_cycle
from core.worker_stats import WatcherCycleStats, watcher_cycle_record
from drills.lifecycle import DRILLS
from jobs.lifecycle import JOBS
from jobs.models import Job
from jobs.pending_queue import pending_estimates_refresh
from jobs.rundir import RunFilesResult, jobs_to_read, run_directories_of, run_files_read
from nodes.access.cluster import slurm_client_for, transport_for
from nodes.models import Cluster
from recovery.cycle import recovery_cycle
from recovery.models import Incident
from runs.lifecycle import (
    ACCOUNTING_DOWN,
    ACCOUNTING_NONE,
    ACCOUNTING_OK,
    SlurmLifecycle,
    evidence_as_owners,
    slurm_views,
)
from runs.rundir import RunDirectories
from runs.rundir_batch import BatchReader
from slurm import commands as slurm_commands
from slurm import errors as slurm_errors
from slurm.client import SlurmClient
from slurm.errors import describe_cluster_error
from slurm.transport import SshTransport, pool_counters, pool_logins

logger = logging.getLogger(__name__)

# Every kind of object Gantry runs as a Slurm job; each cycle looks at all of them.
KINDS: tuple[SlurmLifecycle[Any], ...] = (JOBS, DRILLS, STEPS)
MAX_ACCOUNTING_BACKOFF_SECONDS = 300


@dataclass
class ReconcileResult:
    commands: int = 0
    # SSH logins (connections opened) during the cycle, every identity.
    logins: int = 0
    # Run directories the batched reader could not read, listed as their account instead.
    directory_fallbacks: int = 0
    # Wall time of this cycle's SSH commands and how many failed at the SSH level.
    ssh_seconds: float = 0.0
    ssh_errors: int = 0
    sftp_reads: int = 0
    bytes_read: int = 0
    state_changes: int = 0
    metric_points: int = 0
    checkpoints: int = 0
    requeued: int = 0
    accounting: str = ACCOUNTING_OK
    incidents_opened: int = 0
    incidents_advanced: int = 0
    errors: list[str] = field(default_factory=list)


def accounting_mode(cluster: Cluster, now: datetime) -> str:
    """Whether this cycle asks sacct: not on a cluster without accounting, not while a
    failed sacct backs off."""
    if cluster.accounting_available is False:
        return ACCOUNTING_NONE
    if cluster.accounting_retry_at is not None and cluster.accounting_retry_at > now:
        return ACCOUNTING_DOWN
    return ACCOUNTING_OK


def cluster_reconcile(*, cluster_id: int) -> ReconcileResult:
    """One watcher cycle for a cluster (see the module docstring); its duration and SSH
    numbers go to the shared worker stats that /metrics exports."""
    started = time.monotonic()
    cluster = Cluster.objects.get(pk=cluster_id)
    result = _cycle(cluster)
    watcher_cycle_record(
        cluster_id=cluster_id,
        stats=WatcherCycleStats(
            seconds=time.monotonic() - started,
            failed=bool(result.errors),
            ssh_commands=result.commands,
            ssh_seconds=result.ssh_seconds,
            ssh_errors=result.ssh_errors,
        ),
    )
    return result


def _cycle(cluster: Cluster) -> ReconcileResult:
    result = ReconcileResult()
    now = timezone.now()
    _accept_and_requeue(cluster, now, result)
    tracked = [(kind, kind.active_in_slurm(cluster)) for kind in KINDS]
    risky = [(kind, kind.at_risk(cluster, now)) for kind in KINDS]
    if (
        not any(objects for _, objects in tracked + risky)
        and not _has_files_to_read(cluster)
        and not Incident.objects.filter(
            cluster=cluster, outcome__in=list(Incident.ACTIVE_OUTCOMES)
        ).exists()
    ):
        _reconcile_done(cluster, result, now)
        return result
    # squeue/sacct as the service account (every user's jobs); run directories as each
    # object's own account (readable by it alone).
    client = slurm_client_for(cluster)
    transport = transport_for(cluster)
    login_node = transport.config.login_node
    before = pool_counters(login_node)
    logins_before = pool_logins(login_node)
    result.accounting = accounting_mode(cluster, now)
    kind_of = {id(obj): kind for kind, objects in tracked for obj in objects}
    try:
        _resolve_by_tag(cluster, client, risky, result, now)
        # One listing of run directories for the rest of the cycle (after the tag lookup,
        # whose own rare listing may come before squeue): the exit records the views need
        # and the files the jobs wrote, one command per account.
        listing = RunDirectories(batch=batch_reader(cluster, transport))
        listing.want(run_directories_of(cluster, jobs_to_read(cluster)))
        listing.want(
            [
                (kind.run_directory(obj), functools.partial(kind.transport_of, obj))
                for kind, objects in tracked
                for obj in objects
            ]
        )
        views = slurm_views(
            client,
            transport,
            [(obj, kind.run_directory(obj)) for kind, objects in tracked for obj in objects],
            owner_of=lambda obj: kind_of[id(obj)].transport_of(obj),
            listing=listing,
            accounting=result.accounting,
            early=frozenset(
                obj.slurm_job_id
                for kind, objects in tracked
                if kind.FINISH_FROM_EXIT_RECORD
                for obj in objects
            ),
        )
        result.errors += views.errors
        if views.accounting == ACCOUNTING_DOWN and result.accounting == ACCOUNTING_OK:
            _accounting_failed(cluster, views.accounting_error, now, result)
        for kind, objects in tracked:
            result.state_changes += kind.apply_views(objects, views, now, result.errors)
        # Pending jobs' expected start: at most one squeue --start, only while some wait.
        result.errors += pending_estimates_refresh(cluster=cluster, client=client, now=now)
        # Jobs that just ended get their files read in this same cycle.
        files = run_files_read(cluster=cluster, jobs=jobs_to_read(cluster), listing=listing)
        _recover(cluster, files, now, result)
    except slurm_errors.SlurmError as error:
        _count_ssh(result, login_node, before)
        result.logins = pool_logins(login_node) - logins_before
        _reconcile_failed(cluster, result, now, describe_cluster_error(error))
        return result
    result.sftp_reads = files.sftp_reads
    result.bytes_read = files.bytes_read
    result.metric_points = files.metric_points
    result.checkpoints = files.checkpoints
    result.errors += files.errors
    result.directory_fallbacks = listing.fallbacks
    _count_ssh(result, login_node, before)
    result.logins = pool_logins(login_node) - logins_before
    if result.accounting == ACCOUNTING_OK:
        _accounting_answered(cluster)
    _reconcile_done(cluster, result, now)
    return result


def batch_reader(cluster: Cluster, transport: SshTransport) -> BatchReader | None:
    """The cycle's batched run-directory reader: as the service account, with the cluster's
    Python (any Python 3.6+ with the standard library does)."""
    return BatchReader(
        transport,
        workdir=cluster.workdir,
        service_account=cluster.ssh_user,
        python=cluster.python,
    )


def _recover(
    cluster: Cluster, files: RunFilesResult, now: datetime, result: ReconcileResult
) -> None:
    """Recovery's detection and its open incidents (``recovery.cycle``), on what this cycle
    read. A failure there is logged and listed, never a failed cycle: the watcher's own
    work (states, files) is already applied."""
    try:
        recovered = recovery_cycle(cluster=cluster, seen=files.seen, now=now, listed=files.listed)
    except slurm_errors.SlurmError:
        raise
    except Exception as error:
        logger.exception("cluster %s: recovery step failed", cluster.name)
        result.errors.append(f"recovery: {type(error).__name__}: {error}")
        return
    result.incidents_opened += recovered.opened
    result.incidents_advanced += recovered.advanced


def _accept_and_requeue(cluster: Cluster, now: datetime, result: ReconcileResult) -> None:
    """Acceptance runs move to their next steps (database only: the steps it makes are
    submitted by their tasks and watched as one more kind); then every kind's stalled
    submissions are enqueued again."""
    try:
        result.state_changes += acceptance_cycle(cluster=cluster, now=now)
    except Exception as error:
        logger.exception("cluster %s: acceptance step failed", cluster.name)
        result.errors.append(f"acceptance: {type(error).__name__}: {error}")
    for kind in KINDS:
        result.requeued += kind.requeue_stalled(cluster, now)


def _count_ssh(
    result: ReconcileResult, login_node: tuple[str, int], before: tuple[int, float, int]
) -> None:
    """This cycle's SSH commands over every identity's connection to the login node."""
    commands, seconds, errors = pool_counters(login_node)
    result.commands = commands - before[0]
    result.ssh_seconds = seconds - before[1]
    result.ssh_errors = errors - before[2]


def _resolve_by_tag(
    cluster: Cluster,
    client: SlurmClient,
    risky: list[tuple[SlurmLifecycle[Any], list[Any]]],
    result: ReconcileResult,
    now: datetime,
) -> None:
    """One squeue and one sacct by tag for every object whose sbatch outcome is unknown or
    went out recently: adopt, prove absent, or cancel an extra Slurm job."""
    objects = [obj for _, group in risky for obj in group]
    if not objects:
        return
    since = min(obj.created_at for obj in objects) - timedelta(minutes=5)
    lookup = client.jobs_by_tags(
        [slurm_commands.job_tag(obj.id) for obj in objects],
        since=since,
        accounting=result.accounting == ACCOUNTING_OK,
    )
    if result.accounting == ACCOUNTING_OK and not lookup.accounting_ok:
        _accounting_failed(cluster, lookup.accounting_error, now, result)
    unknown = [
        (kind.run_directory(obj), functools.partial(kind.transport_of, obj))
        for kind, group in risky
        for obj in group
        if obj.state == kind.SUBMIT_UNKNOWN
    ]
    evidence = (
        evidence_as_owners(unknown, result.errors) if unknown and not lookup.accounting_ok else {}
    )
    for kind, group in risky:
        result.state_changes += kind.resolve_by_tag(group, lookup, evidence, client, now)


def _accounting_failed(
    cluster: Cluster, error: str, now: datetime, result: ReconcileResult
) -> None:
    """sacct failed: squeue is still applied; ask sacct again after a growing pause."""
    result.accounting = ACCOUNTING_DOWN
    result.errors.append(f"accounting (sacct) failed: {error}")
    failures = cluster.accounting_failures + 1
    wait = min(MAX_ACCOUNTING_BACKOFF_SECONDS, settings.RECONCILE_INTERVAL_SECONDS * 2**failures)
    Cluster.objects.filter(pk=cluster.pk).update(
        accounting_failures=F("accounting_failures") + 1,
        accounting_retry_at=now + timedelta(seconds=wait),
        accounting_error=error[:2000],
        accounting_failing_since=cluster.accounting_failing_since or now,
    )
    cluster.accounting_failures = failures
    logger.warning("cluster %s: sacct failed (%s); retrying in %s s", cluster.name, error, wait)


def _accounting_answered(cluster: Cluster) -> None:
    if cluster.accounting_failures or cluster.accounting_error:
        Cluster.objects.filter(pk=cluster.pk).update(
            accounting_failures=0,
            accounting_retry_at=None,
            accounting_error="",
            accounting_failing_since=None,
        )


def _has_files_to_read(cluster: Cluster) -> bool:
    return (
        Job.objects.filter(cluster=cluster, files_final=False)
        .exclude(slurm_job_id="")
        .exclude(state__in=[Job.State.QUEUED, Job.State.SUBMITTING, Job.State.PENDING])
        .exists()
    )


def _reconcile_failed(cluster: Cluster, result: ReconcileResult, now: datetime, why: str) -> None:
    result.errors.append(why)
    Cluster.objects.filter(pk=cluster.pk).update(
        last_reconcile_error=why[:2000],
        last_reconcile_at=now,
        next_reconcile_at=now + timedelta(seconds=min(60, settings.RECONCILE_INTERVAL_SECONDS * 4)),
    )


def _reconcile_done(cluster: Cluster, result: ReconcileResult, now: datetime) -> None:
    changed = bool(result.state_changes or result.metric_points or result.checkpoints)
    idle = 0 if changed else cluster.reconcile_idle_cycles + 1
    interval = settings.RECONCILE_INTERVAL_SECONDS
    has_work = any(kind.has_work(cluster) for kind in KINDS) or (
        Job.objects.filter(cluster=cluster, files_final=False).exists()
    )
    # Back off while nothing changes; with nothing to watch, look rarely; while someone
    # waits for an object in flight (a drill), look at the fast interval without backing off.
    if any(kind.LATENCY_SENSITIVE and kind.has_work(cluster) for kind in KINDS):
        wait = min(interval, settings.RECONCILE_FAST_INTERVAL_SECONDS)
    elif has_work:
        wait = interval * min(2 ** min(idle, 3), 4)
    else:
        wait = max(30, interval)
    Cluster.objects.filter(pk=cluster.pk).update(
        reconcile_idle_cycles=idle,
        last_reconcile_at=now,
        last_reconcile_error="; ".join(result.errors)[:2000],
        next_reconcile_at=now + timedelta(seconds=wait),
    )
