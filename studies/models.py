"""Scaling studies: the same trainer workload at several scales, one job per point."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from jobs.models import Job
from nodes.models import Cluster


class ScalingStudy(models.Model):
    class Kind(models.TextChoices):
        STRONG = "strong", "strong scaling (fixed global batch)"
        WEAK = "weak", "weak scaling (fixed per-rank batch)"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="scaling_studies"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="scaling_studies")
    name = models.CharField(max_length=128)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    # Rank counts, ascending, e.g. [1, 2, 4].
    scales = models.JSONField(default=list)
    # The trainer workload shared by every point; the batch size is set per point.
    config = models.JSONField(default=dict)
    batch_size = models.PositiveIntegerField(
        validators=[MinValueValidator(1)],
        help_text="strong: the global batch (fixed); weak: the per-rank batch (fixed)",
    )
    warmup_steps = models.PositiveIntegerField(default=5)
    measured_steps = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)])
    partition = models.CharField(max_length=64)
    # Ranks per node: R ranks run on ceil(R / ranks_per_node) nodes.
    ranks_per_node = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    gpus_per_rank = models.PositiveSmallIntegerField(default=1)
    gpu_type = models.CharField(max_length=64, blank=True)
    time_limit_minutes = models.PositiveIntegerField(default=15, validators=[MinValueValidator(1)])
    use_placement = models.BooleanField(default=True)
    target_requested = models.BooleanField(
        default=False, help_text="Report the time to reach the quality target."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "scaling studies"
        indexes = [models.Index(fields=["owner", "-created_at"], name="study_owner_created")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.measured_steps


class StudyPoint(models.Model):
    """One scale of a study and the job that measured it."""

    study = models.ForeignKey(ScalingStudy, on_delete=models.CASCADE, related_name="points")
    ranks = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    nodes = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    tasks_per_node = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    per_rank_batch = models.PositiveIntegerField()
    global_batch = models.PositiveIntegerField()
    job = models.OneToOneField(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="study_point"
    )
    # The placement advice accepted when the point was submitted (nodelist, explanation).
    placement = models.JSONField(null=True, blank=True)
    # Steady-state figures, frozen once the job has ended and its files were read.
    results = models.JSONField(null=True, blank=True)
    submit_error = models.TextField(blank=True)

    class Meta:
        ordering = ["study", "ranks"]
        constraints = [
            models.UniqueConstraint(fields=["study", "ranks"], name="studypoint_unique_ranks")
        ]

    def __str__(self) -> str:
        return f"{self.study.name} @ {self.ranks} ranks"
