"""Automatic recovery on proof: what went wrong with a job (an ``Incident``), what the
cluster's operators set as the default (``RecoveryPolicy``), which nodes the evidence
points at (``SuspectNode``: an incident's, or the silent data corruption a pair of restore
drills showed), and what the watcher last saw of a running job's progress (``JobProgress``,
the clock hang detection runs on).
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from drills.models import RestoreDrill
from jobs.models import Checkpoint, Job
from jobs.recovery_settings import MAX_ATTEMPTS_LIMIT, OnHang, RecoverySettings
from nodes.models import Cluster, Node

_DEFAULTS = RecoverySettings()


class RecoveryPolicy(models.Model):
    """Per cluster, set by operators: the recovery settings of jobs that set none."""

    class OnHangChoice(models.TextChoices):
        RECOVER = OnHang.RECOVER, "recover (cancel, resume from the newest proven checkpoint)"
        HOLD = OnHang.HOLD, "hold (cancel, wait for a person)"
        NOTIFY = OnHang.NOTIFY, "notify only (leave it running)"

    cluster = models.OneToOneField(
        Cluster, on_delete=models.CASCADE, related_name="recovery_policy"
    )
    enabled = models.BooleanField(default=_DEFAULTS.enabled)
    max_attempts = models.PositiveSmallIntegerField(
        default=_DEFAULTS.max_attempts, validators=[MaxValueValidator(MAX_ATTEMPTS_LIMIT)]
    )
    gpu_hours_budget = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.01)], help_text="Empty: none."
    )
    on_hang = models.CharField(
        max_length=16, choices=OnHangChoice.choices, default=_DEFAULTS.on_hang
    )
    exclude_suspects = models.BooleanField(default=_DEFAULTS.exclude_suspects)
    # Hang budget: max(hang_factor × the job's p95 time between logged steps, floor);
    # before the first logged step (start-up, restore), the start-up grace.
    hang_factor = models.FloatField(default=10.0, validators=[MinValueValidator(2.0)])
    hang_floor_seconds = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(30)]
    )
    startup_grace_seconds = models.PositiveIntegerField(
        default=1800, validators=[MinValueValidator(60)]
    )
    # A loss spike: a logged loss over this × the median of the logged losses before it
    # (``recovery.detect.loss_spike``), on two logged steps in a row; 0 turns it off.
    loss_spike_factor = models.FloatField(
        default=4.0,
        validators=[MinValueValidator(0.0)],
        help_text="0: off. A loss over this × the median of the recent losses, twice in a row.",
    )
    # A checkpoint the failed run logged too few steps after for a drill to replay (it died
    # right after saving) is proven at the level "state-exact, no replay"; on: that level
    # is enough to resume from the failed run's newest checkpoint; off: a replay is required.
    state_exact_resume = models.BooleanField(
        default=True,
        help_text="Resume from the failed run's newest checkpoint on a state-exact proof "
        "(files and loaded state bit for bit, no replay). Off: require a replayed drill.",
    )
    # Every step of an incident has a deadline; when one passes the incident moves on (the
    # next older proven checkpoint, or held with the reason) and people are told.
    cancel_deadline_seconds = models.PositiveIntegerField(
        default=300,
        validators=[MinValueValidator(30)],
        help_text="Slurm ends what is left of the job within this after the cancel, or held.",
    )
    node_view_deadline_seconds = models.PositiveIntegerField(
        default=120,
        validators=[MinValueValidator(10)],
        help_text="Wait this long for a view of the nodes newer than a node failure.",
    )
    proving_start_deadline_seconds = models.PositiveIntegerField(
        default=600,
        validators=[MinValueValidator(30)],
        help_text="A proving drill not running within this is cancelled; the next older "
        "proven checkpoint is used (a running one is bounded by its time limit).",
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"recovery policy of {self.cluster_id}"

    def settings(self) -> RecoverySettings:
        return RecoverySettings(
            enabled=self.enabled,
            max_attempts=self.max_attempts,
            gpu_hours_budget=self.gpu_hours_budget,
            on_hang=self.on_hang,
            exclude_suspects=self.exclude_suspects,
        )


class Incident(models.Model):
    """One interruption of a training lineage, from detection to its outcome."""

    class Signal(models.TextChoices):
        CRASH = "crash", "crashed"
        NODE_FAILURE = "node_failure", "node failure"
        OUT_OF_MEMORY = "out_of_memory", "out of memory"
        TIMEOUT = "timeout", "time limit"
        HANG = "hang", "hang (no progress)"
        NONFINITE_LOSS = "nonfinite_loss", "loss not finite"
        LOSS_SPIKE = "loss_spike", "loss spike"
        STRAGGLER = "straggler", "straggler (a rank persistently slower than its peers)"
        # Slurm preempted the job; Gantry submits with --no-requeue, so Slurm does not run
        # it again: recovery resumes it, and names no node (preemption is no node's fault).
        PREEMPTED = "preempted", "preempted (not requeued by Slurm)"
        # Slurm could not launch the job on its allocation (BOOT_FAIL): its nodes are named.
        BOOT_FAILURE = "boot_failure", "boot failure (the allocation failed to launch)"

    class Outcome(models.TextChoices):
        # Detected; what is left of the job is being cancelled.
        OPEN = "open"
        # A newer, unproven checkpoint is being drilled before anything resumes from it.
        PROVING = "proving", "proving a checkpoint"
        RECOVERED = "recovered", "resumed"
        HELD = "held", "held for a person"
        NOTIFIED = "notified", "left running (notify only)"
        # Recovery is off for the job, or there is nothing proven to resume from.
        NOT_RECOVERED = "not_recovered", "not recovered"

    ACTIVE_OUTCOMES = frozenset({Outcome.OPEN, Outcome.PROVING})

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="incidents")
    # The first job of the lineage (attempts and budgets are counted per lineage).
    lineage_root = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="lineage_incidents"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="incidents")
    signal = models.CharField(max_length=16, choices=Signal.choices)
    # What the detection rests on, in words and as figures (never a guess).
    detail = models.TextField(blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    # When the job stopped making progress (its end, or its last new step), and when
    # Gantry noticed: their difference is the time to detect.
    stopped_at = models.DateTimeField()
    detected_at = models.DateTimeField()
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.OPEN)
    reason = models.TextField(blank=True, help_text="The outcome in words.")
    resumed_from = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resumed_job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="recovered_from"
    )
    # Checkpoints skipped on the way (a drill failed them), as {step: why}.
    skipped = models.JSONField(default=dict, blank=True)
    proving_drill_id = models.UUIDField(null=True, blank=True)
    # The proof the resume rested on: "replay" (a full drill) or "state_exact"
    # (state-exact, no replay: the failed run logged too few steps after it to replay).
    resumed_proof = models.CharField(max_length=16, blank=True)
    # Each step (cancel, node view, proving a checkpoint, resume) with its start, deadline,
    # end and outcome: [{"name", "started_at", "deadline_at", "ended_at", "outcome"}].
    steps = models.JSONField(default=list, blank=True)
    # When a step's deadline last passed (the notifications collector tells people).
    deadline_passed_at = models.DateTimeField(null=True, blank=True)
    suspect_nodes = models.JSONField(default=list, blank=True)
    excluded_nodes = models.JSONField(default=list, blank=True)
    lost_steps = models.PositiveIntegerField(null=True, blank=True)
    lost_gpu_hours = models.FloatField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-detected_at", "-id"]
        indexes = [
            models.Index(fields=["cluster", "detected_at"], name="incident_cluster_at"),
            models.Index(fields=["outcome"], name="incident_outcome"),
            # The notifications collector reads incidents opened or closed since its last run.
            models.Index(fields=["detected_at"], name="incident_detected_at"),
            models.Index(fields=["closed_at"], name="incident_closed_at"),
            models.Index(fields=["deadline_passed_at"], name="incident_deadline_passed"),
        ]
        constraints = [
            # One incident per failed attempt: a cycle that sees it again adds nothing.
            models.UniqueConstraint(fields=["job"], name="incident_one_per_job")
        ]

    def __str__(self) -> str:
        return f"{self.signal} of {self.job_id}"

    @property
    def time_to_detect_s(self) -> float:
        return max(0.0, (self.detected_at - self.stopped_at).total_seconds())

    @property
    def is_active(self) -> bool:
        return self.outcome in self.ACTIVE_OUTCOMES


class SuspectNode(models.Model):
    """A node the evidence points at, until an operator clears it. The evidence comes from
    one source, named by ``kind``: an incident of a run (``incident``), or a restore drill
    whose bit-exact comparison failed on this node while another drill of the same
    checkpoint passed the same comparison on other nodes (``drill``, silent data
    corruption; ``recovery.sdc``)."""

    class Kind(models.TextChoices):
        INCIDENT = "incident", "an incident of a run"
        SILENT_DATA_CORRUPTION = "sdc", "silent data corruption"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="suspicions")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.INCIDENT)
    incident = models.ForeignKey(
        Incident, null=True, blank=True, on_delete=models.CASCADE, related_name="suspicions"
    )
    # Silent data corruption: the drill that failed its bit-exact comparison on this node,
    # and the drill that passed the same comparison on other nodes.
    drill = models.ForeignKey(
        RestoreDrill,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="sdc_suspicions",
    )
    passed_drill = models.ForeignKey(
        RestoreDrill, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    evidence = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    cleared_at = models.DateTimeField(null=True, blank=True)
    cleared_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]
        # The notifications collector reads the suspicions of silent data corruption since
        # its last run.
        indexes = [models.Index(fields=["kind", "created_at"], name="suspect_kind_created")]
        constraints = [
            models.UniqueConstraint(fields=["node", "incident"], name="suspect_once_per_incident"),
            # Detection runs every cycle: a drill names a node once.
            models.UniqueConstraint(fields=["node", "drill"], name="suspect_once_per_drill"),
            # Exactly one source of evidence, the one its kind says.
            models.CheckConstraint(
                name="suspect_one_source_of_evidence",
                condition=(
                    Q(kind="incident", incident__isnull=False, drill__isnull=True)
                    | Q(kind="sdc", incident__isnull=True, drill__isnull=False)
                ),
            ),
        ]

    def __str__(self) -> str:
        source = (
            f"incident {self.incident_id}"
            if self.kind == self.Kind.INCIDENT
            else f"drill {self.drill_id} (silent data corruption)"
        )
        return f"{self.node_id} suspected in {source}"

    @property
    def is_silent_data_corruption(self) -> bool:
        return self.kind == self.Kind.SILENT_DATA_CORRUPTION


class JobProgress(models.Model):
    """What the watcher last saw of a running job's progress, on Gantry's own clock (the
    nodes' clocks are not compared with it): when its metrics last grew, and when its run
    directory was last read at all. A hang needs both: a directory Gantry could not read
    is no evidence of anything."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="recovery_progress")
    metrics_offset = models.BigIntegerField(default=0)
    grew_at = models.DateTimeField()
    seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"progress of {self.job_id}"
