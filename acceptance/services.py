"""Writes of the acceptance app: start a run (operators), cancel it (operators), both
audited. The run then moves by itself (``acceptance.orchestrate``, each watcher cycle)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from acceptance.lifecycle import STEPS
from acceptance.models import (
    DEFAULT_TIERS,
    REQUESTABLE_TIERS,
    TIER_ORDER,
    AcceptanceRun,
    AcceptanceStep,
    Tier,
)
from acceptance.orchestrate import run_advance
from acceptance.recovery_tier import DEFAULT_MINUTES as RECOVERY_MINUTES
from acceptance.recovery_tier import recovery_cleanup
from acceptance.sustained import DEFAULT_MINUTES as SUSTAINED_MINUTES
from core.audit import AuditAction, audit_event_record
from core.errors import ApplicationError, ConflictError, FieldError
from core.roles import is_operator
from core.types import User
from jobs.models import Job
from nodes.access.identities import cluster_account_for
from nodes.models import Cluster, Node, Partition
from nodes.services import cluster_reconcile_soon
from slurm.hostlist import expand, natural_key

logger = logging.getLogger(__name__)

MAX_NODES = 1024
# Options an operator may set, with their bounds (whole numbers): the collectives'; the
# sustained tier's minutes of training and, optionally, its throughput threshold; the
# recovery tier's time bound and, optionally, its thresholds.
OPTION_BOUNDS = {
    "max_mib": (1, 4096),
    "iters": (1, 1000),
    "warmup": (0, 100),
    "minutes": (1, 120),
    "sustained_minutes": (1, 60),
    "sustained_min_tokens_per_s": (1, 10**12),
    "recovery_minutes": (10, 120),
    "recovery_max_seconds": (1, 24 * 3600),
    "recovery_max_lost_steps": (0, 10**6),
}
DEFAULT_OPTIONS = {
    "max_mib": 64,
    "iters": 10,
    "warmup": 3,
    "minutes": 20,
    "sustained_minutes": SUSTAINED_MINUTES,
    "recovery_minutes": RECOVERY_MINUTES,
}
# Thresholds with no default: without them their criterion is inconclusive.
OPTIONAL_OPTIONS = ("sustained_min_tokens_per_s", "recovery_max_seconds", "recovery_max_lost_steps")
_PARTITION = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass
class RunRequest:
    cluster_id: int
    scope: str
    value: str
    tiers: list[str] = field(default_factory=lambda: [t.value for t in DEFAULT_TIERS])
    options: dict[str, Any] = field(default_factory=dict)


def _check_operator(actor: User) -> None:
    if not is_operator(actor):
        raise PermissionDenied("Only operators may do this.")


def _partition_nodes(cluster: Cluster, name: str) -> tuple[str, list[str]]:
    if (
        not _PARTITION.fullmatch(name)
        or not Partition.objects.filter(cluster=cluster, name=name, gone=False).exists()
    ):
        raise FieldError("value", f"{cluster.name} has no partition {name!r}")
    names = Node.objects.filter(cluster=cluster, partitions_text__contains=f",{name},").exclude(
        state=Node.State.GONE
    )
    return name, list(names.values_list("name", flat=True))


def _listed_nodes(cluster: Cluster, expression: str) -> tuple[str, list[str]]:
    try:
        wanted = expand(expression.strip())
    except ValueError as error:
        raise FieldError("value", f"not a node list: {error}") from None
    if len(wanted) > MAX_NODES:
        raise FieldError("value", f"at most {MAX_NODES} nodes")
    rows = list(
        Node.objects.filter(cluster=cluster, name__in=wanted).exclude(state=Node.State.GONE)
    )
    missing = sorted(set(wanted) - {row.name for row in rows}, key=natural_key)
    if missing:
        raise FieldError("value", f"{cluster.name} has no node(s) {', '.join(missing[:10])}")
    shared = set.intersection(*(set(row.partitions or []) for row in rows)) if rows else set()
    if not shared:
        raise FieldError("value", "these nodes share no partition: one Slurm job cannot span them")
    partition = cluster.default_partition if cluster.default_partition in shared else min(shared)
    return partition, [row.name for row in rows]


def _job_nodes(cluster: Cluster, value: str) -> tuple[str, list[str]]:
    try:
        job = Job.objects.get(cluster=cluster, id=value.strip())
    except (Job.DoesNotExist, ValueError, ValidationError):
        raise FieldError("value", f"{cluster.name} has no job {value!r}") from None
    names = job.allocated_node_names
    if not names:
        raise FieldError("value", f"job {job.name} has no nodes (it never ran)")
    return job.partition, names


def node_set(cluster: Cluster, scope: str, value: str) -> tuple[str, list[str]]:
    """(partition, node names) of what the operator chose; FieldError when it is not a set
    Gantry can test."""
    resolvers: dict[str, Callable[[Cluster, str], tuple[str, list[str]]]] = {
        AcceptanceRun.Scope.PARTITION: _partition_nodes,
        AcceptanceRun.Scope.NODES: _listed_nodes,
        AcceptanceRun.Scope.JOB: _job_nodes,
    }
    if scope not in resolvers:
        raise FieldError("scope", f"one of {', '.join(resolvers)}")
    if not isinstance(value, str) or not value.strip() or len(value) > 512:
        raise FieldError("value", "required, at most 512 characters")
    partition, names = resolvers[scope](cluster, value)
    if not names:
        raise FieldError("value", "no nodes to test")
    return partition, sorted(set(names), key=natural_key)


def clean_tiers(tiers: Any) -> list[str]:
    allowed = [t.value for t in REQUESTABLE_TIERS]
    if not isinstance(tiers, list) or not tiers or not all(isinstance(t, str) for t in tiers):
        raise FieldError("tiers", f"a non-empty list of {', '.join(allowed)}")
    unknown = sorted(set(tiers) - set(allowed))
    if unknown:
        raise FieldError(
            "tiers", f"unknown tier(s) {', '.join(unknown)}; one of {', '.join(allowed)}"
        )
    return [t.value for t in TIER_ORDER if t.value in tiers]


def clean_options(options: Any) -> dict[str, Any]:
    if not isinstance(options, dict):
        raise FieldError("options", "an object")
    unknown = sorted(set(options) - set(OPTION_BOUNDS))
    if unknown:
        raise FieldError("options", f"unknown option(s) {', '.join(map(str, unknown))}")
    values: dict[str, Any] = {**DEFAULT_OPTIONS}
    for key, (low, high) in OPTION_BOUNDS.items():
        if key in options:
            value = options[key]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise FieldError(f"options.{key}", f"a whole number from {low} to {high}")
            values[key] = value
    return {
        "ops": ["all_reduce"],
        "min_bytes": "1MiB" if values["max_mib"] > 1 else "64KiB",
        "max_bytes": f"{values['max_mib']}MiB",
        "iters": values["iters"],
        "warmup": values["warmup"],
        "minutes": values["minutes"],
        "sustained_minutes": values["sustained_minutes"],
        "recovery_minutes": values["recovery_minutes"],
        **{key: values[key] for key in OPTIONAL_OPTIONS if key in values},
    }


def _check_recovery_possible(cluster: Cluster, actor: User) -> None:
    """The recovery tier submits a job as the operator's own account and needs drills that
    prove: refused now (400) rather than inconclusive later."""
    cluster_account_for(cluster=cluster, user=actor)
    if not cluster.verifier_account:
        raise FieldError(
            "tiers",
            f"the recovery tier needs {cluster.name}'s verifier account (recovery resumes only "
            "from a checkpoint a verifier's drill proved); an operator sets one first",
        )


def acceptance_run_start(*, actor: User, request: RunRequest) -> AcceptanceRun:
    """Start an acceptance run of a node set (operators). Refused while another run tests
    any of the same nodes (the two would measure each other's traffic)."""
    _check_operator(actor)
    cluster = Cluster.objects.filter(pk=request.cluster_id).first()
    if cluster is None:
        raise FieldError("cluster", "no such cluster")
    partition, names = node_set(cluster, request.scope, request.value)
    tiers = clean_tiers(request.tiers)
    options = clean_options(request.options)
    if Tier.RECOVERY in tiers:
        _check_recovery_possible(cluster, actor)
    with transaction.atomic():
        # Locks the cluster row: two starts over the same nodes cannot both pass the check.
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
        for other in AcceptanceRun.objects.filter(
            cluster=cluster, state__in=list(AcceptanceRun.ACTIVE_STATES)
        ):
            shared = sorted(set(other.nodes) & set(names), key=natural_key)
            if shared:
                raise ConflictError(
                    f"acceptance run {str(other.id)[:8]} is testing {', '.join(shared[:10])}",
                    extra={"run": str(other.id)},
                )
        run = AcceptanceRun.objects.create(
            cluster=cluster,
            scope=request.scope,
            scope_value=request.value.strip(),
            partition=partition,
            nodes=names,
            requested_by=actor,
            tiers=tiers,
            options=options,
        )
        audit_event_record(
            actor=actor,
            action=AuditAction.ACCEPTANCE_START,
            target=run,
            details={"nodes": names, "partition": partition, "tiers": tiers, "options": options},
        )
        run_advance(run_id=run.id, now=timezone.now())
    cluster_reconcile_soon(cluster_id=cluster.pk)
    run.refresh_from_db()
    return run


def acceptance_run_cancel(*, actor: User, run: AcceptanceRun) -> str:
    """Cancel a run (operators): it ends at once, without a certificate; its steps' Slurm
    jobs are cancelled (one that cannot be reached now is ended by the watcher)."""
    _check_operator(actor)
    now = timezone.now()
    with transaction.atomic():
        if not AcceptanceRun.objects.filter(
            pk=run.pk, state__in=list(AcceptanceRun.ACTIVE_STATES)
        ).update(
            state=AcceptanceRun.State.CANCELLED,
            cancelled_by=actor,
            ended_at=now,
            current_tier="",
            reason=f"cancelled by {actor.get_username()}",
        ):
            run.refresh_from_db()
            return f"already {run.state}"
        audit_event_record(actor=actor, action=AuditAction.ACCEPTANCE_CANCEL, target=run)
    problems = []
    for step in AcceptanceStep.objects.select_related("cluster", "run").filter(
        run=run, state__in=list(AcceptanceStep.ACTIVE_STATES)
    ):
        try:
            STEPS.cancel(step, by=actor.get_username(), audit=lambda _step: None)
        except ApplicationError as error:
            problems.append(f"{step}: {error.message}")
    # The recovery tier's training lineage and drill, if it got that far.
    problems += recovery_cleanup(run=run, actor=actor, now=now)
    run.refresh_from_db()
    if problems:
        logger.warning("acceptance run %s: cancelling steps: %s", run.id, "; ".join(problems))
        return "cancelled; some steps could not be reached now and end with the watcher"
    return "cancelled"
