"""What the node probes found: each probe as received, the latest verdict per node and
per GPU, and the state changes as events. Written only by ``health.services.probe_record``.
"""

from __future__ import annotations

import posixpath

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from nodes.models import Cluster, HealthState, Node, remote_path_validator

__all__ = [
    "GpuHealth",
    "HealthAction",
    "HealthEvent",
    "HealthSource",
    "HealthState",
    "NodeHealth",
    "NodeProbe",
]


class HealthAction(models.TextChoices):
    """The remediation ladder, mildest first (``health.evaluate.ACTIONS``)."""

    NONE = "none", "nothing to do"
    WATCH = "watch", "keep watching"
    DRAIN = "drain", "drain the node"
    RESET_GPU = "reset_gpu", "drain, then reset the GPU"
    REBOOT = "reboot", "drain, then reboot the node"
    SERVICE = "service", "drain and send for service (RMA)"


class NodeProbe(models.Model):
    """One probe document as the node's probe job printed it (bounded), kept for evidence;
    only the newest few per node are kept."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_probes")
    taken_at = models.DateTimeField()
    received_at = models.DateTimeField(auto_now_add=True)
    document = models.JSONField(default=dict)
    parse_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-taken_at", "-id"]
        indexes = [models.Index(fields=["node", "-taken_at"], name="nodeprobe_node_taken")]

    def __str__(self) -> str:
        return f"{self.node} probe at {self.taken_at:%Y-%m-%d %H:%M}"


class NodeHealth(models.Model):
    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="health")
    state = models.CharField(
        max_length=16, choices=HealthState.choices, default=HealthState.UNKNOWN
    )
    reasons = models.JSONField(default=list, blank=True)
    action = models.CharField(
        max_length=16, choices=HealthAction.choices, default=HealthAction.WATCH
    )
    stack = models.JSONField(default=dict, blank=True)
    stack_fingerprint = models.CharField(max_length=32, blank=True)
    boot_id = models.CharField(max_length=64, blank=True)
    probed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "node health"

    def __str__(self) -> str:
        return f"{self.node}: {self.state}"


class GpuHealth(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpu_health")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=128, blank=True)
    state = models.CharField(
        max_length=16, choices=HealthState.choices, default=HealthState.UNKNOWN
    )
    reasons = models.JSONField(default=list, blank=True)
    action = models.CharField(
        max_length=16, choices=HealthAction.choices, default=HealthAction.WATCH
    )
    readings = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node", "index"]
        verbose_name = "GPU health"
        verbose_name_plural = "GPU health"
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpuhealth_unique_index")
        ]

    def __str__(self) -> str:
        return f"{self.node}/gpu{self.index}: {self.state}"


class HealthEvent(models.Model):
    """A change of a node's or a GPU's health state (``gpu_index`` None: the node's)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_events")
    gpu_index = models.PositiveSmallIntegerField(null=True, blank=True)
    at = models.DateTimeField()
    from_state = models.CharField(max_length=16, choices=HealthState.choices)
    to_state = models.CharField(max_length=16, choices=HealthState.choices)
    reason = models.CharField(max_length=1024, blank=True)
    action = models.CharField(
        max_length=16, choices=HealthAction.choices, default=HealthAction.NONE
    )

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["node", "-at"], name="healthevent_node_at"),
            # The notifications collector reads the changes since its cursor by time.
            models.Index(fields=["at"], name="healthevent_at"),
        ]

    def __str__(self) -> str:
        where = f"gpu{self.gpu_index}" if self.gpu_index is not None else "node"
        return f"{self.node} {where}: {self.from_state} → {self.to_state}"


def health_directory_validator(value: str) -> None:
    """Where the health-check hook writes ``<node>.json``: an absolute path by the same rule
    as ``Cluster.workdir`` (letters, digits and ``. _ / + -``), normal (no ``.`` or ``..``
    component, no ``//``, no trailing ``/``) and not ``/`` itself."""
    remote_path_validator(value)
    if value == "/" or posixpath.normpath(value) != value or value.startswith("//"):
        raise ValidationError(
            "Use a normal absolute directory: no '.' or '..' parts, no '//', no trailing '/'."
        )


class HealthSource(models.Model):
    """Where a cluster's health-check hook (``scripts/gantry-health-check``, Slurm's
    HealthCheckProgram, run as root on every node) leaves its probes, and how often Gantry
    collects them (``health.collection``). Operators change it (audited); the collector
    writes the figures of its last run."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="health_source")
    directory = models.CharField(
        "health directory",
        max_length=512,
        validators=[health_directory_validator],
        help_text="Absolute path on the login node (shared with the compute nodes) where the "
        "hook writes <node>.json; root-owned, 0755.",
    )
    enabled = models.BooleanField(default=True)
    interval_seconds = models.PositiveIntegerField(
        "collect every (seconds)",
        default=60,
        validators=[MinValueValidator(10), MaxValueValidator(3600)],
        help_text="At least the cluster's HealthCheckInterval. A probe older than three "
        "intervals makes its node unknown (stale).",
    )
    # When the next collection is due; beat claims it with a conditional update.
    next_collect_at = models.DateTimeField(null=True, blank=True)
    last_collected_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # The cost of the last collection: remote commands, bytes of answer, seconds; and what
    # it found (files read, unchanged, refused, for unknown nodes, stale).
    last_commands = models.PositiveIntegerField(default=0)
    last_bytes = models.PositiveBigIntegerField(default=0)
    last_seconds = models.FloatField(default=0.0)
    last_counts = models.JSONField(default=dict, blank=True)
    # Per file name, the "<mtime_ns>:<size>" already recorded: an unchanged file is neither
    # sent again nor recorded twice.
    seen = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        verbose_name = "health source"

    def __str__(self) -> str:
        return f"{self.cluster.name}: {self.directory}"

    @property
    def stale_after_seconds(self) -> int:
        return 3 * self.interval_seconds
