"""Pages that combine apps (the composition root): the overview (``overview_page``), a node's
page with the jobs on it, and the topology with a job's or a proposed placement
highlighted."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from acceptance.selectors import node_certificates
from console.overview import overview as overview
from console.overview import overview_live_partial as overview_live_partial
from core.access import request_user
from core.roles import is_operator
from health.selectors import node_health_view
from jobs.selectors import job_get_for_user, jobs_on_node
from nodes.models import Cluster, Node
from nodes.placement import placement_quality
from nodes.placement_service import placement_inputs
from nodes.selectors import cluster_list, switch_tree
from recovery.selectors import node_suspicions_for_user
from slurm.hostlist import expand

# How far back the node page lists the jobs that ended on the node.
NODE_RECENT_JOB_DAYS = 7


@login_required
def node_detail_page(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(
        Node.objects.select_related("cluster", "leaf_switch").prefetch_related("gpus"), id=node_id
    )
    on_node = jobs_on_node(user=request_user(request), node=node, recent_days=NODE_RECENT_JOB_DAYS)
    return render(
        request,
        "nodes/node_detail.html",
        {
            "node": node,
            "events": node.events.all()[:50],
            "running_jobs": on_node.running,
            "recent_jobs": on_node.recent,
            "hidden_running": on_node.hidden_running,
            "recent_days": NODE_RECENT_JOB_DAYS,
            # The evidence for operators only; counts for everyone (the selector's rule).
            "suspicions": node_suspicions_for_user(user=request_user(request), node=node),
            "health_view": node_health_view(node=node),
            "certificates": node_certificates(node=node),
            "can_operate": is_operator(request.user),
        },
    )


def _topology_highlight(request: HttpRequest) -> dict[str, object]:
    """Nodes (and the switches they span) to highlight: ``?job=<id>`` for where a job runs,
    ``?nodes=n[1-2]&cluster=<name>`` for a proposed placement."""
    cluster = None
    names: list[str] = []
    caption = ""
    if request.GET.get("job"):
        job = job_get_for_user(user=request_user(request), job_id=request.GET["job"])
        cluster, names = job.cluster, job.allocated_node_names
        caption = (
            f"Job {job.name}: {job.allocated_nodes}"
            if names
            else f"Job {job.name} is not placed yet."
        )
    elif request.GET.get("nodes"):
        try:
            names = expand(request.GET["nodes"])
        except ValueError:
            names = []
        name = request.GET.get("cluster")
        found = Cluster.objects.filter(name=name).first() if name else None
        cluster = found or Cluster.objects.filter(is_default=True).first()
        caption = f"Proposed placement: {request.GET['nodes']}"
    if cluster is None or not names:
        return {"caption": caption, "cluster_id": None, "nodes": [], "switches": []}
    infos, switches = placement_inputs(cluster)
    check = placement_quality(names, infos, switches, None)
    if check.switches_spanned:
        caption += f" — spans {', '.join(check.switches_spanned)}"
    return {
        "caption": caption,
        "cluster_id": cluster.pk,
        "nodes": names,
        "switches": list(check.switches_spanned),
    }


@login_required
def topology_page(request: HttpRequest) -> HttpResponse:
    highlight = _topology_highlight(request)
    trees = []
    for cluster in cluster_list():
        roots = switch_tree(cluster=cluster)
        unplaced = list(
            Node.objects.filter(cluster=cluster, leaf_switch__isnull=True)
            .exclude(state=Node.State.GONE)
            .prefetch_related("gpus")
        )
        trees.append((cluster, roots, unplaced))
    return render(request, "nodes/topology.html", {"trees": trees, "highlight": highlight})
