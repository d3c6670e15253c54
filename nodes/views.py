from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from nodes.models import Cluster, Node
from nodes.selectors import cluster_list, node_list, switch_tree


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


@login_required
def node_list_page(request: HttpRequest) -> HttpResponse:
    filters = {
        "cluster_id": _int_or_none(request.GET.get("cluster")),
        "state": request.GET.get("state") or None,
        "partition": request.GET.get("partition") or None,
        "gpu_type": request.GET.get("gpu_type") or None,
        "search": (request.GET.get("q") or "").strip() or None,
    }
    nodes = list(
        node_list(
            cluster_id=filters["cluster_id"],  # type: ignore[arg-type]
            state=filters["state"],  # type: ignore[arg-type]
            partition=filters["partition"],  # type: ignore[arg-type]
            gpu_type=filters["gpu_type"],  # type: ignore[arg-type]
            search=filters["search"],  # type: ignore[arg-type]
        )[:1000]
    )
    return render(
        request,
        "nodes/node_list.html",
        {
            "nodes": nodes,
            "filters": filters,
            "clusters": cluster_list(),
            "states": Node.State.choices,
            "has_clusters": Cluster.objects.exists(),
        },
    )


@login_required
def node_detail_page(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(
        Node.objects.select_related("cluster", "leaf_switch").prefetch_related("gpus"), id=node_id
    )
    return render(
        request,
        "nodes/node_detail.html",
        {"node": node, "events": node.events.all()[:50]},
    )


@login_required
def topology_page(request: HttpRequest) -> HttpResponse:
    trees = [(cluster, switch_tree(cluster=cluster)) for cluster in cluster_list()]
    return render(request, "nodes/topology.html", {"trees": trees})
