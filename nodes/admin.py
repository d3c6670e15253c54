from __future__ import annotations

from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest

from controlplane.admin_helpers import admin_changelist_link, admin_link
from nodes.models import Cluster, Gpu, Link, Node, NodeEvent, Partition, Switch

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


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
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
