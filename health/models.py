"""What the node probes found: each probe as received, the latest verdict per node and
per GPU, and the state changes as events. Written only by ``health.services.probe_record``.
"""

from __future__ import annotations

from django.db import models

from nodes.models import HealthState, Node

__all__ = ["GpuHealth", "HealthAction", "HealthEvent", "HealthState", "NodeHealth", "NodeProbe"]


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
        indexes = [models.Index(fields=["node", "-at"], name="healthevent_node_at")]

    def __str__(self) -> str:
        where = f"gpu{self.gpu_index}" if self.gpu_index is not None else "node"
        return f"{self.node} {where}: {self.from_state} → {self.to_state}"
