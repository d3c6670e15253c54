"""What the watcher does for every kind each cycle: apply Slurm's view (states, final
records, lost jobs), resolve ``submit_unknown`` (adopt by tag, or prove absence and submit
again), and cancel any extra Slurm job carrying a tag that already has one."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q

from nodes.models import Cluster
from runs.events import RunEventKind
from runs.lifecycle.kind import Tracked
from runs.lifecycle.phases import Phase, is_final_phase, slurm_phase
from runs.lifecycle.requests import Requesting
from runs.lifecycle.views import ACCOUNTING_NONE, SlurmViews
from runs.rundir import RunDirectory
from slurm import commands as slurm_commands
from slurm import errors as slurm_errors
from slurm.client import SlurmClient, TagLookup
from slurm.parsers import SlurmJob

logger = logging.getLogger(__name__)


def record_from_exit(
    slurm_job_id: str, queued: SlurmJob | None, exit_record: dict[str, Any]
) -> SlurmJob:
    """A final record built without accounting: squeue's final state when it still shows
    the job, else what the batch script wrote when it ended (exit code, signal)."""
    code = exit_record.get("exit_code")
    exit_code = int(code) if isinstance(code, int) else None
    signal = exit_record.get("signal")
    # Whose word the state is: squeue's own final state (CANCELLED, PREEMPTED, TIMEOUT are
    # Slurm's, never refined), or what the exit record lets Gantry infer.
    source = "exit-record"
    if queued is not None and is_final_phase(queued.state):
        state = queued.state
        source = "squeue+exit-record"
    elif signal:
        state = "CANCELLED"  # refined by the caller: a signal without a cancel is a timeout
    else:
        state = "COMPLETED" if exit_code == 0 else "FAILED"
    return SlurmJob(
        job_id=slurm_job_id,
        state=state,
        exit_code=exit_code,
        reason=f"stopped by SIG{signal}" if signal else None,
        start_time=queued.start_time if queued else None,
        end_time=queued.end_time if queued else None,
        node_list_expr=queued.node_list_expr if queued else "",
        source=source,
    )


class Watching(Requesting[Tracked]):
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

    # ---------------------------------------------------------------- by tag

    def at_risk(self, cluster: Cluster, now: datetime) -> list[Tracked]:
        """Objects whose tag the watcher looks up: those whose sbatch outcome is unknown,
        and those an sbatch went out for recently (a late duplicate could still land)."""
        recent = now - timedelta(seconds=settings.DUPLICATE_WATCH_SECONDS)
        return list(
            self.for_submit()
            .filter(cluster=cluster)
            .filter(Q(state=self.SUBMIT_UNKNOWN) | Q(sbatch_sent_at__gte=recent))
        )

    def resolve_by_tag(
        self,
        objects: Sequence[Tracked],
        lookup: TagLookup,
        evidence: dict[str, RunDirectory],
        client: SlurmClient,
        now: datetime,
    ) -> int:
        """Adopt or prove absent what is ``submit_unknown``; cancel extra Slurm jobs."""
        changes = 0
        for obj in objects:
            found = self.owned(obj, lookup.found.get(slurm_commands.job_tag(obj.id), []))
            try:
                if obj.state == self.SUBMIT_UNKNOWN:
                    changes += self._resolve_unknown(obj, found, lookup, evidence, client, now)
                else:
                    self._cancel_extra(obj, found, client)
            except slurm_errors.SlurmError:
                raise
            except Exception:
                logger.exception("%s %s: resolving by tag failed", self.noun, obj.id)
        return changes

    def _resolve_unknown(
        self,
        obj: Tracked,
        found: list[SlurmJob],
        lookup: TagLookup,
        evidence: dict[str, RunDirectory],
        client: SlurmClient,
        now: datetime,
    ) -> int:
        if found:
            return int(self.adopt(obj, found, client=client))
        sent = obj.sbatch_sent_at or obj.updated_at
        waited = (now - sent).total_seconds()
        if waited < settings.SUBMIT_UNKNOWN_GRACE_SECONDS:
            return 0
        # None: its run directory could not be read (no proof may rest on that).
        listed = evidence.get(self.run_directory(obj))
        if lookup.accounting_ok:
            proof = "neither squeue nor sacct knows a Slurm job with its tag"
        elif (
            obj.cluster.accounting_available is False and listed is not None and not listed.outputs
        ):
            # No accounting on this cluster: a Slurm job that ran wrote its output file.
            proof = "squeue knows no Slurm job with its tag and none wrote output in its directory"
        else:
            # Accounting is down: absence cannot be proven now; wait.
            return 0
        if not self.transition(
            obj,
            self.QUEUED,
            message=f"{proof} {int(waited)} s after the sbatch: it never reached Slurm; "
            "submitting again",
            sbatch_sent_at=None,
        ):
            return 0
        self.enqueue_submit(str(obj.id))
        return 1

    def _cancel_extra(self, obj: Tracked, found: list[SlurmJob], client: SlurmClient) -> None:
        """Defence in depth: a Slurm job carrying the tag but not the one the object has
        (a duplicate), or carrying the tag of an object that ended without one (an orphan),
        is cancelled and recorded."""
        kept = obj.slurm_job_id
        if not kept and not self.is_final(obj):
            return  # not submitted yet (queued again) or being submitted
        for slurm_job in found:
            if slurm_job.job_id != kept:
                self.cancel_duplicate(obj, slurm_job, client=client, kept=kept)

    # ---------------------------------------------------------------- by Slurm job id

    def apply_views(
        self,
        objects: Sequence[Tracked],
        views: SlurmViews,
        now: datetime,
        errors: list[str],
    ) -> int:
        """Apply what Slurm says to each object; returns the number of changes.

        One object's bad data never stops the others: its error is logged and listed. So
        does a failure to read one object's files as its account (a refused login of one
        user never stops the watcher for the others); that object is tried next cycle.
        """
        changes = 0
        seen: list[Any] = []
        for obj in objects:
            try:
                changes += self._apply_view(obj, views, now, seen)
            except slurm_errors.SlurmError as error:
                logger.warning("%s %s: reading its files failed: %s", self.noun, obj.id, error)
                errors.append(f"{self.noun} {obj.id}: {error}")
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
                return int(self.finished(obj, record, now))
        # Without accounting, or (kinds that finish early) before sacct has caught up.
        exit_record = views.exits.get(obj.slurm_job_id)
        if exit_record is not None:
            built = self._refine(obj, record_from_exit(obj.slurm_job_id, queued, exit_record))
            return int(self.finished(obj, built, now))
        if record is not None:
            return self._apply_active(obj, record)
        if queued is None and obj.slurm_job_id in views.unlisted and not views.accounting_ok:
            # Without sacct the run directory is the only record of how it ended, and it
            # could not be listed this cycle: unknown, never lost.
            return 0
        if queued is None and (views.accounting_ok or views.accounting == ACCOUNTING_NONE):
            return self._maybe_lost(obj, now)
        # Final in squeue but not yet in sacct (it lags), or accounting is down: wait.
        return 0

    def _refine(self, obj: Tracked, record: SlurmJob) -> SlurmJob:
        """A job stopped by a signal with nobody asking to cancel it ran out of time (only
        where the state is inferred: squeue's CANCELLED is someone's scancel, kept)."""
        if record.source == "exit-record" and record.state == "CANCELLED":
            if not self.cancel_was_requested(obj):
                record = dataclasses.replace(record, state="TIMEOUT")
        return record

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
                    obj,
                    RunEventKind.REASON,
                    from_state=state,
                    to_state=state,
                    message=values["state_reason"],
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
