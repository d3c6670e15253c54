"""The owner's drill budget and partition check: what a drill people ask for may hold.

Drills a researcher starts run as the cluster's verifier account, not as the researcher,
so Slurm's own limits on the researcher's account do not hold them. Gantry holds them
instead, in the one service that starts drills (``restore_drill_start``):

- **Budget** (``DrillBudget``, per cluster, set by operators): per owner of the
  checkpoint, the most active drills at once, the most GPUs their active drills hold at
  once, and GPU-hours over the drills started in the last 24 hours (rolling). Checked
  under a lock on the owner's user row, so two starts at once cannot both take the last
  slot. Counted over drills people started (``Trigger.MANUAL``, whoever clicked: an
  operator's drill of your checkpoint is yours); the drills Gantry starts by itself
  (scheduled policies, recovery proving a checkpoint) are bounded by their own policy
  and neither count nor are refused here.
- **Partition**: a drill runs only on a partition the owner's own account is known to be
  allowed on: the partition of the job that wrote the checkpoint, or one where Slurm
  accepted (gave a job id to) another job of the same account on this cluster. Gantry
  keeps no copy of Slurm's AllowAccounts/AllowGroups or associations, so this is
  evidence Slurm gave, and it fails closed: a partition the account never used is refused
  until a job of theirs runs there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Count, Sum

from core.audit import AuditAction
from core.cluster_settings import cluster_settings_update
from core.errors import FieldError
from core.types import User
from drills.models import DrillBudget, RestoreDrill, drill_gpu_hours
from jobs.models import Job
from nodes.models import Cluster, Partition

BUDGET_FIELDS = ("max_active_drills", "max_gpus", "max_gpu_hours_per_day")
# The GPU-hours window: rolling, over the drills created in it.
BUDGET_WINDOW = timedelta(hours=24)
# Drills that count against the checkpoint owner's budget: those people asked for.
OWNER_TRIGGERS = frozenset({RestoreDrill.Trigger.MANUAL})


@dataclass(frozen=True)
class DrillUsage:
    """What one owner's drills hold on one cluster now, against the cluster's budget."""

    active_drills: int
    gpus: int
    gpu_hours_today: float
    budget: DrillBudget


def counts_against_owner(trigger: str) -> bool:
    return trigger in OWNER_TRIGGERS


def drill_usage(*, owner_id: int, cluster: Cluster, now: datetime) -> DrillUsage:
    """The owner's active drills, their GPUs, and GPU-hours of the last 24 hours on
    ``cluster`` (``drill_gpu_hours`` says what one drill counts)."""
    drills = RestoreDrill.objects.filter(
        cluster=cluster, checkpoint__job__owner_id=owner_id, trigger__in=OWNER_TRIGGERS
    )
    active = drills.filter(state__in=RestoreDrill.ACTIVE_STATES).aggregate(
        count=Count("id"), gpus=Sum("gpus")
    )
    recent = drills.filter(created_at__gte=now - BUDGET_WINDOW).values_list(
        "state", "gpus", "time_limit_minutes", "slurm_job_id", "started_at", "finished_at"
    )
    gpu_hours = sum(
        drill_gpu_hours(
            state=state,
            gpus=gpus,
            time_limit_minutes=limit,
            submitted=bool(slurm_job_id),
            started_at=started_at,
            finished_at=finished_at,
        )
        for state, gpus, limit, slurm_job_id, started_at, finished_at in recent
    )
    return DrillUsage(
        active_drills=int(active["count"] or 0),
        gpus=int(active["gpus"] or 0),
        gpu_hours_today=round(gpu_hours, 3),
        budget=DrillBudget.for_cluster(cluster),
    )


def drill_budget_reserve(
    *, owner_id: int, cluster: Cluster, gpus: int, time_limit_minutes: int, now: datetime
) -> None:
    """Refuse (``FieldError("budget", ...)``) a drill of ``gpus`` GPUs for
    ``time_limit_minutes`` that would take the owner over the cluster's budget. Call inside
    the transaction that creates the drill: it locks the owner's user row first, so a
    second start for the same owner waits for this one to commit and then counts it."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("drill_budget_reserve must run inside the drill's transaction")
    # The lock that serializes one owner's starts (a no-op on SQLite, whose writers are
    # serialized by the database itself).
    get_user_model().objects.select_for_update().filter(pk=owner_id).exists()
    usage = drill_usage(owner_id=owner_id, cluster=cluster, now=now)
    budget = usage.budget
    where = f"the most for you on {cluster.name} is"
    if usage.active_drills + 1 > budget.max_active_drills:
        raise FieldError(
            "budget",
            f"{usage.active_drills} active drill{'s' if usage.active_drills != 1 else ''}, "
            f"{where} {budget.max_active_drills}; wait for one to end or cancel one",
        )
    if usage.gpus + gpus > budget.max_gpus:
        raise FieldError(
            "budget",
            f"your active drills hold {usage.gpus} GPU(s) and this one asks for {gpus}; "
            f"{where} {budget.max_gpus} at once",
        )
    asked_hours = gpus * time_limit_minutes / 60
    if usage.gpu_hours_today + asked_hours > budget.max_gpu_hours_per_day:
        raise FieldError(
            "budget",
            f"your drills of the last 24 hours count {usage.gpu_hours_today:g} GPU-hours and "
            f"this one up to {asked_hours:g} ({gpus} GPU(s) × {time_limit_minutes} min); "
            f"{where} {budget.max_gpu_hours_per_day:g} a day",
        )


def drill_partition_check(*, job: Job, partition: str) -> None:
    """Refuse (``FieldError("partition", ...)``) a drill of ``job``'s checkpoint on a
    partition its account has no evidence of being allowed on. Evidence is Slurm's own:
    the job's own partition, one where Slurm accepted another job of the same account, or
    one whose last ``scontrol show partition`` let every account and group submit
    (``Partition.open_to_all``). A partition restricted to some accounts or groups counts
    only through the account's accepted jobs (Gantry does not know which Slurm accounts
    and groups a login has): fail closed."""
    if partition == job.partition:
        return
    accepted = (
        Job.objects.filter(cluster_id=job.cluster_id, run_as=job.run_as, partition=partition)
        .exclude(slurm_job_id="")
        .exists()
    ) or Partition.objects.filter(
        cluster_id=job.cluster_id, name=partition, gone=False, open_to_all=True
    ).exists()
    if not accepted:
        account = job.run_as or job.cluster.ssh_user
        raise FieldError(
            "partition",
            f"the account {account} has not been seen allowed on partition {partition!r} "
            "(Slurm does not let everyone submit there, and no job of it ever ran there); "
            f"a drill runs only where its owner's own jobs "
            f"may: {job.partition!r} or a partition one of their jobs was accepted on",
        )


def drill_budget_update(*, actor: User, cluster: Cluster, **values: Any) -> DrillBudget:
    """Change a cluster's drill budget (operators only); validated and audited with the
    values before and after. Refused with the field and why."""
    return cluster_settings_update(
        actor=actor,
        model=DrillBudget,
        cluster=cluster,
        fields=BUDGET_FIELDS,
        values=values,
        action=AuditAction.DRILL_BUDGET_UPDATE,
        what="drill budgets",
        details={"cluster": cluster.name},
    )
