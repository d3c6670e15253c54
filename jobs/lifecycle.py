"""The one Slurm lifecycle, for everything Gantry runs as one Slurm job (jobs and drills).

Every kind goes the same way: ``queued`` in Gantry → claimed for submission
(``submitting``, with a lease) → looked up by its tag before any ``sbatch`` (a redelivered
task adopts the Slurm job it finds instead of submitting again) → files written and
``sbatch`` → ``pending`` / ``running`` as Slurm says → a final state from accounting.
A submit task that went missing is requeued by the watcher; an object Slurm forgot is
declared lost. Every state change is a conditional update on the state the caller read,
so two workers racing apply each change once.

What differs between kinds (the script and files, what a refusal, a lost Slurm job or a
finished one means, the timeline) is a handful of hooks on a subclass:
``jobs.job_lifecycle.JobLifecycle`` and ``drills.lifecycle.DrillLifecycle``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, TypeVar

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from controlplane.tasknames import task_send
from core.errors import ApplicationError, ConflictError
from core.faults import faultpoint
from jobs.models import SlurmTracked
from nodes.cluster_access import slurm_client_for, transport_for
from nodes.models import Cluster
from nodes.services import cluster_reconcile_soon
from nodes.slurm import commands as slurm_commands
from nodes.slurm import errors as slurm_errors
from nodes.slurm.client import SlurmClient
from nodes.slurm.errors import describe_cluster_error
from nodes.slurm.parsers import SlurmJob
from nodes.slurm.transport import SshTransport

logger = logging.getLogger(__name__)

Tracked = TypeVar("Tracked", bound=SlurmTracked)


class Phase:
    """Where a Slurm job is, in Gantry's words (the values are also Job states)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETING = "completing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    NODE_FAIL = "node_fail"

    FINAL = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL})


# Slurm's job states, as phases.
SLURM_STATE_MAP: dict[str, str] = {
    "PENDING": Phase.PENDING,
    "CONFIGURING": Phase.PENDING,
    "REQUEUED": Phase.PENDING,
    "REQUEUE_FED": Phase.PENDING,
    "REQUEUE_HOLD": Phase.PENDING,
    "RESV_DEL_HOLD": Phase.PENDING,
    "RUNNING": Phase.RUNNING,
    "SUSPENDED": Phase.RUNNING,
    "STOPPED": Phase.RUNNING,
    "RESIZING": Phase.RUNNING,
    "SIGNALING": Phase.RUNNING,
    "STAGE_OUT": Phase.COMPLETING,
    "COMPLETING": Phase.COMPLETING,
    "COMPLETED": Phase.COMPLETED,
    "FAILED": Phase.FAILED,
    "BOOT_FAIL": Phase.FAILED,
    "OUT_OF_MEMORY": Phase.FAILED,
    "PREEMPTED": Phase.FAILED,
    "SPECIAL_EXIT": Phase.FAILED,
    "CANCELLED": Phase.CANCELLED,
    "REVOKED": Phase.CANCELLED,
    "DEADLINE": Phase.TIMEOUT,
    "TIMEOUT": Phase.TIMEOUT,
    "NODE_FAIL": Phase.NODE_FAIL,
}


def slurm_phase(slurm_state: str) -> str | None:
    """The phase of a Slurm state; None for a state Gantry does not know (left alone)."""
    return SLURM_STATE_MAP.get(slurm_state.upper())


def is_final_phase(slurm_state: str) -> bool:
    return slurm_phase(slurm_state) in Phase.FINAL


@dataclass
class SlurmViews:
    """What Slurm says about a set of tracked objects, read once per watcher cycle."""

    queue: dict[str, SlurmJob]
    accounted: dict[str, SlurmJob]
    # False when sacct was needed and failed: nothing may be declared lost then.
    accounting_ok: bool = True
    accounting_error: str = ""


def slurm_views(client: SlurmClient, tracked: Sequence[SlurmTracked]) -> SlurmViews:
    """One ``squeue`` for every tracked Slurm job, and one ``sacct`` for those that left the
    queue or show a final state there (squeue's view lacks the true exit code).

    A failing sacct does not hide what squeue said: the views carry the error instead.
    """
    if not tracked:
        return SlurmViews(queue={}, accounted={})
    queue = client.jobs_in_queue([obj.slurm_job_id for obj in tracked])
    need = [
        obj
        for obj in tracked
        if obj.slurm_job_id not in queue or is_final_phase(queue[obj.slurm_job_id].state)
    ]
    if not need:
        return SlurmViews(queue=queue, accounted={})
    start = min(obj.submitted_at or obj.created_at for obj in need) - timedelta(hours=1)
    try:
        accounted = client.jobs_accounting([obj.slurm_job_id for obj in need], start=start)
    except slurm_errors.SlurmError as error:
        return SlurmViews(
            queue=queue,
            accounted={},
            accounting_ok=False,
            accounting_error=describe_cluster_error(error),
        )
    return SlurmViews(queue=queue, accounted=accounted)


def slurm_error_as_application_error(what: str, error: slurm_errors.SlurmError) -> ApplicationError:
    """A cluster error a person caused by clicking: 503 when retrying may help, else 502."""
    return ApplicationError(
        f"{what}: {describe_cluster_error(error)}", status_code=503 if error.transient else 502
    )


class SlurmLifecycle(Generic[Tracked]):
    """The lifecycle, written once. Subclasses set the class attributes and the hooks."""

    model: ClassVar[type[Any]]
    # In words, for messages: "job", "drill job".
    noun: ClassVar[str]
    # The Celery task that runs ``submit_exactly_once`` for this kind.
    submit_task: ClassVar[str]
    # Prefix of this kind's fault points (``<prefix>.after_claim`` ...).
    faultpoint_prefix: ClassVar[str]

    QUEUED = "queued"
    SUBMITTING = "submitting"
    PENDING = "pending"
    RUNNING = "running"
    CANCELLED = "cancelled"

    # ---------------------------------------------------------------- hooks

    def for_submit(self) -> QuerySet[Any]:
        """The queryset the submit path reads the object from (with what ``prepare`` needs)."""
        return self.model.objects.select_related("cluster")

    def record(
        self,
        obj: Tracked,
        kind: str,
        *,
        from_state: str = "",
        to_state: str = "",
        message: str = "",
    ) -> None:
        """Put an entry on the object's timeline, if it has one."""

    def claimed(self, obj: Tracked) -> None:
        """Called once the submit task holds the object (``submitting``)."""

    def prepare(self, obj: Tracked, transport: SshTransport) -> str:
        """Write the run files and the sbatch script; return the script's path."""
        raise NotImplementedError

    def refused(self, obj: Tracked, reason: str) -> None:
        """Slurm refused the job (a permanent error): end the object, saying why."""
        raise NotImplementedError

    def gave_up(self, obj: Tracked, reason: str) -> None:
        """Retries of a transient error ran out while submitting."""
        raise NotImplementedError

    def lost(self, obj: Tracked, message: str, now: datetime) -> bool:
        """Neither squeue nor sacct knows the Slurm job any more; True if a change applied."""
        raise NotImplementedError

    def finished(
        self, obj: Tracked, record: SlurmJob, transport: SshTransport, now: datetime
    ) -> bool:
        """Accounting has the Slurm job's final state; True if a change applied."""
        raise NotImplementedError

    def state_for(self, phase: str) -> str:
        """The object's state while Slurm's job is in ``phase`` (pending/running/completing)."""
        return phase

    def observed(self, obj: Tracked, slurm_job: SlurmJob, to_state: str) -> dict[str, Any]:
        """Field values to store from Slurm's view of a job that has not ended."""
        return {}

    def ended_values(self, now: datetime) -> dict[str, Any]:
        """Field values of an object that ends (cancelled before reaching Slurm, ...)."""
        return {}

    def cancel_requested(self, obj: Tracked, *, by: str) -> str:
        """``scancel`` was sent for the object's Slurm job; returns the outcome in words."""
        raise NotImplementedError

    # ---------------------------------------------------------------- the lifecycle

    def transition(self, obj: Tracked, to_state: str, *, message: str = "", **values: Any) -> bool:
        """Move ``obj`` from the state it was read in to ``to_state``; False if someone
        else moved it first (then nothing is written)."""
        from_state = obj.state
        # Nothing got updated: another worker got there first.
        if not self.model.objects.filter(id=obj.id, state=from_state).update(
            state=to_state, **values
        ):
            return False
        self.record(obj, "state", from_state=from_state, to_state=to_state, message=message)
        obj.state = to_state
        for key, value in values.items():
            setattr(obj, key, value)
        return True

    def enqueue_submit(self, object_id: str) -> None:
        # Redis down: the watcher re-enqueues queued objects (requeue_stalled).
        task_send(self.submit_task, object_id)

    def submit_exactly_once(self, object_id: str) -> str:
        """Claim a queued object for submission, then submit it; returns what happened.

        Accepts ``queued``, and ``submitting`` whose lease ran out (the worker that held it
        died). The claim is a conditional update with a fresh lease. A transient error
        gives the lease back at once, so the task's own retry can claim it again; safe to
        re-run because the submit looks the tag up before any ``sbatch``.
        """
        now = timezone.now()
        claimed = (
            self.model.objects.filter(id=object_id)
            .filter(
                Q(state=self.QUEUED)
                | Q(state=self.SUBMITTING, submit_lease_until__lt=now)
                | Q(state=self.SUBMITTING, submit_lease_until__isnull=True)
            )
            .update(
                state=self.SUBMITTING,
                submit_lease_until=now + timedelta(seconds=settings.SUBMIT_LEASE_SECONDS),
                submit_attempts=F("submit_attempts") + 1,
            )
        )
        if not claimed:
            return "not claimable (already submitted, being submitted, or ended)"
        try:
            return self._submit_claimed(object_id)
        except slurm_errors.SlurmError as error:
            if error.transient:
                self.model.objects.filter(id=object_id, state=self.SUBMITTING).update(
                    submit_lease_until=None
                )
            raise

    def _submit_claimed(self, object_id: str) -> str:
        faultpoint(f"{self.faultpoint_prefix}.after_claim")
        obj = self.for_submit().get(id=object_id)
        self.claimed(obj)
        cluster = obj.cluster
        client = slurm_client_for(cluster)
        tag = slurm_commands.job_tag(obj.id)
        existing = client.find_jobs_by_tag(tag, since=obj.created_at - timedelta(minutes=5))
        if existing:
            found = existing[0]
            if len(existing) > 1:
                logger.error(
                    "%s %s has %d Slurm jobs: %s", self.noun, obj.id, len(existing), existing
                )
            self.adopt(obj, found, message=f"found Slurm job {found.job_id} by its tag; adopted it")
            return f"adopted Slurm job {found.job_id}"
        script_path = self.prepare(obj, transport_for(cluster))
        faultpoint(f"{self.faultpoint_prefix}.before_sbatch")
        try:
            slurm_id = client.submit(script_path, tag=tag)
        except slurm_errors.SlurmCommandError as error:
            if error.transient:
                raise
            self.refused(obj, f"Slurm refused the {self.noun}: {error.stderr.strip() or error}")
            return "refused by Slurm"
        # The window a redelivery must cover: Slurm has the job, the database does not yet.
        faultpoint(f"{self.faultpoint_prefix}.after_sbatch")
        now = timezone.now()
        obj.state = self.SUBMITTING
        if not self.transition(
            obj,
            self.PENDING,
            message=f"sbatch accepted it as Slurm job {slurm_id}",
            slurm_job_id=slurm_id,
            submitted_at=now,
            last_seen_in_slurm_at=now,
            submit_lease_until=None,
        ):
            self._cancel_if_cancelled_meanwhile(obj, client, slurm_id)
        # Look at it soon, whatever the watcher's idle back-off was.
        cluster_reconcile_soon(cluster_id=cluster.pk)
        return f"submitted as Slurm job {slurm_id}"

    def _cancel_if_cancelled_meanwhile(
        self, obj: Tracked, client: SlurmClient, slurm_id: str
    ) -> None:
        """Cancelled while we submitted: do not leave a Slurm job nobody tracks."""
        current = self.model.objects.get(id=obj.id)
        if current.state == self.CANCELLED:
            client.cancel(slurm_id)
            self.model.objects.filter(id=obj.id).update(slurm_job_id=slurm_id)
            self.record(
                obj, "cancel", message=f"cancelled Slurm job {slurm_id} submitted meanwhile"
            )

    def adopt(self, obj: Tracked, found: SlurmJob, *, message: str) -> None:
        """Take over the Slurm job found by the object's tag instead of submitting again."""
        phase = slurm_phase(found.state) or Phase.PENDING
        # Leave final states to the watcher, which reads exit codes from accounting.
        state = self.PENDING if phase in Phase.FINAL else self.state_for(phase)
        now = timezone.now()
        obj.state = self.SUBMITTING
        if not self.transition(
            obj,
            state,
            message=message,
            slurm_job_id=found.job_id,
            submitted_at=found.submit_time or now,
            last_seen_in_slurm_at=now,
            submit_lease_until=None,
        ):
            self._cancel_if_cancelled_meanwhile(obj, slurm_client_for(obj.cluster), found.job_id)

    def submit_gave_up(self, object_id: str, error: BaseException) -> None:
        """Retries ran out on a transient error (the cluster may be down for a while)."""
        obj = self.model.objects.filter(id=object_id, state=self.SUBMITTING).first()
        if obj is not None:
            self.gave_up(obj, describe_cluster_error(error))

    def cancel(self, obj: Tracked, *, by: str, audit: Callable[[Tracked], None]) -> str:
        """Cancel ``obj``; idempotent. ``audit(obj)`` is called in the same transaction as
        the change it records. Accepts any state; a final object is left as it is."""
        for _ in range(3):
            obj.refresh_from_db()
            if obj.state in self.model.FINAL_STATES:
                return f"already {obj.state}"
            if obj.slurm_job_id:
                break
            with transaction.atomic():
                if self.transition(
                    obj,
                    self.CANCELLED,
                    message=f"cancelled by {by} before reaching Slurm",
                    **self.ended_values(timezone.now()),
                ):
                    audit(obj)
                    return "cancelled"
        if not obj.slurm_job_id:
            raise ConflictError(
                f"The {self.noun} is being submitted right now; try again in a moment."
            )
        try:
            slurm_client_for(obj.cluster).cancel(obj.slurm_job_id)
        except slurm_errors.SlurmError as error:
            raise slurm_error_as_application_error("Could not cancel", error) from None
        with transaction.atomic():
            outcome = self.cancel_requested(obj, by=by)
            audit(obj)
        cluster_reconcile_soon(cluster_id=obj.cluster_id)
        return outcome

    def requeue_stalled(self, cluster: Cluster, now: datetime) -> int:
        """Queued objects whose submit task was lost (Redis restarted, worker killed), and
        submitting ones whose lease ran out, are enqueued again. Returns how many."""
        stale = now - timedelta(seconds=settings.SUBMIT_REQUEUE_AFTER_SECONDS)
        stalled = self.model.objects.filter(cluster=cluster).filter(
            Q(state=self.QUEUED, updated_at__lt=stale)
            | Q(state=self.SUBMITTING, submit_lease_until__lt=now)
        )
        requeued = 0
        for object_id in stalled.values_list("id", flat=True)[:100]:
            # Touch it so it is not requeued again next cycle while the task is on its way.
            self.model.objects.filter(id=object_id).update(updated_at=now)
            self.enqueue_submit(str(object_id))
            requeued += 1
        return requeued

    def active_in_slurm(self, cluster: Cluster) -> list[Tracked]:
        """Objects Slurm knows (a Slurm job id and a state Slurm moves)."""
        return list(
            self.for_submit()
            .filter(cluster=cluster, state__in=self.model.SLURM_ACTIVE_STATES)
            .exclude(slurm_job_id="")
        )

    def has_work(self, cluster: Cluster) -> bool:
        return bool(
            self.model.objects.filter(cluster=cluster)
            .exclude(state__in=self.model.FINAL_STATES)
            .exists()
        )

    def apply_views(
        self,
        objects: Sequence[Tracked],
        views: SlurmViews,
        transport: SshTransport,
        now: datetime,
        errors: list[str],
    ) -> int:
        """Apply what Slurm says to each object; returns the number of changes.

        One object's bad data never stops the others: its error is logged and listed.
        """
        changes = 0
        seen: list[Any] = []
        for obj in objects:
            try:
                changes += self._apply_view(obj, views, transport, now, seen)
            except slurm_errors.SlurmError:
                raise
            except Exception as error:
                logger.exception("%s %s: applying Slurm's view failed", self.noun, obj.id)
                errors.append(f"{self.noun} {obj.id}: {type(error).__name__}: {error}")
        # One write for every object Slurm still knows, not one per object.
        if seen:
            self.model.objects.filter(id__in=seen).update(last_seen_in_slurm_at=now)
        return changes

    def _apply_view(
        self,
        obj: Tracked,
        views: SlurmViews,
        transport: SshTransport,
        now: datetime,
        seen: list[Any],
    ) -> int:
        queued = views.queue.get(obj.slurm_job_id)
        if queued is not None:
            seen.append(obj.id)
            if not is_final_phase(queued.state):
                return self._apply_active(obj, queued)
        record = views.accounted.get(obj.slurm_job_id)
        if record is not None:
            if queued is None:
                seen.append(obj.id)
            if is_final_phase(record.state):
                return int(self.finished(obj, record, transport, now))
            return self._apply_active(obj, record)
        if queued is None and views.accounting_ok:
            return self._maybe_lost(obj, now)
        # Final in squeue but not yet in sacct (it lags): next cycle.
        return 0

    def _apply_active(self, obj: Tracked, slurm_job: SlurmJob) -> int:
        phase = slurm_phase(slurm_job.state)
        if phase is None or phase in Phase.FINAL:
            return 0
        to_state = self.state_for(phase)
        values = self.observed(obj, slurm_job, to_state)
        state = obj.state
        if to_state != state:
            message = str(values.get("state_reason") or "")
            return int(self.transition(obj, to_state, message=message, **values))
        if values:
            self.model.objects.filter(id=obj.id, state=state).update(**values)
            if values.get("state_reason"):
                self.record(
                    obj, "reason", from_state=state, to_state=state, message=values["state_reason"]
                )
        return 0

    def _maybe_lost(self, obj: Tracked, now: datetime) -> int:
        last_seen = obj.last_seen_in_slurm_at or obj.submitted_at or obj.created_at
        if now - last_seen < timedelta(seconds=settings.JOB_LOST_AFTER_SECONDS):
            return 0
        message = (
            f"Slurm has no record of {self.noun} {obj.slurm_job_id} in squeue or sacct for "
            f"{int((now - last_seen).total_seconds())} s"
        )
        return int(self.lost(obj, message, now))
