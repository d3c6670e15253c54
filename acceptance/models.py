"""Acceptance runs of an allocation, their steps (each one Slurm job through the one
lifecycle, ``runs.lifecycle``), the certificate a run issues, and the busbw thresholds
operators set.

A run tests a set of nodes an operator chose (a partition, a node list, the nodes of a
job) in tiers, in order, stopping at the first that fails (``acceptance.orchestrate``):
inventory and stack, collectives per level of the switch tree, bad-node isolation when a
level fails, and, when asked for, sustained training and recovery. When it ends it issues
one certificate, immutable from then on.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from drills.models import RestoreDrill
from jobs.models import Job
from nodes.models import Cluster
from runs.models import SlurmTracked


class Tier(models.TextChoices):
    INVENTORY = "inventory", "inventory and stack"
    COLLECTIVES = "collectives", "collectives per level"
    ISOLATION = "isolation", "bad-node isolation"
    SUSTAINED = "sustained", "sustained training"
    RECOVERY = "recovery", "recovery"


# The order tiers run in; isolation runs only when a collectives level failed.
TIER_ORDER = (Tier.INVENTORY, Tier.COLLECTIVES, Tier.ISOLATION, Tier.SUSTAINED, Tier.RECOVERY)
# What an operator asks for (isolation comes with collectives); the last two are optional.
REQUESTABLE_TIERS = (Tier.INVENTORY, Tier.COLLECTIVES, Tier.SUSTAINED, Tier.RECOVERY)
DEFAULT_TIERS = (Tier.INVENTORY, Tier.COLLECTIVES)


class Verdict(models.TextChoices):
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive", "inconclusive (could not measure or judge)"


class AcceptanceRun(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        FINISHED = "finished"
        CANCELLED = "cancelled"

    class Scope(models.TextChoices):
        PARTITION = "partition", "every node of a partition"
        NODES = "nodes", "a node list"
        JOB = "job", "the nodes of a job"

    ACTIVE_STATES = frozenset({State.QUEUED, State.RUNNING})
    FINAL_STATES = frozenset({State.FINISHED, State.CANCELLED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="acceptance_runs")
    scope = models.CharField(max_length=16, choices=Scope.choices)
    # What the operator chose: the partition's name, the node list expression, the job id.
    scope_value = models.CharField(max_length=512)
    # The partition the steps' Slurm jobs run in (every node of the set is in it).
    partition = models.CharField(max_length=128)
    # The node names the set resolved to when the run started (sorted, natural order).
    nodes = models.JSONField(default=list)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="acceptance_runs",
    )
    tiers = models.JSONField(default=list, help_text="the tiers asked for, in run order")
    # Options of the collectives and sustained tiers (sizes, iterations, minutes).
    options = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    # The tier in progress ("" before the first and after the last).
    current_tier = models.CharField(max_length=16, choices=Tier.choices, blank=True)
    # Each tier's outcome as it ended: {tier: {verdict, reason}}.
    outcomes = models.JSONField(default=dict, blank=True)
    verdict = models.CharField(max_length=16, choices=Verdict.choices, blank=True)
    reason = models.TextField(blank=True)
    convicted = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["cluster", "state"], name="acceptance_run_cluster_state"),
            models.Index(fields=["-created_at"], name="acceptance_run_created"),
        ]
        constraints = [
            models.CheckConstraint(
                name="acceptance_run_verdict_only_when_ended",
                condition=Q(verdict="") | Q(state__in=["finished", "cancelled"]),
            ),
        ]

    def __str__(self) -> str:
        return f"acceptance {str(self.id)[:8]} of {self.cluster.name}:{self.scope_value}"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE_STATES


class AcceptanceStep(SlurmTracked):
    """One measurement: a Slurm job over a group of nodes (the inventory probe, one
    collective over a level's group, an isolation round's group)."""

    class State(models.TextChoices):
        QUEUED = "queued"
        SUBMITTING = "submitting"
        SUBMIT_UNKNOWN = "submit_unknown", "sbatch outcome unknown"
        PENDING = "pending"
        RUNNING = "running"
        FINISHED = "finished"
        CANCELLED = "cancelled"

    ACTIVE_STATES = frozenset(
        {State.QUEUED, State.SUBMITTING, State.SUBMIT_UNKNOWN, State.PENDING, State.RUNNING}
    )
    FINAL_STATES = frozenset({State.FINISHED, State.CANCELLED})
    SLURM_ACTIVE_STATES = frozenset({State.PENDING, State.RUNNING})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(AcceptanceRun, on_delete=models.CASCADE, related_name="steps")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    tier = models.CharField(max_length=16, choices=Tier.choices)
    # node | leaf | spine for collectives; "" for the inventory probe.
    level = models.CharField(max_length=8, blank=True)
    # Isolation: screen | bisect | confirm | repeat, and its round (1-based); else "" / 0.
    purpose = models.CharField(max_length=16, blank=True)
    round = models.PositiveSmallIntegerField(default=0)
    nodes = models.JSONField(default=list)
    # Canonical form of (tier, level, purpose, round, nodes): one step per measurement.
    key = models.CharField(max_length=255)
    tasks_per_node = models.PositiveSmallIntegerField(default=1)
    gpus_per_node = models.PositiveSmallIntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    # The threshold fixed when the step was made (collectives): busbw, source, detail.
    threshold = models.FloatField(null=True, blank=True)
    threshold_source = models.CharField(max_length=16, blank=True)
    threshold_detail = models.CharField(max_length=512, blank=True)
    # What was measured (bounded, the parts the verdict rests on), e.g. busbw per op.
    measured = models.JSONField(null=True, blank=True)
    busbw = models.FloatField(null=True, blank=True)
    # Sustained training: the fixed configuration the step runs (trainer config, device,
    # precision, world size, GPU type, trainer digest, the reference it is compared with)
    # and its key: a record or reference counts only for exactly the same key.
    configuration = models.JSONField(null=True, blank=True)
    config_key = models.CharField(max_length=64, blank=True)
    verdict = models.CharField(max_length=16, choices=Verdict.choices, blank=True)
    reason = models.TextField(blank=True)
    evidence = models.JSONField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "key"]
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="acceptance_step_one_per_key"),
            models.CheckConstraint(
                name="acceptance_step_verdict_only_when_ended",
                condition=Q(verdict="") | Q(state__in=["finished", "cancelled"]),
            ),
        ]
        indexes = [
            models.Index(fields=["cluster", "state"], name="acceptance_step_cluster_state"),
            models.Index(fields=["cluster", "tier", "config_key"], name="acceptance_step_config"),
        ]

    def __str__(self) -> str:
        where = f" {self.level}" if self.level else ""
        return f"{self.tier}{where} step over {','.join(self.nodes)}"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES


class RecoveryTrial(models.Model):
    """The recovery tier of a run (``acceptance.recovery_tier``): the training job it
    submitted with one rank set to die mid-run, the lineage recovery made of it, and the
    restore drill the tier asked for afterwards."""

    run = models.OneToOneField(
        AcceptanceRun, on_delete=models.CASCADE, related_name="recovery_trial"
    )
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The trainer fault set on the job (``TRAINER_FAULT``) and the step it fires at.
    fault = models.CharField(max_length=64)
    fault_step = models.PositiveIntegerField()
    drill = models.ForeignKey(
        RestoreDrill, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Why the drill service last refused to start the drill (it is asked again next cycle).
    drill_refused = models.TextField(blank=True)
    # What the tier waits for now, in words (shown on the run's page).
    stage = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField()
    # When the tier ended and cancelled what was left of the lineage (and what it could not).
    cleaned_up_at = models.DateTimeField(null=True, blank=True)
    cleanup_problems = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"recovery trial of {self.run_id}"


class Certificate(models.Model):
    """What a run found, as one document; immutable once issued."""

    run = models.OneToOneField(AcceptanceRun, on_delete=models.CASCADE, related_name="certificate")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    nodes = models.JSONField(default=list)
    # ",n1,n2," as text: "certificates of node X" is one LIKE on every database.
    nodes_text = models.CharField(max_length=4096)
    convicted = models.JSONField(default=list, blank=True)
    document = models.JSONField()
    # sha256 of the canonical JSON of ``document``.
    digest = models.CharField(max_length=64)
    issued_at = models.DateTimeField()

    class Meta:
        ordering = ["-issued_at"]
        indexes = [models.Index(fields=["cluster", "-issued_at"], name="certificate_issued")]

    def __str__(self) -> str:
        return f"certificate {self.pk} ({self.verdict}) of {len(self.nodes)} nodes"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and Certificate.objects.filter(pk=self.pk).exists():
            raise ValidationError("a certificate is immutable once issued")
        super().save(*args, **kwargs)


class BusbwThreshold(models.Model):
    """A busbw an operator set for a scope (``acceptance.thresholds.OperatorThreshold``):
    a cluster, a partition (empty: every partition), a level and a collective."""

    class Level(models.TextChoices):
        NODE = "node", "within a node"
        LEAF = "leaf", "within a leaf switch"
        SPINE = "spine", "across the spine"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    partition = models.CharField(max_length=128, blank=True)
    level = models.CharField(max_length=8, choices=Level.choices)
    op = models.CharField(max_length=32, default="all_reduce")
    busbw = models.FloatField(help_text="bytes per second")
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "partition", "level", "op"], name="busbw_threshold_one_per_scope"
            ),
            models.CheckConstraint(name="busbw_threshold_positive", condition=Q(busbw__gt=0)),
        ]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.partition or '*'} {self.level} {self.op} >= {self.busbw:g}"
