"""Inventory: clusters, their nodes and GPUs, and the network topology between them.

Rows under a cluster mirror what Slurm reports; Gantry updates them on sync and never
deletes a node that disappears (it is marked ``gone``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from nodes.environment import extra_allowed_problems
from slurm.certificates import check_source_addresses

slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{0,62}$",
    "Use lower-case letters, digits and dashes (at most 63), starting with a letter or digit.",
)
remote_path_validator = RegexValidator(
    r"^/[A-Za-z0-9._/+-]*$",
    "Use an absolute path of letters, digits and . _ / + - only.",
)
unix_user_validator = RegexValidator(
    r"^[a-z_][a-z0-9_-]{0,31}$", "Use a valid Unix user name (lower-case, at most 32)."
)


def source_addresses_validator(value: str) -> None:
    """Networks certificates may be used from: CIDR, separated by commas or spaces."""
    try:
        check_source_addresses(value)
    except ValueError as error:
        raise ValidationError(str(error)) from None


def extra_allowed_environment_validator(value: Any) -> None:
    """An operator's additions to the environment allow-list (``nodes.environment``)."""
    problems = extra_allowed_problems(value)
    if problems:
        raise ValidationError(problems)


class UserAuth(models.TextChoices):
    """How Gantry logs in to a cluster as the researcher whose work it runs."""

    CERTIFICATE = "certificate", "short-lived SSH certificates signed by Gantry's user CA"
    USER_KEYS = "user_keys", "a key pair per user (the user installs its public key)"
    SERVICE_ACCOUNT = (
        "service_account",
        "legacy: everything runs as the service account (no per-user identities)",
    )


class Cluster(models.Model):
    UserAuth = UserAuth

    class SyncStatus(models.TextChoices):
        NEVER = "never", "never synced"
        OK = "ok", "ok"
        ERROR = "error", "error"

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    description = models.CharField(max_length=255, blank=True)
    is_default = models.BooleanField(default=False)

    ssh_host = models.CharField("SSH host", max_length=255)
    ssh_port = models.PositiveIntegerField(
        "SSH port", default=22, validators=[MinValueValidator(1), MaxValueValidator(65535)]
    )
    ssh_user = models.CharField("SSH user", max_length=32, validators=[unix_user_validator])
    # A reference to a private key file under GANTRY_DATA_DIR/ssh (0600); never the key itself.
    ssh_key_name = models.CharField(
        "SSH key", max_length=128, help_text="File name of the private key under the data dir."
    )
    host_key_type = models.CharField(max_length=64, blank=True)
    host_key_fingerprint = models.CharField(
        "pinned host key fingerprint",
        max_length=128,
        blank=True,
        help_text="SHA256:… of the server's host key; connections to any other key are refused.",
    )
    host_key_line = models.TextField(
        blank=True, help_text="The known_hosts line pinned for this cluster."
    )
    workdir = models.CharField("work directory", max_length=512, validators=[remote_path_validator])
    python = models.CharField(
        "Python on the cluster", max_length=512, validators=[remote_path_validator]
    )
    default_partition = models.CharField(max_length=64, blank=True)
    # How old the newest proven checkpoint of a running job may get (operators set it);
    # older is a breach: listed on the overview and notified. Empty: no limit.
    proven_checkpoint_max_age_minutes = models.PositiveIntegerField(
        "maximum age of a running job's newest proven checkpoint (minutes)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(525600)],
        help_text="A running job whose newest proven checkpoint (a restore drill passed) is "
        "older than this, or that has run this long without one, is a breach. Empty: no limit.",
    )

    # What researchers may set for their ranks on this cluster on top of Gantry's default
    # allow-list (nodes.environment); a hard-denied name stays refused whatever is here.
    extra_allowed_environment = models.JSONField(
        "environment variables also allowed",
        default=list,
        blank=True,
        validators=[extra_allowed_environment_validator],
        help_text="Names or PREFIX* patterns researchers may also set for their jobs, e.g. "
        '["NCCL_IB_QPS_PER_CONNECTION", "MYLAB_*"]. Names that load code (LD_*, PYTHON*, '
        "BASH_ENV, *PATH*, *_PLUGIN, ...) can never be allowed.",
    )

    slurm_version = models.CharField(max_length=32, blank=True)
    slurm_cluster_name = models.CharField(max_length=64, blank=True)
    accounting_available = models.BooleanField(null=True)

    sync_status = models.CharField(
        max_length=16, choices=SyncStatus.choices, default=SyncStatus.NEVER
    )
    last_sync_at = models.DateTimeField(null=True, blank=True)
    last_sync_ok_at = models.DateTimeField(null=True, blank=True)
    last_sync_error = models.TextField(blank=True)
    sync_failures = models.PositiveIntegerField(
        default=0, help_text="Consecutive failed syncs; drives the retry back-off."
    )
    next_sync_at = models.DateTimeField(null=True, blank=True)
    next_reconcile_at = models.DateTimeField(null=True, blank=True)
    reconcile_idle_cycles = models.PositiveIntegerField(default=0)
    last_reconcile_at = models.DateTimeField(null=True, blank=True)
    last_reconcile_error = models.TextField(blank=True)
    # sacct failing on a cluster that has accounting: squeue is still applied every cycle,
    # sacct is retried with back-off, and the cluster shows the error.
    accounting_failures = models.PositiveIntegerField(default=0)
    accounting_retry_at = models.DateTimeField(null=True, blank=True)
    accounting_error = models.TextField(blank=True)
    accounting_failing_since = models.DateTimeField(null=True, blank=True)

    # How Gantry acts for a user on this cluster (see nodes.access.identities). Rows that existed
    # before per-user identities were migrated to CERTIFICATE: fail closed, nobody submits
    # until an operator maps them (or opts this cluster into SERVICE_ACCOUNT explicitly).
    user_auth = models.CharField(
        "how Gantry acts as a user",
        max_length=16,
        choices=UserAuth.choices,
        default=UserAuth.CERTIFICATE,
    )
    # The public half of Gantry's user CA for this cluster (the private half is a 0600 file
    # under the data directory): what the login node's TrustedUserCAKeys file holds.
    user_ca_public_key = models.TextField("user CA public key", blank=True)
    # A rotation's new CA (manage.py gantry_ca_rotate): login nodes trust it beside the
    # current one until ``--finish`` makes it the one Gantry signs with.
    user_ca_next_public_key = models.TextField("next user CA public key", blank=True)
    # sshd's ``source-address`` on every certificate: the networks Gantry's processes
    # connect from. Empty: the option is left out (any address).
    certificate_source_addresses = models.CharField(
        "certificates only from",
        max_length=1000,
        blank=True,
        validators=[source_addresses_validator],
        help_text="Networks (CIDR, comma-separated) Gantry's workers and web servers reach the "
        "login node from, e.g. 10.1.0.0/16, 192.0.2.7. Certificates carry them as "
        "source-address: the login node refuses them from anywhere else. Empty: any address.",
    )
    # The account restore drills that count as proof run as (``drills.attestation``): one
    # no researcher is mapped to and none can act as. Empty: drills run as the checkpoint's
    # owner and are self-attested, never proof.
    verifier_account = models.CharField(
        "drill verifier account",
        max_length=32,
        blank=True,
        validators=[unix_user_validator],
        help_text="Unix user that runs restore drills counting as proof: not the service "
        "account, not any researcher's. Empty: drills are self-attested (run as the owner).",
    )

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=Q(is_default=True), name="one_default_cluster"
            ),
            models.UniqueConstraint(
                fields=["ssh_host", "ssh_port", "ssh_user"], name="cluster_unique_login"
            ),
            # The service account can act for Gantry itself; a verifier must be neither.
            models.CheckConstraint(
                name="cluster_verifier_not_service_account",
                condition=Q(verifier_account="") | ~Q(verifier_account=models.F("ssh_user")),
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.verifier_account and self.verifier_account == self.ssh_user:
            raise ValidationError(
                {
                    "verifier_account": "the service account cannot verify drills: pick an "
                    "account of its own that no researcher is mapped to"
                }
            )


class Partition(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="partitions")
    name = models.CharField(max_length=64)
    nodes_expression = models.CharField(max_length=1024, blank=True)
    is_default = models.BooleanField(default=False)
    state = models.CharField(max_length=32, blank=True)
    max_time_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Empty means unlimited."
    )
    total_cpus = models.PositiveIntegerField(default=0)
    total_nodes = models.PositiveIntegerField(default=0)
    # Slurm lets every account and group submit here (AllowAccounts=ALL, AllowGroups=ALL,
    # no DenyAccounts, as its last ``scontrol show partition`` printed).
    open_to_all = models.BooleanField(default=False)
    gone = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="partition_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class Switch(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="switches")
    name = models.CharField(max_length=128)
    level = models.PositiveSmallIntegerField(
        default=0, help_text="0 = leaf, higher = closer to the root."
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    link_speed = models.PositiveIntegerField(null=True, blank=True)
    gone = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster", "-level", "name"]
        verbose_name_plural = "switches"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="switch_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class HealthState(models.TextChoices):
    """A node's GPU health as the last probe judged it (``health.evaluate.State``)."""

    OK = "ok", "ok"
    WARNING = "warning", "warning"
    CRITICAL = "critical", "critical"
    UNKNOWN = "unknown", "unknown (never probed, or the probe could not tell)"


class AcceptanceState(models.TextChoices):
    """A node's newest acceptance finding ("": never tested, or nothing conclusive)."""

    NONE = "", "not tested"
    CERTIFIED = "certified", "certified (passed an acceptance run)"
    CONVICTED = "convicted", "convicted (an acceptance run found it at fault)"


class Node(models.Model):
    HealthState = HealthState

    class State(models.TextChoices):
        IDLE = "idle"
        MIXED = "mixed"
        ALLOCATED = "allocated"
        COMPLETING = "completing"
        DRAINING = "draining"
        DRAINED = "drained"
        DOWN = "down"
        FAIL = "fail"
        FAILING = "failing"
        INVAL = "inval", "invalid (registration mismatch)"
        ERROR = "error"
        RESERVED = "reserved"
        FUTURE = "future"
        UNKNOWN = "unknown"
        GONE = "gone", "gone (no longer reported by Slurm)"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=128)
    address = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.UNKNOWN)
    state_flags = models.JSONField(default=list, blank=True)
    reason = models.CharField(max_length=512, blank=True)
    cpus_total = models.PositiveIntegerField(default=0)
    cpus_alloc = models.PositiveIntegerField(default=0)
    memory_mb = models.PositiveIntegerField(default=0)
    memory_alloc_mb = models.PositiveIntegerField(default=0)
    features = models.JSONField(default=list, blank=True)
    partitions = models.JSONField(default=list, blank=True)
    # ",batch,gpu,": the partitions as text, so "in partition X" is one indexed-friendly
    # LIKE on every database (JSON containment is not portable to SQLite).
    partitions_text = models.CharField(max_length=1024, blank=True, default="")
    leaf_switch = models.ForeignKey(
        Switch, null=True, blank=True, on_delete=models.SET_NULL, related_name="nodes"
    )
    last_seen_at = models.DateTimeField(null=True, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    # GPU/node health from the node probe (``health.services.probe_record`` sets it; the
    # health app holds the evidence). Here so placement, below health, can read it:
    # critical nodes are avoided, warning ones dispreferred, unknown (never probed) neutral.
    health_state = models.CharField(
        max_length=16, choices=HealthState.choices, default=HealthState.UNKNOWN
    )
    # The node's newest acceptance finding (``acceptance`` sets it when a certificate is
    # issued): certified nodes are preferred by placement, convicted ones never proposed.
    acceptance_state = models.CharField(
        max_length=16, choices=AcceptanceState.choices, default="", blank=True
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_name"),
            models.CheckConstraint(
                condition=Q(cpus_alloc__lte=models.F("cpus_total")), name="node_cpus_alloc_le_total"
            ),
        ]
        indexes = [models.Index(fields=["cluster", "state"], name="node_cluster_state")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"

    def save(self, *args: object, **kwargs: object) -> None:
        self.partitions_text = self.partitions_as_text(list(self.partitions or []))
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and "partitions" in update_fields:  # type: ignore[operator]
            kwargs["update_fields"] = [*update_fields, "partitions_text"]  # type: ignore[misc]
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    @staticmethod
    def partitions_as_text(partitions: list[str]) -> str:
        return "," + ",".join(partitions) + "," if partitions else ""

    @property
    def is_schedulable(self) -> bool:
        return self.state in {self.State.IDLE, self.State.MIXED}

    @property
    def gpu_count(self) -> int:
        return len(self.gpus.all())

    def memory_per_gpu_mb(self, gpu_count: int) -> int | None:
        return self.memory_mb // gpu_count if gpu_count else None

    def cpus_per_gpu(self, gpu_count: int) -> float | None:
        return self.cpus_total / gpu_count if gpu_count else None


class Gpu(models.Model):
    class State(models.TextChoices):
        FREE = "free"
        ALLOCATED = "allocated"
        UNHEALTHY = "unhealthy"
        UNKNOWN = "unknown"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    gpu_type = models.CharField("type", max_length=64, blank=True)
    memory_mb = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.UNKNOWN)
    health = models.CharField(max_length=255, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node", "index"]
        verbose_name = "GPU"
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index")]
        indexes = [models.Index(fields=["gpu_type", "state"], name="gpu_type_state")]

    def __str__(self) -> str:
        return f"{self.node}/gpu{self.index} ({self.gpu_type or 'gpu'})"


class Link(models.Model):
    """A connection: GPU↔GPU inside a node, node→switch, or switch→switch."""

    class Kind(models.TextChoices):
        NVLINK = "nvlink", "NVLink"
        PCIE = "pcie", "PCIe"
        INFINIBAND = "infiniband", "InfiniBand"
        ETHERNET = "ethernet", "Ethernet"
        UNKNOWN = "unknown", "unknown"

    class Scope(models.TextChoices):
        INTRA_NODE = "intra_node", "GPU to GPU inside a node"
        NODE_SWITCH = "node_switch", "node to switch"
        SWITCH_SWITCH = "switch_switch", "switch to switch"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="links")
    scope = models.CharField(max_length=16, choices=Scope.choices)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.UNKNOWN)
    bandwidth_gbps = models.FloatField(null=True, blank=True)
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.CASCADE, related_name="links"
    )
    gpu_a = models.ForeignKey(
        Gpu, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    gpu_b = models.ForeignKey(
        Gpu, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    switch = models.ForeignKey(
        Switch, null=True, blank=True, on_delete=models.CASCADE, related_name="links"
    )
    upper_switch = models.ForeignKey(
        Switch, null=True, blank=True, on_delete=models.CASCADE, related_name="uplinks"
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                name="link_endpoints_match_scope",
                condition=(
                    Q(
                        scope="intra_node",
                        gpu_a__isnull=False,
                        gpu_b__isnull=False,
                        node__isnull=False,
                    )
                    | Q(scope="node_switch", node__isnull=False, switch__isnull=False)
                    | Q(scope="switch_switch", switch__isnull=False, upper_switch__isnull=False)
                ),
            ),
            models.UniqueConstraint(
                fields=["node", "switch"],
                condition=Q(scope="node_switch"),
                name="link_unique_node_switch",
            ),
            models.UniqueConstraint(
                fields=["switch", "upper_switch"],
                condition=Q(scope="switch_switch"),
                name="link_unique_switch_switch",
            ),
        ]

    def __str__(self) -> str:
        if self.scope == self.Scope.INTRA_NODE:
            return f"{self.gpu_a} ↔ {self.gpu_b} ({self.get_kind_display()})"
        if self.scope == self.Scope.NODE_SWITCH:
            return f"{self.node} → {self.switch} ({self.get_kind_display()})"
        return f"{self.switch} → {self.upper_switch} ({self.get_kind_display()})"


class NodeEvent(models.Model):
    """A change seen on a node: its state, its reason, or an operator action."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=32)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    message = models.CharField(max_length=512, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["node", "-at"], name="nodeevent_node_at")]

    def __str__(self) -> str:
        return f"{self.node}: {self.kind} {self.from_state}→{self.to_state}"


class ClusterIdentity(models.Model):
    """Which cluster account a Gantry user's work runs as on one cluster. Set by operators
    (admin, API, ``manage.py cluster_identity``), audited; a user without one cannot submit
    there. ``public_key``: for clusters in ``user_keys`` mode, the key the user installs."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="identities")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="cluster_identities"
    )
    account = models.CharField(
        "cluster account",
        max_length=32,
        validators=[unix_user_validator],
        help_text="The Unix user on the cluster this Gantry user's jobs run as.",
    )
    public_key = models.TextField(
        blank=True,
        help_text="user_keys mode: the public key to install in the account's authorized_keys.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster", "account"]
        verbose_name_plural = "cluster identities"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "user"], name="identity_unique_user"),
            models.UniqueConstraint(fields=["cluster", "account"], name="identity_unique_account"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}: {self.user} as {self.account}"
