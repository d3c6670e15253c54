"""Submitting exactly once, cancelling, requeueing a submit task that went missing.

Exactly once: the submit task claims the object (a conditional update with a lease),
looks its tag up in squeue and sacct and adopts a Slurm job it finds; otherwise it writes
the files, records *before* sending that an sbatch is going out, and sends it. When the
answer does not come back (a timeout, a dropped link, a controller that timed out) the
outcome is unknown: the object goes to ``submit_unknown`` and no second sbatch is sent
until the watcher finds the tag (adopt) or proves it absent (``runs.lifecycle.watch``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from core.errors import ApplicationError, ConflictError
from core.faults import faultpoint
from nodes.access.cluster import slurm_client_for
from nodes.models import Cluster
from nodes.services import cluster_reconcile_soon
from runs.events import RunEventKind
from runs.lifecycle.kind import SlurmKind, Tracked, WontSubmit
from runs.lifecycle.phases import Phase, slurm_phase
from slurm import commands as slurm_commands
from slurm import errors as slurm_errors
from slurm.client import SlurmClient
from slurm.errors import SlurmParseError, describe_cluster_error
from slurm.parsers import SlurmJob

logger = logging.getLogger(__name__)

# sbatch errors after which Slurm may or may not hold the job: the command was sent and
# its answer was lost, the controller timed out answering (it may have queued the job), or
# sbatch exited 0 (the exit status is checked before the output is read) with an answer we
# cannot read: Slurm most likely queued it, under an id we do not know.
OUTCOME_UNKNOWN_ERRORS = (
    slurm_errors.SshOutcomeUnknown,
    slurm_errors.SlurmControllerUnavailable,
    slurm_errors.SlurmParseError,
)
# Logging in as the object's account failed for good (the login node does not trust the CA,
# the account does not exist there, no credential): the object cannot run until a person
# fixes that, and it says so instead of waiting. Failures that pass (the name server did not
# answer, the CA key could not be read just now) are ``SshTransientError``s, not these: the
# task retries them with back-off.
IDENTITY_ERRORS = (slurm_errors.SshAuthenticationError, slurm_errors.SshConfigurationError)


def slurm_error_as_application_error(what: str, error: slurm_errors.SlurmError) -> ApplicationError:
    """A cluster error a person caused by clicking: 503 when retrying may help, else 502."""
    return ApplicationError(
        f"{what}: {describe_cluster_error(error)}", status_code=503 if error.transient else 502
    )


class Submission(SlurmKind[Tracked]):
    def submit_exactly_once(self, object_id: str) -> str:
        """Claim a queued object for submission, then submit it; returns what happened.

        Accepts ``queued``, and ``submitting`` whose lease ran out (the worker that held it
        died). The claim is a conditional update with a fresh lease. A transient error before
        the sbatch was sent gives the lease back at once, so the task's own retry can claim
        it again; a permanent one ends the object with the reason. Safe to re-run because
        the submit looks the tag up before any ``sbatch`` and never sends a second one while
        an earlier one's outcome is unknown.
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
            if not self._ended_before_sbatch(object_id, error):
                raise
            return f"not submitted: {describe_cluster_error(error)}"

    def _ended_before_sbatch(self, object_id: str, error: slurm_errors.SlurmError) -> bool:
        """A permanent error before any sbatch went out (a refused host key, Slurm missing,
        run files Gantry may not write): retried when the lease ran out, it failed the same
        way every time, silently. End the object saying why; False if it is no longer
        ``submitting`` without an sbatch sent (adopted, cancelled, sent meanwhile)."""
        obj = (
            self.for_submit()
            .filter(id=object_id, state=self.SUBMITTING, sbatch_sent_at__isnull=True)
            .first()
        )
        if obj is None:
            return False
        reason = (
            f"Gantry could not submit the {self.noun} to {obj.cluster.name}: "
            f"{describe_cluster_error(error)}"
        )
        if isinstance(error, slurm_errors.HostKeyError):
            # The cluster's own host key, not this object: every object of the cluster
            # would fail alike. It waits, saying why, until an operator re-pins the key.
            self.gave_up(obj, reason)
        else:
            self.refused(obj, reason)
        return True

    def _submit_claimed(self, object_id: str) -> str:
        faultpoint(f"{self.faultpoint_prefix}.after_claim")
        obj = self.for_submit().get(id=object_id)
        self.claimed(obj)
        # The tag lookup sees every user's jobs: the service account (Slurm operator).
        client = slurm_client_for(obj.cluster)
        tag = slurm_commands.job_tag(obj.id)
        existing = self.owned(
            obj, client.find_jobs_by_tag(tag, since=obj.created_at - timedelta(minutes=5))
        )
        if existing:
            self.adopt(obj, existing, client=client)
            return f"adopted Slurm job {existing[0].job_id}"
        if obj.sbatch_sent_at is not None:
            # An earlier attempt sent sbatch and nobody saw its answer (the worker died):
            # Slurm may still be about to queue it. Only the watcher may decide it is absent.
            self.outcome_unknown(obj, "an earlier sbatch was sent and its answer never came back")
            return "outcome of an earlier sbatch unknown; the watcher will resolve it"
        # Everything else runs as the object's account: its files, its sbatch.
        try:
            transport = self.transport_of(obj)
            if self.run_as(obj):
                transport.connect()
        except IDENTITY_ERRORS as error:
            return self._login_refused(obj, error)
        try:
            script_path = self.prepare(obj, transport)
        except WontSubmit as stop:
            self.declined(obj, stop)
            return f"not submitted: {stop.reason}"
        faultpoint(f"{self.faultpoint_prefix}.before_sbatch")
        return self._send_sbatch(obj, self.client_of(obj), script_path, tag)

    def _send_sbatch(self, obj: Tracked, client: SlurmClient, script_path: str, tag: str) -> str:
        sent_at = timezone.now()
        # Written before the command goes out, and only while this attempt still holds the
        # claim (another worker may have taken over an expired lease): a crash after this
        # never sends a second one, and two workers never both send.
        if not self.model.objects.filter(
            id=obj.id,
            state=self.SUBMITTING,
            submit_attempts=obj.submit_attempts,
            sbatch_sent_at__isnull=True,
        ).update(sbatch_sent_at=sent_at):
            return "no longer this attempt's to send (taken over, cancelled or sent)"
        obj.sbatch_sent_at = sent_at
        try:
            slurm_id = client.submit(script_path, tag=tag)
        except OUTCOME_UNKNOWN_ERRORS as error:
            answer = "no readable answer" if isinstance(error, SlurmParseError) else "no answer"
            self.outcome_unknown(obj, f"sbatch sent, {answer}: {describe_cluster_error(error)}")
            return "sbatch outcome unknown; the watcher will find the job by its tag"
        except slurm_errors.SlurmCommandError as error:
            self.refused(obj, f"Slurm refused the {self.noun}: {error.stderr.strip() or error}")
            return "refused by Slurm"
        except slurm_errors.SlurmError:
            # Never sent (no connection, no channel): safe to try again, or, for a permanent
            # error (the login refused while reconnecting), to end it (submit_exactly_once).
            self.model.objects.filter(id=obj.id, sbatch_sent_at=sent_at).update(sbatch_sent_at=None)
            raise
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
        cluster_reconcile_soon(cluster_id=obj.cluster_id)
        return f"submitted as Slurm job {slurm_id}"

    def _login_refused(self, obj: Tracked, error: slurm_errors.SlurmError) -> str:
        """Logging in as the object's account failed for good: end it, saying why."""
        reason = (
            f"Gantry could not log in to {obj.cluster.name} as "
            f"{self.run_as(obj) or obj.cluster.ssh_user}: "
            f"{describe_cluster_error(error)}"
        )
        self.refused(obj, reason)
        return f"not submitted: {reason}"

    def outcome_unknown(self, obj: Tracked, reason: str) -> bool:
        """sbatch may or may not have queued the job: wait for the watcher to find the tag
        or prove it absent. Never followed by a second sbatch before that."""
        obj.state = self.SUBMITTING
        changed = self.transition(
            obj,
            self.SUBMIT_UNKNOWN,
            message=f"{reason}; looking for the job by its tag before anything else is sent",
            submit_lease_until=None,
        )
        cluster_reconcile_soon(cluster_id=obj.cluster_id)
        return changed

    def _cancel_if_cancelled_meanwhile(
        self, obj: Tracked, client: SlurmClient, slurm_id: str
    ) -> None:
        """Cancelled while we submitted: do not leave a Slurm job nobody tracks."""
        current = self.model.objects.get(id=obj.id)
        if current.state == self.CANCELLED:
            client.cancel(slurm_id)
            self.model.objects.filter(id=obj.id).update(slurm_job_id=slurm_id)
            self.record(
                obj,
                RunEventKind.CANCEL,
                message=f"cancelled Slurm job {slurm_id} submitted meanwhile",
            )

    def adopt(self, obj: Tracked, found: list[SlurmJob], *, client: SlurmClient) -> bool:
        """Take over the oldest Slurm job carrying the object's tag instead of submitting
        again; any other one is a duplicate and is cancelled."""
        chosen, duplicates = found[0], found[1:]
        phase = slurm_phase(chosen.state) or Phase.PENDING
        # Leave final states to the watcher, which reads exit codes from accounting.
        state = self.PENDING if phase in Phase.FINAL else self.state_for(phase)
        now = timezone.now()
        adopted = self.transition(
            obj,
            state,
            message=f"found Slurm job {chosen.job_id} by its tag; adopted it",
            slurm_job_id=chosen.job_id,
            submitted_at=chosen.submit_time or now,
            last_seen_in_slurm_at=now,
            submit_lease_until=None,
        )
        if not adopted:
            self._cancel_if_cancelled_meanwhile(obj, client, chosen.job_id)
        for duplicate in duplicates:
            self.cancel_duplicate(obj, duplicate, client=client, kept=chosen.job_id)
        return adopted

    def cancel_duplicate(
        self, obj: Tracked, duplicate: SlurmJob, *, client: SlurmClient, kept: str
    ) -> None:
        """A second Slurm job carrying the object's tag: cancel it, say so on the timeline."""
        if duplicate.job_id == kept or slurm_phase(duplicate.state) in Phase.FINAL:
            return
        client.cancel(duplicate.job_id)
        logger.error("%s %s: cancelled duplicate Slurm job %s", self.noun, obj.id, duplicate.job_id)
        self.record(
            obj,
            RunEventKind.DUPLICATE,
            message=f"cancelled Slurm job {duplicate.job_id}: it carries this {self.noun}'s tag, "
            f"which Slurm job {kept or '(none: this one ended)'} already has",
        )

    def submit_gave_up(self, object_id: str, error: BaseException) -> None:
        """Retries ran out on a transient error (the cluster may be down for a while)."""
        obj = self.model.objects.filter(id=object_id, state=self.SUBMITTING).first()
        if obj is not None:
            self.gave_up(obj, describe_cluster_error(error))

    def cancel_before_slurm(
        self, obj: Tracked, *, by: str, audit: Callable[[Tracked], None]
    ) -> bool:
        """End an object Slurm has no job for yet (no command runs); False if someone
        moved it first (then the caller reads it again)."""
        with transaction.atomic():
            if not self.transition(
                obj,
                self.CANCELLED,
                message=f"cancelled by {by} before reaching Slurm",
                **self.ended_values(timezone.now()),
            ):
                return False
            audit(obj)
        return True

    def cancel_settled_before_slurm(
        self, obj: Tracked, *, by: str, audit: Callable[[Tracked], None]
    ) -> str | None:
        """What a cancel comes to before any command: "already <state>" for a final object,
        "cancelled" for one that never reached Slurm (ended here, audited); None once Slurm
        has its job (``obj.slurm_job_id`` set). An object being submitted right now is a
        conflict: its sbatch may be on its way."""
        for _ in range(3):
            obj.refresh_from_db()
            if self.is_final(obj):
                return f"already {obj.state}"
            if obj.slurm_job_id:
                return None
            if self.cancel_before_slurm(obj, by=by, audit=audit):
                return "cancelled"
        if not obj.slurm_job_id:
            raise ConflictError(
                f"The {self.noun} is being submitted right now; try again in a moment."
            )
        return None

    def cancel(self, obj: Tracked, *, by: str, audit: Callable[[Tracked], None]) -> str:
        """Cancel ``obj`` now, from a worker (recovery, acceptance): ``scancel`` runs in the
        caller as the object's account. A person's cancel is a request instead
        (``runs.lifecycle.requests``: no command runs inside a web request). Idempotent;
        ``audit(obj)`` is called in the same transaction as the change it records. Accepts
        any state; a final object is left as it is. An object without a Slurm job ends at
        once (a Slurm job that lands later with its tag is cancelled by the watcher)."""
        settled = self.cancel_settled_before_slurm(obj, by=by, audit=audit)
        if settled is not None:
            return settled
        try:
            # As the object's account, whoever asked: the audit event names the actor.
            self.client_of(obj).cancel(obj.slurm_job_id)
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
