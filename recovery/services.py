"""Recovery on proof: an incident is opened on positive evidence (``recovery.detect``), what
is left of the job is cancelled, and the lineage resumes from the newest checkpoint that is
*proven* to restore. A newer checkpoint that is not proven yet is drilled first and used
only if its drill passes; one whose drill fails is skipped. Recovery stops (the incident is
held, with the reason in words) when the lineage's attempts or GPU-hour budget are spent,
or when two attempts in a row would resume from the same step on the same nodes.

Every step is a conditional update on the incident's outcome, so two watchers advancing the
same cluster act once; every step is safe to re-run (the resume is a job with its own
exactly-once submission).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.audit import AuditAction, audit_event_record
from core.errors import ApplicationError
from jobs.goodput.ledger import job_gpus
from jobs.lifecycle import JOBS, job_event
from jobs.models import Job, JobEvent, MetricPoint
from jobs.recovery_settings import OnHang, RecoverySettings
from jobs.stragglers import STRAGGLER_MARGIN, stragglers
from nodes.models import Cluster, Node
from nodes.tasks import cluster_sync_task
from recovery.detect import (
    SPIKE_PERSIST,
    SPIKE_WINDOW,
    HangBudget,
    crashed_jobs,
    diverged_jobs,
    policy_for,
    signal_of,
    spiked_jobs,
)
from recovery.evidence import crash_suspects, hang_suspects, node_is_faulty
from recovery.incidents import incident_move, job_recovery_settings, lineage_root
from recovery.models import Incident, JobProgress, RecoveryPolicy, SuspectNode
from recovery.resume import resume_on_proof
from recovery.steps import deadline_passed, past_deadline, step_begin, step_end, step_of
from runs.rundir import RunDirectory
from slurm.hostlist import expand

logger = logging.getLogger(__name__)

# Node states that say a node itself is at fault (the inventory's view of Slurm's).
# A node failure, and a hang nobody was named for (a dead node's ranks stop beating with
# it, and its slurmd may not have been declared dead yet).
_NODE_VIEW_SIGNALS = frozenset({Incident.Signal.NODE_FAILURE, Incident.Signal.HANG})
# Endings that are no evidence against any node: a preemption (the scheduler's choice) and
# the time limit (srun's lines then only say which tasks Slurm stopped).
NO_NODE_EVIDENCE = frozenset({Incident.Signal.PREEMPTED, Incident.Signal.TIMEOUT})


def _open(
    job: Job,
    *,
    signal: str,
    stopped_at: datetime,
    now: datetime,
    detail: str,
    evidence: dict[str, Any],
    outcome: str = Incident.Outcome.OPEN,
    reason: str = "",
    named: list[tuple[str, str]] | None = None,
) -> Incident | None:
    """The incident of ``job``, once (the unique constraint makes a second one a no-op)."""
    root = lineage_root(job)
    with transaction.atomic():
        incident, created = Incident.objects.get_or_create(
            job=job,
            defaults={
                "lineage_root": root,
                "cluster": job.cluster,
                "signal": signal,
                "stopped_at": stopped_at,
                "detected_at": now,
                "detail": detail[:4000],
                "evidence": evidence,
                "outcome": outcome,
                "reason": reason,
                "closed_at": None if outcome in Incident.ACTIVE_OUTCOMES else now,
            },
        )
        if not created:
            return None
        found: list[tuple[Node | str, str]] = [*_suspects(job, signal), *(named or [])]
        _name_suspects(incident, job, found)
        job_event(job, JobEvent.Kind.INCIDENT, message=f"incident: {detail}"[:4000])
    logger.warning("job %s: incident opened (%s): %s", job.id, signal, detail)
    return incident


def _suspects(job: Job, signal: str) -> list[tuple[Node, str]]:
    """Nodes of the job's allocation the evidence points at: on a node failure (or a hang),
    those the inventory shows down, drained, failing or not responding. Nothing is named
    without such evidence."""
    if signal not in _NODE_VIEW_SIGNALS or not job.allocated_nodes:
        return []
    try:
        names = expand(job.allocated_nodes)
    except ValueError:
        return []
    what = (
        f"Slurm ended job {job.slurm_job_id} with NODE_FAIL"
        if signal == Incident.Signal.NODE_FAILURE
        else f"job {job.slurm_job_id} stopped making progress"
    )
    return [(node, f"{what}; {node.name} was {state}") for node, state in _faulty_nodes(job, names)]


def _faulty_nodes(job: Job, names: list[str]) -> list[tuple[Node, str]]:
    """The nodes of ``names`` (of the job's cluster) the inventory shows down, drained,
    failing or not responding, with that state in words."""
    found = []
    for node in Node.objects.filter(cluster=job.cluster, name__in=names):
        flags = {str(flag).lower() for flag in (node.state_flags or [])}
        if node_is_faulty(state=node.state, flags=flags):
            found.append(
                (node, f"{node.state}{' (' + ', '.join(sorted(flags)) + ')' if flags else ''}")
            )
    return found


def crashes_open(
    *, cluster: Cluster, now: datetime, listed: dict[Any, RunDirectory] | None = None
) -> int:
    """An incident for each job that just ended in a failure of its own; ``listed``, the
    run directories this cycle's listing reached, by job (the evidence of which rank)."""
    opened = 0
    policy = policy_for(cluster)
    for job in crashed_jobs(cluster, now):
        settings = job_recovery_settings(job, policy)
        signal = signal_of(job)
        detail = (
            f"Slurm ended job {job.slurm_job_id} {job.state}"
            f"{' (' + job.state_reason + ')' if job.state_reason else ''}, exit code "
            f"{job.exit_code}, at step {job.last_step if job.last_step is not None else '—'}"
        )
        if signal == Incident.Signal.PREEMPTED:
            detail = (
                f"Slurm preempted job {job.slurm_job_id} at step "
                f"{job.last_step if job.last_step is not None else '—'}; it is not requeued "
                "(Gantry submits with --no-requeue): recovery resumes it, and no node is "
                "suspected (a preemption is the scheduler's choice, not a fault)"
            )
        evidence = {
            "state": job.state,
            "exit_code": job.exit_code,
            "reason": job.state_reason,
            "last_step": job.last_step,
            "nodes": job.allocated_nodes,
        }
        outcome, reason = Incident.Outcome.OPEN, ""
        if not settings.enabled:
            outcome, reason = Incident.Outcome.NOT_RECOVERED, "recovery is off for this job"
        if _open(
            job,
            signal=signal,
            stopped_at=job.ended_at or now,
            now=now,
            detail=detail,
            evidence=evidence,
            outcome=outcome,
            reason=reason,
            named=_crash_named(job, signal, (listed or {}).get(job.id)),
        ):
            opened += 1
    return opened


def _crash_named(job: Job, signal: str, directory: RunDirectory | None) -> list[tuple[str, str]]:
    """The nodes a job's end points at: none for a preemption or the time limit; every
    node of the allocation for a boot failure (Slurm does not say which node failed to
    launch; those the inventory shows at fault, when it shows any); else the node of the
    first task srun reported ending badly."""
    if signal in NO_NODE_EVIDENCE:
        return []
    if signal == Incident.Signal.BOOT_FAILURE:
        return boot_failure_suspects(job)
    return crash_suspects(job, directory)


def boot_failure_suspects(job: Job) -> list[tuple[str, str]]:
    try:
        names = expand(job.allocated_nodes) if job.allocated_nodes else []
    except ValueError:
        return []
    faulty = {node.name for node, _ in _faulty_nodes(job, names)}
    named = [name for name in names if name in faulty] or names
    why = (
        f"Slurm ended job {job.slurm_job_id} BOOT_FAIL: its allocation "
        f"({job.allocated_nodes[:200]}) failed to launch"
    )
    return [
        (
            name,
            f"{why}; {name} "
            + ("was down or failing" if name in faulty else "was in it (Slurm names no node)"),
        )
        for name in named
    ]


def divergences_open(*, cluster: Cluster, now: datetime) -> int:
    """An incident for each job whose loss stopped being a number."""
    opened = 0
    policy = policy_for(cluster)
    for job in diverged_jobs(cluster):
        settings = job_recovery_settings(job, policy)
        step = job.nonfinite_loss_step or 0
        point = MetricPoint.objects.filter(job=job, step=step).values_list("wall_time", "loss")
        found = point.first()
        stopped = min(found[0], now) if found and found[0] else now
        detail = (
            f"the loss at step {step} is {found[1] if found else 'not a number'}: the run "
            "diverged; it resumes from a proven checkpoint before that step"
        )
        outcome, reason = Incident.Outcome.OPEN, ""
        if not settings.enabled:
            outcome, reason = Incident.Outcome.NOT_RECOVERED, "recovery is off for this job"
        if _open(
            job,
            signal=Incident.Signal.NONFINITE_LOSS,
            stopped_at=stopped,
            now=now,
            detail=detail,
            evidence={"step": step, "state": job.state, "last_step": job.last_step},
            outcome=outcome,
            reason=reason,
        ):
            opened += 1
    return opened


def spikes_open(*, jobs: list[Job], policy: RecoveryPolicy, now: datetime) -> int:
    """An incident for each running job whose loss spiked past the policy's bound."""
    opened = 0
    for job, spike in spiked_jobs(jobs, policy):
        settings = job_recovery_settings(job, policy)
        point = MetricPoint.objects.filter(job=job, step=spike.step).values_list("wall_time")
        found = point.first()
        outcome, reason = Incident.Outcome.OPEN, ""
        if not settings.enabled:
            outcome, reason = Incident.Outcome.NOT_RECOVERED, "recovery is off for this job"
        if _open(
            job,
            signal=Incident.Signal.LOSS_SPIKE,
            stopped_at=min(found[0], now) if found and found[0] else now,
            now=now,
            detail=(
                f"the loss at step {spike.step} is {spike.loss:.4g}, over {spike.factor:g} × "
                f"the median {spike.median:.4g} of the {SPIKE_WINDOW} logged losses before "
                f"it, and stayed over for {SPIKE_PERSIST} logged steps: it resumes from a "
                "proven checkpoint before that step"
            ),
            evidence=spike.as_evidence(),
            outcome=outcome,
            reason=reason,
        ):
            opened += 1
    return opened


def stragglers_open(*, jobs: list[Job], now: datetime) -> int:
    """An incident for each running job with a rank slower than its peers for
    ``STRAGGLER_STREAK`` logged intervals in a row, naming its node. It is recovered (the
    node left out) only where the policy excludes suspects; otherwise people are told."""
    opened = 0
    with_incident = set(Incident.objects.filter(job__in=jobs).values_list("job_id", flat=True))
    for job in jobs:
        # Ingest keeps only timings within the allocation; a state stored before it did
        # (or changed by hand) is held to it here too, before it reaches an incident's words.
        allocated = set(job.allocated_node_names)
        slow = [item for item in stragglers(job.rank_timing) if item.get("node") in allocated]
        if not slow or job.id in with_incident:
            continue
        settings = job_recovery_settings(job)
        named = ", ".join(
            f"rank {item['rank']} on {item.get('node')} ({item.get('ratio')}× its peers' "
            f"forward time for {item.get('streak')} logged intervals since step "
            f"{item.get('since_step')})"
            for item in slow
        )
        outcome, reason = Incident.Outcome.OPEN, ""
        if not settings.enabled or not settings.exclude_suspects:
            outcome = Incident.Outcome.NOTIFIED
            reason = "a straggler is recovered only where suspects are left out: left running"
        incident = _open(
            job,
            signal=Incident.Signal.STRAGGLER,
            stopped_at=now,
            now=now,
            detail=f"straggler: {named}",
            evidence={"stragglers": slow, "margin": STRAGGLER_MARGIN},
            outcome=outcome,
            reason=reason,
        )
        if incident is not None:
            opened += 1
            _name_stragglers(incident, job, slow)
    return opened


def _name_stragglers(incident: Incident, job: Job, slow: list[dict[str, Any]]) -> None:
    named: list[tuple[Node | str, str]] = []
    for name in sorted({str(item.get("node")) for item in slow}):
        figures = [item for item in slow if item.get("node") == name]
        named.append(
            (
                name,
                f"job {job.slurm_job_id}: rank(s) "
                + ", ".join(str(item["rank"]) for item in figures)
                + f" on {name} slower than their peers by more than "
                f"{STRAGGLER_MARGIN:.0%} for {figures[0].get('streak')} logged intervals",
            )
        )
    _name_suspects(incident, job, named)


def _name_suspects(incident: Incident, job: Job, named: Sequence[tuple[Node | str, str]]) -> None:
    """Record the nodes ``named`` (a node or a node name of the job's cluster, with the
    evidence in words) as suspects of ``incident``. Only nodes Slurm allocated to the job
    are recorded, whatever the signal: the one place every piece of evidence (a job's
    own files above all: srun lines, heartbeats, per-rank timings) is confined to the
    job's allocation, so no job can put somebody else's node in front of operators."""
    allocated = set(job.allocated_node_names)
    names = {item[0] if isinstance(item[0], str) else item[0].name for item in named} & allocated
    if not names:
        return
    nodes = {n.name: n for n in Node.objects.filter(cluster=job.cluster, name__in=names)}
    recorded: list[str] = list(incident.suspect_nodes or [])
    for item, why in named:
        node = nodes.get(item if isinstance(item, str) else item.name)
        if node is None:
            continue
        SuspectNode.objects.get_or_create(node=node, incident=incident, defaults={"evidence": why})
        if node.name not in recorded:
            recorded.append(node.name)
    Incident.objects.filter(pk=incident.pk).update(suspect_nodes=recorded)
    incident.suspect_nodes = recorded


def hang_open(
    *,
    job: Job,
    budget: HangBudget,
    progress: JobProgress,
    policy: RecoveryPolicy,
    now: datetime,
    directory: RunDirectory | None = None,
) -> Incident | None:
    """An incident for a running job whose metrics stopped growing past its budget."""
    settings = job_recovery_settings(job, policy)
    quiet = (now - progress.grew_at).total_seconds()
    detail = (
        f"no new step for {quiet:.0f} s (last step {job.last_step}), over its budget of "
        f"{budget.seconds:.0f} s"
        + (
            f" (p95 {budget.p95_interval_s:.1f} s between logged steps × {policy.hang_factor:g}"
            f", plus {budget.save_allowance_s:.0f} s for a checkpoint save)"
            if budget.p95_interval_s is not None
            else " (start-up grace: no steady steps yet)"
        )
        + "; Gantry read its run directory this cycle"
    )
    evidence = {
        **budget.as_evidence(),
        "quiet_s": round(quiet, 3),
        "last_step": job.last_step,
        "metrics_offset": progress.metrics_offset,
        "grew_at": progress.grew_at.isoformat(),
        "seen_at": progress.seen_at.isoformat(),
        "nodes": job.allocated_nodes,
    }
    outcome, reason = Incident.Outcome.OPEN, ""
    if not settings.enabled:
        outcome, reason = Incident.Outcome.NOTIFIED, "recovery is off for this job: left running"
    elif settings.on_hang == OnHang.NOTIFY:
        outcome, reason = Incident.Outcome.NOTIFIED, "the job's policy is to notify on a hang"
    return _open(
        job,
        signal=Incident.Signal.HANG,
        stopped_at=progress.grew_at,
        now=now,
        detail=detail,
        evidence=evidence,
        outcome=outcome,
        reason=reason,
        named=hang_suspects(job, directory),
    )


def incidents_advance(*, cluster: Cluster, now: datetime) -> int:
    """Move every open incident of ``cluster`` one step on; returns how many moved."""
    moved = 0
    for incident in Incident.objects.filter(
        cluster=cluster, outcome__in=list(Incident.ACTIVE_OUTCOMES)
    ).select_related("job", "job__cluster", "lineage_root"):
        try:
            moved += int(_advance(incident, now))
        except ApplicationError as error:
            moved += int(
                incident_move(incident, Incident.Outcome.HELD, reason=f"recovery refused: {error}")
            )
    return moved


def _advance(incident: Incident, now: datetime) -> bool:
    job = incident.job
    job.refresh_from_db()
    policy = policy_for(job.cluster)
    if not job.is_final:
        return _cancel_what_is_left(incident, job, now, policy)
    if incident.cancel_requested_at and incident.cancelled_at is None:
        Incident.objects.filter(pk=incident.pk).update(cancelled_at=job.ended_at or now)
        step_end(
            incident, "cancel", now=now, outcome=f"Slurm ended job {job.slurm_job_id} {job.state}"
        )
    settings = job_recovery_settings(job)
    if incident.signal == Incident.Signal.HANG and settings.on_hang == OnHang.HOLD:
        return incident_move(
            incident, Incident.Outcome.HELD, reason="the job's policy holds a hung job for a person"
        )
    if not job.files_final:
        # Its last checkpoints are still being read: choose once they are known.
        return False
    if _awaiting_node_view(incident, job, now, policy):
        return False
    stop = _limits_reached(incident, settings)
    if stop:
        return incident_move(incident, Incident.Outcome.HELD, reason=stop)
    return resume_on_proof(incident, job, settings, now, policy)


def _awaiting_node_view(
    incident: Incident, job: Job, now: datetime, policy: RecoveryPolicy
) -> bool:
    """A node failure (or a hang) with no suspect named yet: ask for a node sync once and
    wait for it (up to the policy's node-view deadline: so the failed node is named and
    left out), then name the nodes it shows down or failing; past the deadline, go on
    without one (and say so)."""
    if incident.signal not in _NODE_VIEW_SIGNALS or incident.suspect_nodes:
        return False
    cluster = Cluster.objects.get(pk=incident.cluster_id)
    synced = cluster.last_sync_ok_at
    if synced is not None and synced >= incident.detected_at:
        _name_suspects(incident, job, list(_suspects(job, incident.signal)))
        named = ", ".join(incident.suspect_nodes or []) or "no node down or failing"
        step_end(incident, "node view", now=now, outcome=f"nodes synced: {named}")
        return False
    seconds = policy.node_view_deadline_seconds
    if now - incident.detected_at > timedelta(seconds=seconds):
        if step_of(incident, "node view") is not None:
            deadline_passed(
                incident,
                "node view",
                now=now,
                outcome=f"no view of the nodes newer than the failure within {seconds} s: "
                "going on with the evidence there is",
            )
        return False
    step_begin(incident, "node view", now=now, seconds=seconds)
    evidence = dict(incident.evidence or {})
    if not evidence.get("node_sync_requested"):
        evidence["node_sync_requested"] = now.isoformat()
        Incident.objects.filter(pk=incident.pk).update(evidence=evidence)
        incident.evidence = evidence
        cluster_id = cluster.pk
        transaction.on_commit(lambda: cluster_sync_task.delay(cluster_id))
    return True


def _cancel_what_is_left(
    incident: Incident, job: Job, now: datetime, policy: RecoveryPolicy
) -> bool:
    """Cancel what is left of the job (once); held if Slurm has not ended it by the
    policy's cancel deadline."""
    if incident.cancel_requested_at is not None:
        if not past_deadline(incident, "cancel", now):
            return False
        seconds = policy.cancel_deadline_seconds
        why = (
            f"Slurm has not ended job {job.slurm_job_id} ({job.state}) within {seconds} s of "
            "recovery's cancel"
        )
        deadline_passed(incident, "cancel", now=now, outcome=why)
        return incident_move(
            incident,
            Incident.Outcome.HELD,
            reason=f"{why}: held for a person (an operator ends it with scancel, then resumes)",
        )
    if not Incident.objects.filter(pk=incident.pk, cancel_requested_at__isnull=True).update(
        cancel_requested_at=now
    ):
        return False
    step_begin(incident, "cancel", now=now, seconds=policy.cancel_deadline_seconds)

    def audit(cancelled: Job) -> None:
        audit_event_record(
            actor=None,
            action=AuditAction.RECOVERY_CANCEL,
            target=cancelled,
            details={"incident": incident.pk, "signal": incident.signal},
        )

    JOBS.cancel(job, by="recovery", audit=audit)
    return True


def _limits_reached(incident: Incident, settings: RecoverySettings) -> str:
    """Why recovery must stop for this lineage now, or ""."""
    done = list(
        Incident.objects.filter(lineage_root=incident.lineage_root, resumed_job__isnull=False)
        .exclude(pk=incident.pk)
        .select_related("resumed_job")
    )
    # A preemption is no failed attempt: it neither uses one up nor is stopped by them
    # (the GPU-hours its resumes use still count against the budget).
    attempts = [item for item in done if item.signal != Incident.Signal.PREEMPTED]
    if incident.signal != Incident.Signal.PREEMPTED and len(attempts) >= settings.max_attempts:
        return (
            f"{len(attempts)} recoveries of this run already: the most its policy allows "
            f"({settings.max_attempts}); preemptions are not counted"
        )
    if settings.gpu_hours_budget is not None:
        spent = sum(_gpu_hours(item.resumed_job) for item in done if item.resumed_job)
        if spent >= settings.gpu_hours_budget:
            return (
                f"the recovery attempts of this run used {spent:.2f} GPU-hours, its budget is "
                f"{settings.gpu_hours_budget:g}"
            )
    return ""


def _gpu_hours(job: Job) -> float:
    if job.started_at is None:
        return 0.0
    end = job.ended_at or timezone.now()
    hours = max(0.0, (end - job.started_at).total_seconds()) / 3600.0
    return hours * job_gpus(
        nodes=job.nodes, gpus_per_node=job.gpus_per_node, tasks_per_node=job.tasks_per_node
    )
