from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest

from core.access import request_user
from core.admin_helpers import ServiceDeleteMixin, admin_changelist_link, admin_link
from core.errors import ApplicationError
from nodes.access.admin import ClusterIdentityActions, ClusterIdentityAdmin
from nodes.models import Cluster, Gpu, Link, Node, NodeEvent, Partition, Switch
from nodes.registration import cluster_register
from nodes.services import (
    cluster_delete,
    cluster_sync_request,
    cluster_update,
    node_drain,
    node_resume,
)

# ClusterIdentityAdmin registers itself on import (nodes.access.admin).
__all__ = ["ClusterAdmin", "ClusterIdentityAdmin"]

# What Slurm owns: shown, never edited by hand (the next sync would undo it anyway).
NODE_SLURM_FIELDS = (
    "cluster",
    "name",
    "address",
    "state",
    "state_flags",
    "reason",
    "cpus_total",
    "cpus_alloc",
    "memory_mb",
    "memory_alloc_mb",
    "features",
    "partitions",
    "leaf_switch",
    "last_seen_at",
    "state_changed_at",
    "updated_at",
)


class PartitionInline(admin.TabularInline):
    model = Partition
    extra = 0
    can_delete = False
    readonly_fields = (
        "name",
        "is_default",
        "state",
        "max_time_minutes",
        "total_nodes",
        "total_cpus",
        "gone",
    )
    fields = readonly_fields
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class ClusterRegisterForm(forms.ModelForm):
    """Registering a cluster connects to it: the host key is fetched and pinned, Slurm probed."""

    private_key = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "cols": 70}),
        help_text="Unencrypted private key (OpenSSH or PEM). Stored 0600 in the data directory, "
        "never in the database, never shown again.",
    )
    expected_fingerprint = forms.CharField(
        required=False,
        help_text="The login node's host key fingerprint (SHA256:...), checked on a trusted "
        "path. Registration is refused if the server presents another key.",
    )
    trust_on_first_use = forms.BooleanField(
        required=False,
        label="Trust the key the server presents now",
        help_text="Only without a fingerprint: pins whatever key answers (the audit log "
        "records it). Leave unticked to be shown the key and confirm it first.",
    )

    class Meta:
        model = Cluster
        fields = [
            "name",
            "description",
            "is_default",
            "ssh_host",
            "ssh_port",
            "ssh_user",
            "workdir",
            "python",
            "default_partition",
            "user_auth",
        ]

    def __init__(self, *args: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request = request
        self.registration: Any = None
        # Left out: the default (certificates) for a new cluster.
        self.fields["user_auth"].required = False

    def _post_clean(self) -> None:
        # cluster_register validated and saved the row in clean(); the model's own
        # uniqueness checks would now find that very row.
        return

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            self.registration = cluster_register(
                actor=request_user(self.request) if self.request else None,
                name=data["name"],
                description=data.get("description", ""),
                ssh_host=data["ssh_host"],
                ssh_port=data["ssh_port"],
                ssh_user=data["ssh_user"],
                private_key=data["private_key"],
                workdir=data["workdir"],
                python=data["python"],
                default_partition=data.get("default_partition", ""),
                expected_fingerprint=data.get("expected_fingerprint") or None,
                is_default=data.get("is_default", False),
                trust_on_first_use=bool(data.get("trust_on_first_use")),
                user_auth=data.get("user_auth") or None,
            )
        except ApplicationError as error:
            field = getattr(error, "field", None)
            target = field if field in self.fields else None
            if field == "host_key_fingerprint":
                target = "expected_fingerprint"
            raise forms.ValidationError(
                {target: error.message} if target else error.message
            ) from None
        return data


@admin.register(Cluster)
class ClusterAdmin(ClusterIdentityActions, ServiceDeleteMixin, admin.ModelAdmin):
    """Registering connects (pins the host key, probes Slurm); changes and deletions go
    through the services, validated and audited."""

    delete_service = staticmethod(cluster_delete)
    delete_argument = "cluster"
    list_display = [
        "name",
        "is_default",
        "ssh_login",
        "slurm_version",
        "sync_status",
        "last_sync_at",
        "node_summary",
        "short_error",
    ]
    list_filter = ["sync_status", "is_default", "accounting_available"]
    search_fields = ["name", "ssh_host", "slurm_cluster_name", "description"]
    readonly_fields = [
        "host_key_type",
        "host_key_fingerprint",
        "host_key_line",
        "slurm_version",
        "slurm_cluster_name",
        "accounting_available",
        "sync_status",
        "last_sync_at",
        "last_sync_ok_at",
        "last_sync_error",
        "sync_failures",
        "next_sync_at",
        "created_at",
        "updated_at",
        "nodes_link",
        "user_auth",
        "user_ca",
        "identities_link",
    ]
    fieldsets = [
        (None, {"fields": ["name", "description", "is_default"]}),
        (
            "Login",
            {"fields": ["ssh_host", "ssh_port", "ssh_user", "ssh_key_name"]},
        ),
        (
            "Pinned host key",
            {"fields": ["host_key_type", "host_key_fingerprint", "host_key_line"]},
        ),
        ("On the cluster", {"fields": ["workdir", "python", "default_partition"]}),
        (
            "Jobs run as the researcher",
            {
                "fields": [
                    "user_auth",
                    "user_ca",
                    "certificate_source_addresses",
                    "identities_link",
                ]
            },
        ),
        ("Work at risk", {"fields": ["proven_checkpoint_max_age_minutes"]}),
        ("Job environment", {"fields": ["extra_allowed_environment"]}),
        ("Restore drills that count as proof", {"fields": ["verifier_account"]}),
        (
            "Slurm (from the last probe and sync)",
            {
                "fields": [
                    "slurm_version",
                    "slurm_cluster_name",
                    "accounting_available",
                    "sync_status",
                    "last_sync_at",
                    "last_sync_ok_at",
                    "last_sync_error",
                    "sync_failures",
                    "next_sync_at",
                    "nodes_link",
                ]
            },
        ),
    ]
    inlines = [PartitionInline]
    actions = [
        "sync_now",
        "make_default",
        "create_user_ca",
        "use_certificates",
        "use_user_keys",
        "use_service_account",
    ]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            form_class = ClusterRegisterForm

            class BoundForm(form_class):  # type: ignore[valid-type,misc]
                def __init__(self, *args: Any, **kw: Any) -> None:
                    super().__init__(*args, request=request, **kw)

            return BoundForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return [
                (None, {"fields": ["name", "description", "is_default"]}),
                (
                    "Login (Gantry connects now to pin the host key and probe Slurm)",
                    {
                        "fields": [
                            "ssh_host",
                            "ssh_port",
                            "ssh_user",
                            "private_key",
                            "expected_fingerprint",
                            "trust_on_first_use",
                        ]
                    },
                ),
                ("On the cluster", {"fields": ["workdir", "python", "default_partition"]}),
                ("Jobs run as the researcher", {"fields": ["user_auth"]}),
            ]
        return super().get_fieldsets(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return []
        # The login is pinned together with its host key (and the name names the key's
        # directory): register again to change them.
        # The default flag moves with the "make default" action (one default at most).
        return [
            *self.readonly_fields,
            "name",
            "is_default",
            "ssh_host",
            "ssh_port",
            "ssh_user",
            "ssh_key_name",
        ]

    def save_model(self, request: HttpRequest, obj: Cluster, form: Any, change: bool) -> None:
        if change:
            changed = {key: form.cleaned_data[key] for key in form.changed_data}
            if changed:
                cluster_update(actor=request_user(request), cluster=obj, **changed)
            return
        # cluster_register saved it already; point the admin at the saved row.
        registered = form.registration.cluster
        obj.pk = registered.pk
        obj.refresh_from_db()
        messages.info(
            request,
            f"Pinned host key {registered.host_key_type} {form.registration.fingerprint_seen}; "
            f"Slurm {form.registration.info.slurm_version}. The first sync is on its way.",
        )

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> Any:
        # Partitions come from the probe; there is nothing to enter on the add page.
        return super().get_inline_instances(request, obj) if obj is not None else []

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        # The partitions inline is read-only; on the add page there is nothing to save.
        if change:
            super().save_related(request, form, formsets, change)

    def has_delete_permission(self, request: HttpRequest, obj: Cluster | None = None) -> bool:
        if obj is not None and obj.jobs.exists():
            return False
        return super().has_delete_permission(request, obj)

    @admin.action(description="Make the selected cluster the default one")
    def make_default(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one cluster.", level=messages.ERROR)
            return
        cluster = cluster_update(
            actor=request_user(request), cluster=queryset.get(), is_default=True
        )
        self.message_user(request, f"{cluster.name} is the default cluster now.")

    @admin.action(description="Sync the selected clusters now")
    def sync_now(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        for cluster in queryset:
            cluster_sync_request(actor=request_user(request), cluster=cluster)
        self.message_user(request, f"Sync requested for {queryset.count()} cluster(s).")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Cluster]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                node_total=Count("nodes", filter=~Q(nodes__state=Node.State.GONE), distinct=True),
                node_usable=Count(
                    "nodes",
                    filter=Q(nodes__state__in=[Node.State.IDLE, Node.State.MIXED]),
                    distinct=True,
                ),
            )
        )

    @admin.display(description="login")
    def ssh_login(self, obj: Cluster) -> str:
        return f"{obj.ssh_user}@{obj.ssh_host}:{obj.ssh_port}"

    @admin.display(description="nodes (schedulable/total)")
    def node_summary(self, obj: Cluster) -> str:
        return f"{getattr(obj, 'node_usable', 0)}/{getattr(obj, 'node_total', 0)}"

    @admin.display(description="last error")
    def short_error(self, obj: Cluster) -> str:
        return (
            (obj.last_sync_error[:80] + "…")
            if len(obj.last_sync_error) > 80
            else obj.last_sync_error
        )

    @admin.display(description="nodes")
    def nodes_link(self, obj: Cluster) -> str:
        return admin_changelist_link(Node, "show this cluster's nodes", cluster__id__exact=obj.pk)


@admin.register(Partition)
class PartitionAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "cluster",
        "is_default",
        "state",
        "max_time_minutes",
        "total_nodes",
        "gone",
    ]
    list_filter = ["cluster", "is_default", "gone"]
    search_fields = ["name", "cluster__name"]
    readonly_fields = [
        "cluster",
        "name",
        "nodes_expression",
        "is_default",
        "state",
        "max_time_minutes",
        "total_cpus",
        "total_nodes",
        "gone",
        "updated_at",
    ]


class NodeActionForm(ActionForm):
    reason = forms.CharField(required=False, max_length=255, help_text="required to drain")


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    can_delete = False
    fields = ("index", "gpu_type", "memory_mb", "state", "health")
    readonly_fields = ("index", "gpu_type", "memory_mb", "state")

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class NodeEventInline(admin.TabularInline):
    model = NodeEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "kind", "from_state", "to_state", "message")
    fields = readonly_fields
    ordering = ["-at"]
    max_num = 0

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "cluster_link",
        "state",
        "reason",
        "gpu_summary",
        "cpu_use",
        "memory_use",
        "partition_list",
        "switch_link",
        "last_seen_at",
    ]
    list_filter = ["cluster", "state", "leaf_switch"]
    search_fields = ["name", "reason", "address", "cluster__name"]
    list_select_related = ["cluster", "leaf_switch"]
    readonly_fields = NODE_SLURM_FIELDS
    fields = NODE_SLURM_FIELDS
    inlines = [GpuInline, NodeEventInline]
    actions = ["drain_nodes", "resume_nodes"]
    action_form = NodeActionForm

    @admin.action(description="Drain the selected nodes (give a reason above)")
    def drain_nodes(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        reason = request.POST.get("reason", "")
        for node in queryset.select_related("cluster"):
            try:
                node_drain(actor=request_user(request), node=node, reason=reason)
                self.message_user(request, f"{node.name}: {node.state}")
            except ApplicationError as error:
                self.message_user(request, f"{node.name}: {error.message}", messages.ERROR)

    @admin.action(description="Resume the selected nodes")
    def resume_nodes(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset.select_related("cluster"):
            try:
                node_resume(actor=request_user(request), node=node)
                self.message_user(request, f"{node.name}: {node.state}")
            except ApplicationError as error:
                self.message_user(request, f"{node.name}: {error.message}", messages.ERROR)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                gpu_total=Count("gpus", distinct=True),
                gpu_allocated=Count(
                    "gpus", filter=Q(gpus__state=Gpu.State.ALLOCATED), distinct=True
                ),
            )
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Nodes come from Slurm by sync; they are not made by hand.
        return False

    @admin.display(description="cluster", ordering="cluster__name")
    def cluster_link(self, obj: Node) -> str:
        return admin_link(obj.cluster, obj.cluster.name)

    @admin.display(description="switch", ordering="leaf_switch__name")
    def switch_link(self, obj: Node) -> str:
        return admin_link(obj.leaf_switch, obj.leaf_switch.name if obj.leaf_switch else None)

    @admin.display(description="GPUs alloc/total")
    def gpu_summary(self, obj: Node) -> str:
        return f"{getattr(obj, 'gpu_allocated', 0)}/{getattr(obj, 'gpu_total', 0)}"

    @admin.display(description="CPUs alloc/total")
    def cpu_use(self, obj: Node) -> str:
        return f"{obj.cpus_alloc}/{obj.cpus_total}"

    @admin.display(description="memory alloc/total (MB)")
    def memory_use(self, obj: Node) -> str:
        return f"{obj.memory_alloc_mb}/{obj.memory_mb}"

    @admin.display(description="partitions")
    def partition_list(self, obj: Node) -> str:
        return ", ".join(obj.partitions or [])


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "node_link", "index", "gpu_type", "memory_mb", "state", "health"]
    list_filter = ["gpu_type", "state", "node__cluster"]
    search_fields = ["node__name", "gpu_type"]
    list_select_related = ["node", "node__cluster"]
    readonly_fields = ["node", "index", "gpu_type", "memory_mb", "state", "updated_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="node", ordering="node__name")
    def node_link(self, obj: Gpu) -> str:
        return admin_link(obj.node, obj.node.name)


@admin.register(Switch)
class SwitchAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "level", "parent_link", "node_count", "link_speed", "gone"]
    list_filter = ["cluster", "level", "gone"]
    search_fields = ["name"]
    list_select_related = ["cluster", "parent"]
    readonly_fields = ["cluster", "name", "level", "parent", "link_speed", "gone", "updated_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Switch]:
        return super().get_queryset(request).annotate(nodes_under=Count("nodes"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="parent")
    def parent_link(self, obj: Switch) -> str:
        return admin_link(obj.parent, obj.parent.name if obj.parent else None)

    @admin.display(description="nodes")
    def node_count(self, obj: Switch) -> int:
        return int(getattr(obj, "nodes_under", 0))


@admin.register(Link)
class LinkAdmin(admin.ModelAdmin):
    list_display = ["__str__", "cluster", "scope", "kind", "bandwidth_gbps"]
    list_filter = ["cluster", "scope", "kind"]
    search_fields = ["node__name", "switch__name", "upper_switch__name"]
    list_select_related = [
        "cluster",
        "node",
        "node__cluster",
        "switch",
        "switch__cluster",
        "upper_switch",
        "upper_switch__cluster",
        "gpu_a",
        "gpu_a__node",
        "gpu_a__node__cluster",
        "gpu_b",
        "gpu_b__node",
        "gpu_b__node__cluster",
    ]
    raw_id_fields = ["node", "gpu_a", "gpu_b", "switch", "upper_switch"]


@admin.register(NodeEvent)
class NodeEventAdmin(admin.ModelAdmin):
    list_display = ["at", "node_link", "kind", "from_state", "to_state", "message"]
    list_filter = ["kind", "to_state", "node__cluster"]
    search_fields = ["node__name", "message"]
    date_hierarchy = "at"
    list_select_related = ["node", "node__cluster"]
    readonly_fields = ["node", "at", "kind", "from_state", "to_state", "message"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.display(description="node", ordering="node__name")
    def node_link(self, obj: NodeEvent) -> str:
        return admin_link(obj.node)
