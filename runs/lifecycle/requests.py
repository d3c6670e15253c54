"""Requests to act on a tracked object's Slurm job (cancel, hold, release), for every kind.

No command runs as a researcher inside a web request: their login files (``~/.ssh/rc``,
the shell's start-up files) run before any command, and one that sleeps or floods would
hold a web thread. The web request records the request (``runs.models.SlurmRequest``: one
open request per object and action, a conditional insert), writes it on the object's
timeline and in the audit log, and enqueues the worker task by name after commit. The task
(``carry_out``) runs the command as the object's account; a failure for good (a refused
login, a login that floods, Slurm refusing) closes the request and says why on that
object's own timeline, nowhere else. A request whose task was lost (Redis restarted, the
worker killed) stays open and is enqueued again by the watcher (``resend_requests``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from controlplane.tasknames import SLURM_REQUEST_CARRY_OUT, task_send
from nodes.models import Cluster
from nodes.services import cluster_reconcile_soon
from runs.lifecycle.kind import Tracked, lifecycle_of
from runs.lifecycle.submit import Submission
from runs.models import SlurmRequest
from slurm import errors as slurm_errors
from slurm.errors import describe_cluster_error

logger = logging.getLogger(__name__)

Action = SlurmRequest.Action
Status = SlurmRequest.Status

# The request task's limits (``runs.tasks``): one command, its connect and command
# timeouts (SSH_CONNECT_TIMEOUT + SSH_COMMAND_TIMEOUT by default) and a margin.
REQUEST_TASK_SOFT_TIME_LIMIT = 80
REQUEST_TASK_TIME_LIMIT = 90
# An open request not enqueued (or tried) for this long lost its task: the watcher sends
# it again. Above the task's time limit, so an attempt still running is not doubled.
RESEND_AFTER_SECONDS = 2 * REQUEST_TASK_TIME_LIMIT
# Attempts (task runs, retries and resends together) before a request fails for good: a
# login that always times out ends with the reason instead of retrying forever.
MAX_ATTEMPTS = 8
_OPPOSITE = {Action.HOLD: Action.RELEASE, Action.RELEASE: Action.HOLD}


def request_enqueue(request_id: int) -> None:
    # Redis down: the request stays open and the watcher sends it again (resend_requests).
    task_send(SLURM_REQUEST_CARRY_OUT, request_id)


def is_transient(error: slurm_errors.SlurmError) -> bool:
    """Worth retrying: a named transient error whose instance says so (an output over the
    cap is an ``SshOutcomeUnknown`` that is not: the same login floods again)."""
    return isinstance(error, slurm_errors.TRANSIENT_ERRORS) and error.transient


class Requesting(Submission[Tracked]):
    def request_open(self, obj: Tracked, action: str, *, by: str) -> SlurmRequest | None:
        """Record ``action`` for ``obj``'s Slurm job, to be carried out after commit; None
        when the same request is open already (asking twice is asking once). Call inside
        the caller's transaction; the task is enqueued when it commits."""
        now = timezone.now()
        requests = SlurmRequest.objects.filter(kind=self.label, object_id=str(obj.id))
        opposite = _OPPOSITE.get(Action(action))
        if opposite is not None:
            # The newer of a hold and a release wins: the older is not sent any more.
            requests.filter(status=Status.OPEN, action=opposite).update(
                status=Status.SUPERSEDED, outcome=f"superseded by a {action}", finished_at=now
            )
        try:
            # A savepoint: the unique constraint refusing a second open one leaves the
            # caller's transaction usable.
            with transaction.atomic():
                request = SlurmRequest.objects.create(
                    kind=self.label,
                    object_id=str(obj.id),
                    cluster_id=obj.cluster_id,
                    slurm_job_id=obj.slurm_job_id,
                    action=action,
                    requested_by=by[:150],
                    enqueued_at=now,
                )
        except IntegrityError:
            return None
        self.request_recorded(obj, action, by=by)
        request_id = request.id
        transaction.on_commit(lambda: request_enqueue(request_id))
        return request

    def cancel_request(self, obj: Tracked, *, by: str, audit: Callable[[Tracked], None]) -> str:
        """Ask to cancel ``obj`` (a person clicked); idempotent, runs no command. A final
        object is left as it is; one without a Slurm job ends at once (a Slurm job that
        lands later with its tag is cancelled by the submit path or the watcher); for one
        Slurm has, the request is recorded and a worker sends ``scancel`` as its account.
        ``audit(obj)`` is called in the transaction that records the change."""
        settled = self.cancel_settled_before_slurm(obj, by=by, audit=audit)
        if settled is not None:
            return settled
        with transaction.atomic():
            if self.request_open(obj, Action.CANCEL, by=by) is None:
                return "cancel requested already"
            audit(obj)
        return "cancel requested"

    # ---------------------------------------------------------------- the worker's part

    def carry_out(self, request: SlurmRequest) -> str:
        """Send the command of an open request as the object's account; returns what
        happened. Safe to re-run: scancel, hold and release change nothing the second time,
        and the request is closed (and the timeline written) by one conditional update.
        A transient error is raised (the task retries; the request stays open)."""
        obj = self.for_submit().filter(id=request.object_id).first()
        if obj is None or self.is_final(obj):
            state = "gone" if obj is None else obj.state
            return self._close(request, Status.DONE, f"nothing to do: it is {state}") or "closed"
        if request.action != Action.CANCEL and obj.state != self.PENDING:
            return self._fail(obj, request, f"it is {obj.state}, no longer pending in Slurm")
        if request.attempts > MAX_ATTEMPTS:
            reason = f"{request.outcome or 'no answer'} (gave up after {MAX_ATTEMPTS} attempts)"
            return self._fail(obj, request, reason)
        client = self.client_of(obj)
        try:
            if request.action == Action.CANCEL:
                client.cancel(request.slurm_job_id)
            elif request.action == Action.HOLD:
                client.hold(request.slurm_job_id)
            else:
                client.release(request.slurm_job_id)
        except slurm_errors.SlurmError as error:
            reason = describe_cluster_error(error)
            if is_transient(error):
                SlurmRequest.objects.filter(id=request.id, status=Status.OPEN).update(
                    outcome=f"retrying: {reason}"[:1024]
                )
                raise
            return self._fail(obj, request, reason)
        with transaction.atomic():
            if self._close(request, Status.DONE, f"sent as {self.run_as(obj) or 'the service'}"):
                self.request_carried_out(obj, request.action, by=request.requested_by)
        cluster_reconcile_soon(cluster_id=obj.cluster_id)
        return f"{request.action} sent for Slurm job {request.slurm_job_id}"

    def gave_up_on(self, request: SlurmRequest, error: BaseException) -> str:
        """The task's retries of a transient error ran out: the request fails, saying why."""
        obj = self.for_submit().filter(id=request.object_id).first()
        reason = describe_cluster_error(error)
        if obj is None:
            return self._close(request, Status.FAILED, reason) or "closed"
        return self._fail(obj, request, reason)

    def _fail(self, obj: Tracked, request: SlurmRequest, reason: str) -> str:
        with transaction.atomic():
            closed = self._close(request, Status.FAILED, reason)
            if closed:
                self.request_failed(obj, request.action, reason=reason)
        logger.warning("%s %s: could not %s: %s", self.noun, obj.id, request.action, reason)
        return f"could not {request.action}: {reason}"

    def _close(self, request: SlurmRequest, status: str, outcome: str) -> str:
        """Close an open request once; "" when someone else closed it first."""
        # Nothing got updated: another worker (a resend) got there first.
        if not SlurmRequest.objects.filter(id=request.id, status=Status.OPEN).update(
            status=status, outcome=outcome[:1024], finished_at=timezone.now()
        ):
            return ""
        return outcome

    # ---------------------------------------------------------------- the watcher's part

    def resend_requests(self, cluster: Cluster, now: datetime) -> int:
        """Open requests whose task was lost (not enqueued or tried for
        ``RESEND_AFTER_SECONDS``) are enqueued again; returns how many."""
        stale = now - timedelta(seconds=RESEND_AFTER_SECONDS)
        lost = SlurmRequest.objects.filter(
            cluster=cluster, kind=self.label, status=Status.OPEN, enqueued_at__lt=stale
        )
        resent = 0
        for request_id in lost.values_list("id", flat=True)[:100]:
            # Touched first, so the next cycle does not send it again while it travels.
            if SlurmRequest.objects.filter(id=request_id, enqueued_at__lt=stale).update(
                enqueued_at=now
            ):
                request_enqueue(request_id)
                resent += 1
        return resent

    def requeue_stalled(self, cluster: Cluster, now: datetime) -> int:
        """Stalled submissions (``Submission.requeue_stalled``) and lost requests."""
        return super().requeue_stalled(cluster, now) + self.resend_requests(cluster, now)


def request_attempt(request_id: int) -> SlurmRequest | None:
    """The open request ``request_id``, its attempt counted and its clock touched (the
    watcher does not send it again while this attempt runs); None when it is closed."""
    if not SlurmRequest.objects.filter(id=request_id, status=Status.OPEN).update(
        attempts=F("attempts") + 1, enqueued_at=timezone.now()
    ):
        return None
    return SlurmRequest.objects.get(id=request_id)


def slurm_request_carry_out(*, request_id: int) -> str:
    """The task's work: carry out one open request as its object's account (see
    ``Requesting.carry_out``). Accepts open requests only; a closed one is left as it is,
    so a redelivered or resent task does nothing twice."""
    request = request_attempt(request_id)
    if request is None:
        return "nothing to do: carried out, superseded or failed already"
    lifecycle = lifecycle_of(request.kind)
    assert isinstance(lifecycle, Requesting)
    return lifecycle.carry_out(request)


def slurm_request_gave_up(*, request_id: int, error: BaseException) -> str:
    request = SlurmRequest.objects.filter(id=request_id, status=Status.OPEN).first()
    if request is None:
        return "nothing to do"
    lifecycle = lifecycle_of(request.kind)
    assert isinstance(lifecycle, Requesting)
    return lifecycle.gave_up_on(request, error)
