"""Restore drills and the policies that start them.

The tables kept their names (``jobs_restoredrill``, ``jobs_drillpolicy``) when the models
moved here from the jobs app: a migrated database keeps every row.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from jobs.models import Checkpoint
from nodes.models import Cluster
from runs.models import SlurmTracked


class RestoreDrill(SlurmTracked):
    """A restore exercise: load a checkpoint on an allocation, run K steps, compare."""

    class State(models.TextChoices):
        QUEUED = "queued"
        SUBMITTING = "submitting"
        SUBMIT_UNKNOWN = "submit_unknown", "sbatch outcome unknown"
        PENDING = "pending"
        RUNNING = "running"
        FINISHED = "finished"
        CANCELLED = "cancelled"

    class Verdict(models.TextChoices):
        PASSED = "passed", "passed (proven restorable)"
        FAILED = "failed", "failed (the checkpoint is at fault; resume blocked)"
        INCONCLUSIVE = "inconclusive", "inconclusive (the drill could not judge)"
        ERROR = "error", "error (the drill could not run; not a verdict on the checkpoint)"

    class Trainer(models.TextChoices):
        RECORDED = "recorded", "the version that wrote the checkpoint"
        CURRENT = "current", "the current version (compatibility drill)"

    class Trigger(models.TextChoices):
        MANUAL = "manual"
        POLICY_RUNNING = "policy_running", "policy: newest checkpoint of a running job"
        POLICY_FINAL = "policy_final", "policy: final checkpoint of a completed job"
        RECOVERY = "recovery", "recovery: proving a checkpoint before resuming from it"

    class Attestation(models.TextChoices):
        # drills.attestation says who may run a drill that counts, and why.
        VERIFIER = "verifier", "verifier-attested (run as an account the owner cannot act as)"
        SELF = "self", "self-attested (run as the checkpoint's owner; not proof)"

    ACTIVE_STATES = frozenset(
        {State.QUEUED, State.SUBMITTING, State.SUBMIT_UNKNOWN, State.PENDING, State.RUNNING}
    )
    FINAL_STATES = frozenset({State.FINISHED, State.CANCELLED})
    SLURM_ACTIVE_STATES = frozenset({State.PENDING, State.RUNNING})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="drills")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="restore_drills",
    )

    class Level(models.TextChoices):
        # Replayed the steps a full drill asks for (to the next checkpoint, or the default).
        REPLAY = "replay", "full (replayed and compared)"
        # The run logged fewer steps after the checkpoint than a drill needs (it died right
        # after saving): files against the manifest, the loaded state bit for bit against
        # the saved fingerprint, and the steps there are to compare (zero or more).
        STATE_EXACT = "state_exact", "state-exact, no replay"

    # 0 only at the level state-exact (nothing logged after the checkpoint to replay).
    steps = models.PositiveIntegerField(default=5, validators=[MinValueValidator(0)])
    level = models.CharField(max_length=16, choices=Level.choices, default=Level.REPLAY)
    # The original run's next checkpoint, which the drill replays to and whose state it
    # compares (null: K steps, compared by loss only).
    replay_to_step = models.PositiveIntegerField(null=True, blank=True)
    trainer = models.CharField(max_length=16, choices=Trainer.choices, default=Trainer.RECORDED)
    # What the drill ran: the trainer version (sha256 of its sources) and the reference
    # Gantry wrote (sha256 of its canonical JSON; the report must name the same).
    trainer_digest = models.CharField(max_length=64, blank=True)
    reference_digest = models.CharField(max_length=64, blank=True)
    allocation = models.JSONField(
        default=dict, help_text="nodes, gpus_per_node, tasks_per_node, partition"
    )
    allocation_key = models.CharField(
        max_length=255, help_text="Canonical form of the allocation, for duplicate checks."
    )
    # The nodes Slurm ran the drill on (its node list expression, as squeue or sacct gave
    # it; never from the drill's own report): what a bit-exact failure on one allocation
    # and a pass on another is evidence against (``recovery.sdc``). Empty: not seen.
    allocated_nodes = models.CharField(max_length=1024, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    verdict = models.CharField(max_length=16, choices=Verdict.choices, blank=True)
    reason = models.TextField(blank=True)
    reason_code = models.CharField(max_length=64, blank=True)
    evidence = models.JSONField(null=True, blank=True)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.MANUAL)
    # Who ran the drill and wrote its report: only a verifier-attested pass proves the
    # checkpoint (``drills.attestation``). Rows from before attestation are self-attested.
    attestation = models.CharField(
        max_length=16, choices=Attestation.choices, default=Attestation.SELF
    )
    # The verifier account a verifier-attested drill runs as, fixed when it starts.
    verifier_account = models.CharField(max_length=32, blank=True)
    cluster = models.ForeignKey(
        Cluster, on_delete=models.CASCADE, related_name="restore_drills", null=True
    )
    # What the drill asks Slurm for, fixed when it starts: what the owner's drill budget
    # (``DrillBudget``) counts, and the time limit its batch script gets.
    gpus = models.PositiveIntegerField(default=0, help_text="GPUs of the allocation, all nodes.")
    time_limit_minutes = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)])

    integrity_s = models.FloatField(null=True, blank=True)
    load_s = models.FloatField(null=True, blank=True)
    steps_s = models.FloatField(null=True, blank=True)
    queue_wait_s = models.FloatField(null=True, blank=True)

    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "jobs_restoredrill"
        ordering = ["-created_at"]
        constraints = [
            # One drill at a time per checkpoint and allocation: a second one is refused.
            models.UniqueConstraint(
                fields=["checkpoint", "allocation_key"],
                condition=Q(
                    state__in=["queued", "submitting", "submit_unknown", "pending", "running"]
                ),
                name="drill_one_active_per_checkpoint_allocation",
            ),
            models.CheckConstraint(
                name="drill_verdict_only_when_finished",
                condition=Q(verdict="") | Q(state__in=["finished", "cancelled"]),
            ),
            models.CheckConstraint(
                name="drill_verifier_attested_names_its_verifier",
                condition=Q(attestation="self")
                | (Q(attestation="verifier") & ~Q(verifier_account="")),
            ),
        ]
        indexes = [
            models.Index(fields=["cluster", "state"], name="drill_cluster_state"),
            models.Index(fields=["state", "-created_at"], name="drill_state_created"),
            models.Index(fields=["verdict", "-finished_at"], name="drill_verdict_finished"),
        ]

    def __str__(self) -> str:
        return f"drill {str(self.id)[:8]} of {self.checkpoint}"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE_STATES

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    @property
    def is_attested(self) -> bool:
        """Run as the cluster's verifier: its pass counts as proof."""
        return self.attestation == self.Attestation.VERIFIER and bool(self.verifier_account)

    def gpu_hours_charged(self) -> float:
        """What this drill counts against its owner's daily GPU-hours (``DrillBudget``)."""
        return drill_gpu_hours(
            state=self.state,
            gpus=self.gpus,
            time_limit_minutes=self.time_limit_minutes,
            submitted=bool(self.slurm_job_id),
            started_at=self.started_at,
            finished_at=self.finished_at,
        )


def drill_gpu_hours(
    *,
    state: str,
    gpus: int,
    time_limit_minutes: int,
    submitted: bool,
    started_at: datetime | None,
    finished_at: datetime | None,
) -> float:
    """GPU-hours a drill counts: while it is active, its GPUs for its whole time limit (it
    may hold them that long); once it ended, for the time it ran (at most the limit); a
    drill that ended before Slurm ever had it, nothing; one Slurm had whose times Gantry
    never saw, its whole time limit (never less than it may have used)."""
    limit_hours = time_limit_minutes / 60
    if state not in RestoreDrill.FINAL_STATES:
        return gpus * limit_hours
    if started_at is not None and finished_at is not None:
        ran_hours = max(0.0, (finished_at - started_at).total_seconds() / 3600)
        return gpus * min(ran_hours, limit_hours)
    if started_at is None and not submitted:
        return 0.0
    return gpus * limit_hours


class DrillPolicy(models.Model):
    """Per cluster, set by operators: which restore drills Gantry starts by itself."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="drill_policy")
    enabled = models.BooleanField(default=False)
    running_every_hours = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.01)],
        help_text="Drill the newest checkpoint of every running job this often; empty: never.",
    )
    drill_final_checkpoint = models.BooleanField(
        default=False, help_text="Drill each job's final checkpoint when it completes."
    )
    max_in_flight = models.PositiveSmallIntegerField(
        default=2, validators=[MinValueValidator(1)], help_text="At most this many drills at once."
    )
    steps = models.PositiveIntegerField(default=5, validators=[MinValueValidator(1)])
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Completed jobs that ended before the policy was switched on are not drilled after the fact.
    final_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "jobs_drillpolicy"
        verbose_name_plural = "drill policies"

    def __str__(self) -> str:
        return f"drill policy of {self.cluster}"


# A cluster without a budget row is bounded by these (``DrillBudget.for_cluster``).
DEFAULT_MAX_ACTIVE_DRILLS = 3
DEFAULT_MAX_DRILL_GPUS = 16
DEFAULT_MAX_DRILL_GPU_HOURS_PER_DAY = 32.0


class DrillBudget(models.Model):
    """Per cluster, set by operators: how much of the cluster the drills one owner asks for
    may hold. Counted per owner of the checkpoint (whoever clicked), over the drills people
    started (``Trigger.MANUAL``); the drills Gantry schedules itself (policies, recovery)
    are bounded by their policy instead. A cluster without a row has the defaults."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="drill_budget")
    max_active_drills = models.PositiveIntegerField(
        default=DEFAULT_MAX_ACTIVE_DRILLS,
        help_text="Per owner: drills queued, pending or running at once (0: none).",
    )
    max_gpus = models.PositiveIntegerField(
        "max GPUs",
        default=DEFAULT_MAX_DRILL_GPUS,
        help_text="Per owner: GPUs held by their active drills at once (0: CPU-only drills).",
    )
    max_gpu_hours_per_day = models.FloatField(
        "max GPU-hours a day",
        default=DEFAULT_MAX_DRILL_GPU_HOURS_PER_DAY,
        validators=[MinValueValidator(0)],
        help_text="Per owner, over drills started in the last 24 hours: GPUs × time limit "
        "while active, GPUs × time run once ended.",
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                name="drill_budget_gpu_hours_not_negative",
                condition=Q(max_gpu_hours_per_day__gte=0),
            )
        ]

    def __str__(self) -> str:
        return f"drill budget of {self.cluster}"

    @classmethod
    def for_cluster(cls, cluster: Cluster) -> DrillBudget:
        """The cluster's budget; the defaults (unsaved) when operators never set one."""
        return cls.objects.filter(cluster=cluster).first() or cls(cluster=cluster)
