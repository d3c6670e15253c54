"""Why a job is still pending, the rest: Slurm's expected start and the job's place in its
partition's queue (from ``squeue --start``, refreshed by the watcher), and hold / release.

Reasons in words are in ``jobs.pending`` (pure); Gantry's own view of the queue, for a job
the watcher has not asked about yet, is ``jobs.selectors.job_queue_position``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from core.access import require_can_act
from core.audit import AuditAction, audit_event_record
from core.errors import ConflictError
from core.types import User
from jobs.lifecycle import JOBS
from jobs.models import Job, JobEvent
from jobs.pending import pending_reason, pending_reason_parts
from jobs.selectors import job_queue_position
from nodes.models import Cluster
from runs.models import SlurmRequest
from slurm import errors as slurm_errors
from slurm.client import SlurmClient
from slurm.errors import describe_cluster_error
from slurm.parsers import queue_places

# Slurm's reason codes of a held job (lower case).
HELD_CODES = frozenset({"jobhelduser", "jobheldadmin", "held"})
ESTIMATE_FIELDS = ["expected_start_at", "queue_position", "queue_length", "pending_checked_at"]


# ---------------------------------------------------------------- the watcher's part


def pending_estimates_refresh(*, cluster: Cluster, client: SlurmClient, now: datetime) -> list[str]:
    """Ask Slurm, in one ``squeue --start`` for every pending job of the partitions
    Gantry's pending jobs wait in, when each is expected to start and where it stands;
    store that on the jobs. Nothing is asked while no job is pending, and at most every
    ``PENDING_REFRESH_SECONDS``. Returns the errors (the cycle goes on without estimates);
    a lost SSH link is raised, like every command of the cycle."""
    pending = list(
        Job.objects.filter(cluster=cluster, state=Job.State.PENDING)
        .exclude(slurm_job_id="")
        .only("id", "slurm_job_id", "partition", "pending_checked_at")
    )
    if not pending:
        return []
    fresh_after = now - timedelta(seconds=settings.PENDING_REFRESH_SECONDS)
    if all(job.pending_checked_at and job.pending_checked_at > fresh_after for job in pending):
        return []
    try:
        starts = client.pending_starts({job.partition for job in pending})
    except slurm_errors.SshError:
        raise
    except slurm_errors.SlurmError as error:
        return [f"expected start times (squeue --start) failed: {describe_cluster_error(error)}"]
    by_id = {start.job_id: start for start in starts}
    places = queue_places(starts)
    for job in pending:
        start, place = by_id.get(job.slurm_job_id), places.get(job.slurm_job_id)
        job.expected_start_at = start.expected_start if start else None
        job.queue_position = place.position if place else None
        job.queue_length = place.of if place else None
        job.pending_checked_at = now
    # One statement for all of them; only these columns, so a state the same cycle moved
    # meanwhile is not written back.
    Job.objects.bulk_update(pending, ESTIMATE_FIELDS, batch_size=500)
    return []


# ---------------------------------------------------------------- reads


def _last_hold_event(job: Job) -> JobEvent | None:
    """The last hold or release a worker sent (``held by …`` / ``released by …``): the
    timeline's entries of the same kinds for a request asked or failed do not count."""
    events = JobEvent.objects.filter(
        job=job, kind__in=[JobEvent.Kind.HOLD, JobEvent.Kind.RELEASE]
    ).filter(Q(message__startswith="held by ") | Q(message__startswith="released by "))
    return events.order_by("-at", "-id").first()


def job_pending_summary(*, job: Job) -> dict[str, Any] | None:
    """Why a pending job waits and when it may start, for the page and the API; None
    unless the job is pending in Slurm.

    ``queue_position.basis``: ``slurm`` (its place among every pending job of the
    partition, by priority, as of ``checked_at``) or ``gantry`` (among Gantry's own pending
    jobs, by submit time, until the watcher has asked Slurm).
    """
    if job.state != Job.State.PENDING:
        return None
    summary: dict[str, Any] = dict(pending_reason(job.state_reason))
    code, _detail = pending_reason_parts(job.state_reason)
    held = code.lower() in HELD_CODES
    event = _last_hold_event(job)
    held_in_gantry = event is not None and event.kind == "hold"
    if held and held_in_gantry:
        assert event is not None
        summary["explanation"] = (
            f"Held in Gantry ({event.message}, {event.at:%Y-%m-%d %H:%M} UTC): it stays "
            "pending until its owner or an operator releases it."
        )
    # A held job starts only once released: Slurm's last plan for it means nothing now.
    summary.update(
        held=held or held_in_gantry,
        expected_start=None if held or held_in_gantry else job.expected_start_at,
        checked_at=job.pending_checked_at,
    )
    if job.pending_checked_at is not None and job.queue_position is not None:
        summary["queue_position"] = {
            "position": job.queue_position,
            "of": job.queue_length or job.queue_position,
            "partition": job.partition,
            "basis": "slurm",
        }
    else:
        position = job_queue_position(job=job)
        summary["queue_position"] = (
            None
            if position is None
            else {
                "position": position.position,
                "of": position.of,
                "partition": position.partition,
                "basis": "gantry",
            }
        )
    return summary


# ---------------------------------------------------------------- hold and release


def _pending_in_slurm(job: Job, what: str) -> None:
    job.refresh_from_db()
    if job.state != Job.State.PENDING or not job.slurm_job_id:
        raise ConflictError(
            f"Only a job pending in Slurm can be {what}; this one is {job.get_state_display()}."
        )


def _hold_or_release(*, actor: User, job: Job, hold: bool) -> str:
    """Record the request; a worker sends ``scontrol`` as the job's account
    (``runs.lifecycle.requests``), so nothing the account's login files do can hold this
    request. The newer of a hold and a release still open wins."""
    action = SlurmRequest.Action.HOLD if hold else SlurmRequest.Action.RELEASE
    require_can_act(actor, owner_id=job.owner_id, what="hold or release this job")
    # Slurm holds a running job without complaint (and changes nothing): check first.
    _pending_in_slurm(job, "held" if hold else "released")
    with transaction.atomic():
        if JOBS.request_open(job, action, by=actor.get_username()) is None:
            return f"{action} requested already"
        audit_event_record(
            actor=actor,
            action=AuditAction.JOB_HOLD if hold else AuditAction.JOB_RELEASE,
            target=job,
            details={"slurm_job_id": job.slurm_job_id},
        )
        # The next watcher cycle reads Slurm's new reason (and a fresh estimate).
        Job.objects.filter(id=job.id).update(pending_checked_at=None)
    return f"{action} requested"


def job_hold(*, actor: User, job: Job) -> str:
    """Ask to hold a job that is pending in Slurm (``scontrol hold``, sent by a worker),
    owner or operator, audited. Accepts ``pending`` only. Safe to re-run: a hold asked
    while one is open is the same request; holding a held job changes nothing in Slurm.
    """
    return _hold_or_release(actor=actor, job=job, hold=True)


def job_release(*, actor: User, job: Job) -> str:
    """Ask to release a held job (``scontrol release``, sent by a worker), owner or
    operator, audited. Accepts ``pending`` only; releasing a job that is not held changes
    nothing in Slurm."""
    return _hold_or_release(actor=actor, job=job, hold=False)
