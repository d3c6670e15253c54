"""A kind of object Gantry runs as one Slurm job: its states, the hooks that make it
different from other kinds, and the one primitive every change goes through
(``transition``: a conditional update on the state the caller read)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar

from django.db.models import QuerySet

from controlplane.tasknames import task_send
from nodes.access.cluster import slurm_client_as, transport_as
from runs.events import RunEventKind
from runs.models import SlurmTracked
from slurm.client import SlurmClient
from slurm.parsers import SlurmJob
from slurm.transport import SshTransport

logger = logging.getLogger(__name__)

Tracked = TypeVar("Tracked", bound=SlurmTracked)

# Every lifecycle by its model's label ("jobs.job"): a worker carrying out a request
# (``runs.lifecycle.requests``) finds the kind it was made for here.
LIFECYCLES: dict[str, SlurmKind[Any]] = {}


def lifecycle_of(label: str) -> SlurmKind[Any]:
    """The lifecycle of the kind ``label`` names. Each app's ``lifecycle`` module makes its
    one instance on import; a process that has not imported them yet does so here."""
    if label not in LIFECYCLES:
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("lifecycle")
    return LIFECYCLES[label]


class WontSubmit(Exception):
    """Raised by ``prepare``: Gantry decided, before any sbatch, that this object cannot
    run (``code`` says why, in the kind's terms); ``declined`` ends it."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class SlurmKind(Generic[Tracked]):
    """Subclasses set the class attributes and the hooks (what differs between kinds)."""

    model: ClassVar[type[Any]]
    # In words, for messages: "job", "drill job".
    noun: ClassVar[str]
    # The Celery task that runs ``submit_exactly_once`` for this kind.
    submit_task: ClassVar[str]
    # Prefix of this kind's fault points (``<prefix>.after_claim`` ...).
    faultpoint_prefix: ClassVar[str]
    # Finish from the exit record the batch script wrote as soon as the Slurm job left
    # the queue, without waiting for sacct (which lags the scheduler by seconds). For kinds
    # whose outcome is in their own result file (a drill's drill.json), where sacct's finer
    # final states (OUT_OF_MEMORY, NODE_FAIL) add nothing; jobs wait for accounting.
    FINISH_FROM_EXIT_RECORD: ClassVar[bool] = False
    # Watch closely (no idle back-off) while one is in flight: someone waits for it.
    LATENCY_SENSITIVE: ClassVar[bool] = False

    def __init__(self) -> None:
        LIFECYCLES[self.label] = self

    @property
    def label(self) -> str:
        """The kind's name where requests record it: its model's label."""
        return str(self.model._meta.label_lower)

    QUEUED = "queued"
    SUBMITTING = "submitting"
    SUBMIT_UNKNOWN = "submit_unknown"
    PENDING = "pending"
    RUNNING = "running"
    CANCELLED = "cancelled"

    # ---------------------------------------------------------------- hooks

    def for_submit(self) -> QuerySet[Any]:
        """The queryset the submit path reads the object from (with what ``prepare`` needs)."""
        return self.model.objects.select_related("cluster")

    def run_directory(self, obj: Tracked) -> str:
        """Where the object's Slurm job writes its output and exit record."""
        raise NotImplementedError

    def run_as(self, obj: Tracked) -> str:
        """The cluster account the object's Slurm job runs as, and whose files it writes
        (``""``: the cluster's service account, for work from before per-user identities
        and clusters in service-account mode)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- identities

    def transport_of(self, obj: Tracked) -> SshTransport:
        """The connection as the object's account: its files, its sbatch, its scancel."""
        return transport_as(obj.cluster, self.run_as(obj))

    def client_of(self, obj: Tracked) -> SlurmClient:
        return slurm_client_as(obj.cluster, self.run_as(obj))

    def owned(self, obj: Tracked, found: list[SlurmJob]) -> list[SlurmJob]:
        """The Slurm jobs carrying the object's tag that run as its account. Tags are
        visible to every user in squeue; a job another account submitted with the same
        name is not ours to adopt (or to count as a duplicate). A job whose user Slurm did
        not report is kept: never miss our own job (exactly once) for want of a name."""
        account = self.run_as(obj) or obj.cluster.ssh_user
        return [job for job in found if not job.user or job.user == account]

    def record(
        self,
        obj: Tracked,
        kind: RunEventKind,
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

    def declined(self, obj: Tracked, stop: WontSubmit) -> None:
        """``prepare`` found the object cannot run; nothing was sent to Slurm."""
        self.refused(obj, stop.reason)

    def refused(self, obj: Tracked, reason: str) -> None:
        """Slurm refused the job (a permanent error): end the object, saying why."""
        raise NotImplementedError

    def gave_up(self, obj: Tracked, reason: str) -> None:
        """Retries of a transient error ran out while submitting."""
        raise NotImplementedError

    def lost(self, obj: Tracked, message: str, now: datetime) -> bool:
        """Neither squeue nor sacct knows the Slurm job any more; True if a change applied."""
        raise NotImplementedError

    def finished(self, obj: Tracked, record: SlurmJob, now: datetime) -> bool:
        """The Slurm job ended (``record``: accounting's, or one built from the queue and
        the run directory's exit record); True if a change applied. Files it reads are
        read as the object's account (``transport_of``)."""
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

    def cancel_was_requested(self, obj: Tracked) -> bool:
        """Whether someone asked to cancel the object (a signal then means cancelled)."""
        return False

    def request_recorded(self, obj: Tracked, action: str, *, by: str) -> None:
        """Someone asked for ``action`` (cancel, hold, release); a worker carries it out."""
        self.record(obj, RunEventKind(action), message=f"{action} requested by {by}")

    def request_carried_out(self, obj: Tracked, action: str, *, by: str) -> None:
        """The worker sent the command for ``action`` as the object's account."""
        if action == RunEventKind.CANCEL:
            self.cancel_requested(obj, by=by)
        else:
            verb = "held" if action == RunEventKind.HOLD else "released"
            self.record(obj, RunEventKind(action), message=f"{verb} by {by}")

    def request_failed(self, obj: Tracked, action: str, *, reason: str) -> None:
        """The command for ``action`` failed for good: say so on the object's own page."""
        self.record(obj, RunEventKind(action), message=f"could not {action}: {reason}")

    # ---------------------------------------------------------------- the primitive

    def transition(self, obj: Tracked, to_state: str, *, message: str = "", **values: Any) -> bool:
        """Move ``obj`` from the state it was read in to ``to_state``; False if someone
        else moved it first (then nothing is written)."""
        from_state = obj.state
        # Nothing got updated: another worker got there first.
        if not self.model.objects.filter(id=obj.id, state=from_state).update(
            state=to_state, **values
        ):
            return False
        self.record(
            obj, RunEventKind.STATE, from_state=from_state, to_state=to_state, message=message
        )
        # The line a quiet console (make run) prints for every state change.
        suffix = f" ({message})" if message else ""
        logger.info("%s %s: %s -> %s%s", self.noun, obj.id, from_state, to_state, suffix)
        obj.state = to_state
        for key, value in values.items():
            setattr(obj, key, value)
        return True

    def enqueue_submit(self, object_id: str) -> None:
        # Redis down: the watcher re-enqueues queued objects (requeue_stalled).
        task_send(self.submit_task, object_id)

    def is_final(self, obj: Tracked) -> bool:
        return obj.state in self.model.FINAL_STATES
