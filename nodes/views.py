from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from controlplane.errors import ApplicationError
from controlplane.roles import is_operator
from jobs.models import Job
from nodes.models import Cluster, Node
from nodes.selectors import cluster_list, node_list, switch_tree
from nodes.services import cluster_sync_request, node_drain, node_resume


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


@login_required
def node_list_page(request: HttpRequest) -> HttpResponse:
    cluster_id = _int_or_none(request.GET.get("cluster"))
    state = request.GET.get("state") or None
    partition = request.GET.get("partition") or None
    gpu_type = request.GET.get("gpu_type") or None
    search = (request.GET.get("q") or "").strip() or None
    nodes = list(
        node_list(
            cluster_id=cluster_id,
            state=state,
            partition=partition,
            gpu_type=gpu_type,
            search=search,
        )[:1000]
    )
    gpu_types = sorted({gpu.gpu_type for node in nodes for gpu in node.gpus.all() if gpu.gpu_type})
    return render(
        request,
        "nodes/node_list.html",
        {
            "nodes": nodes,
            "filters": {
                "cluster_id": cluster_id,
                "state": state,
                "partition": partition,
                "gpu_type": gpu_type,
                "search": search,
            },
            "clusters": cluster_list(),
            "states": Node.State.choices,
            "gpu_types": gpu_types,
            "has_clusters": Cluster.objects.exists(),
            "can_operate": is_operator(request.user),
        },
    )


@login_required
def node_detail_page(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(
        Node.objects.select_related("cluster", "leaf_switch").prefetch_related("gpus"), id=node_id
    )
    running_here = [
        job
        for job in Job.objects.filter(
            cluster=node.cluster, state__in=[Job.State.RUNNING, Job.State.COMPLETING]
        ).select_related("owner")
        if node.name in job.allocated_node_names
    ]
    return render(
        request,
        "nodes/node_detail.html",
        {
            "node": node,
            "events": node.events.all()[:50],
            "jobs": running_here,
            "can_operate": is_operator(request.user),
        },
    )


@login_required
@require_POST
def node_drain_action(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("cluster"), id=node_id)
    if not is_operator(request.user):
        raise PermissionDenied
    try:
        node_drain(actor=request.user, node=node, reason=request.POST.get("reason", ""))
        messages.success(request, f"{node.name} is {node.state} in Slurm.")
    except ApplicationError as error:
        messages.error(request, f"Could not drain {node.name}: {error.message}")
    return HttpResponseRedirect(request.POST.get("next") or reverse("node-detail", args=[node.id]))


@login_required
@require_POST
def node_resume_action(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("cluster"), id=node_id)
    if not is_operator(request.user):
        raise PermissionDenied
    try:
        node_resume(actor=request.user, node=node)
        messages.success(request, f"{node.name} is {node.state} in Slurm.")
    except ApplicationError as error:
        messages.error(request, f"Could not resume {node.name}: {error.message}")
    return HttpResponseRedirect(request.POST.get("next") or reverse("node-detail", args=[node.id]))


@login_required
@require_POST
def cluster_sync_action(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_object_or_404(Cluster, id=cluster_id)
    if not is_operator(request.user):
        raise PermissionDenied
    cluster_sync_request(actor=request.user, cluster=cluster)
    messages.success(request, f"A sync of {cluster.name} is on its way.")
    return HttpResponseRedirect(reverse("overview"))


def _topology_highlight(request: HttpRequest) -> dict[str, object]:
    """Nodes (and the switches they span) to highlight: ``?job=<id>`` for where a job runs,
    ``?nodes=n[1-2]&cluster=<name>`` for a proposed placement."""
    from jobs.selectors import job_get_for_user
    from nodes.placement import placement_quality
    from nodes.placement_service import placement_inputs
    from nodes.slurm.hostlist import expand

    cluster = None
    names: list[str] = []
    caption = ""
    if request.GET.get("job"):
        job = job_get_for_user(user=request.user, job_id=request.GET["job"])
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
