from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, Prefetch, Q, QuerySet

from nodes.models import Cluster, Gpu, Node, Switch


def cluster_list() -> QuerySet[Cluster]:
    return Cluster.objects.all().order_by("-is_default", "name")


def node_list(
    *,
    cluster_id: int | None = None,
    state: str | None = None,
    partition: str | None = None,
    gpu_type: str | None = None,
    search: str | None = None,
    include_gone: bool = False,
) -> QuerySet[Node]:
    nodes = (
        Node.objects.select_related("cluster", "leaf_switch")
        .prefetch_related(Prefetch("gpus", queryset=Gpu.objects.order_by("index")))
        .annotate(
            gpu_allocated=Count("gpus", filter=Q(gpus__state=Gpu.State.ALLOCATED), distinct=True)
        )
        .order_by("cluster__name", "name")
    )
    if not include_gone and state != Node.State.GONE:
        nodes = nodes.exclude(state=Node.State.GONE)
    if cluster_id is not None:
        nodes = nodes.filter(cluster_id=cluster_id)
    if state:
        nodes = nodes.filter(state=state)
    if partition:
        nodes = nodes.filter(partitions_text__contains=f",{partition},")
    if gpu_type:
        nodes = nodes.filter(gpus__gpu_type=gpu_type).distinct()
    if search:
        nodes = nodes.filter(Q(name__icontains=search) | Q(reason__icontains=search))
    return nodes


@dataclass
class ClusterHealth:
    cluster: Cluster
    nodes_by_state: dict[str, int] = field(default_factory=dict)
    gpus_by_type: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def node_total(self) -> int:
        return sum(self.nodes_by_state.values())


def cluster_health_list() -> list[ClusterHealth]:
    """Per cluster: nodes by state and GPUs by type (allocated, total). Three queries."""
    clusters = list(cluster_list())
    health = {cluster.id: ClusterHealth(cluster=cluster) for cluster in clusters}
    node_counts = (
        Node.objects.exclude(state=Node.State.GONE)
        .values("cluster_id", "state")
        .annotate(count=Count("id"))
    )
    for row in node_counts:
        health[row["cluster_id"]].nodes_by_state[row["state"]] = row["count"]
    gpu_counts = (
        Gpu.objects.exclude(node__state=Node.State.GONE)
        .values("node__cluster_id", "gpu_type")
        .annotate(total=Count("id"), allocated=Count("id", filter=Q(state=Gpu.State.ALLOCATED)))
    )
    for row in gpu_counts:
        health[row["node__cluster_id"]].gpus_by_type[row["gpu_type"] or "gpu"] = (
            row["allocated"],
            row["total"],
        )
    return [health[cluster.id] for cluster in clusters]


def switch_tree(*, cluster: Cluster) -> list[Switch]:
    """Top-level switches of a cluster with children and nodes prefetched."""
    switches = list(
        Switch.objects.filter(cluster=cluster, gone=False).prefetch_related(
            Prefetch(
                "nodes",
                queryset=Node.objects.exclude(state=Node.State.GONE)
                .order_by("name")
                .prefetch_related(Prefetch("gpus", queryset=Gpu.objects.order_by("index"))),
            )
        )
    )
    by_id = {switch.id: switch for switch in switches}
    roots: list[Switch] = []
    for switch in switches:
        switch.child_list = []  # type: ignore[attr-defined]
    for switch in sorted(switches, key=lambda s: s.name):
        parent = by_id.get(switch.parent_id) if switch.parent_id else None
        if parent is None:
            roots.append(switch)
        else:
            parent.child_list.append(switch)  # type: ignore[attr-defined]
    return roots
