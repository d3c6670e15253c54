"""Pages for the inventory: the node list and operator actions on nodes and clusters.

The node page and the topology page show jobs too, so they live with the pages that
combine apps (``console.pages``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from core.access import request_user
from core.conditional import etag_for, not_modified, revalidate
from core.errors import ApplicationError
from core.roles import is_operator
from nodes.access.identities import (
    cluster_identity_for_user,
    cluster_identity_list,
    sshd_config_lines,
    trusted_ca_file,
    trusted_ca_keys,
)
from nodes.models import Cluster, Gpu, Node, NodeEvent, Switch
from nodes.selectors import cluster_list, node_list
from nodes.services import cluster_sync_request, node_drain, node_resume


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _node_list_context(request: HttpRequest) -> dict[str, Any]:
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
    query = request.GET.urlencode()
    return {
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
        # Where the drain/resume forms return to: the page, also when the table was polled.
        "page_path": reverse("node-list") + (f"?{query}" if query else ""),
    }


@login_required
def node_list_page(request: HttpRequest) -> HttpResponse:
    return render(request, "nodes/node_list.html", _node_list_context(request))


def _inventory_version() -> tuple[Any, ...]:
    """What changes whenever anything the node table shows changes: per table of the
    inventory its row count and newest change (the sync stamps ``updated_at`` on what it
    changes and ``state_changed_at`` on a new state; an operator's drain or resume leaves
    a node event). One query, one pass over each table: far less than the table itself.

    Raw SQL, kept for a measured target: the node table's poll at fleet scale (10k nodes)
    went from ~800 ms to ~17 ms with it (bench/results/web_*.md); the ORM has no query
    without a FROM table to put five aggregates in one round trip. Identifiers only,
    quoted, from model metadata."""
    quote = connection.ops.quote_name
    parts: list[str] = []
    for model, columns in (
        (Node, ("updated_at", "state_changed_at")),
        (Gpu, ("updated_at",)),
        (Switch, ("updated_at",)),
        (Cluster, ("updated_at",)),
        (NodeEvent, ("id",)),
    ):
        newest = ", ".join(f"MAX({quote(column)})" for column in columns)
        table = quote(model._meta.db_table)
        parts.append(f"(SELECT COUNT(*), {newest} FROM {table}) AS t{len(parts)}")  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM " + ", ".join(parts))  # noqa: S608 - table names only
        return tuple(cursor.fetchone() or ())


@login_required
def node_list_live_partial(request: HttpRequest) -> HttpResponseBase:
    """The node table, polled while the tab is visible: rendered only when the inventory
    changed since the poller's copy (304 otherwise, see ``core.conditional``)."""
    etag = etag_for(
        _inventory_version(),
        request.get_full_path(),
        is_operator(request.user),
        # Its drain and resume forms carry CSRF tokens.
        request.META.get("CSRF_COOKIE"),
    )
    unchanged = not_modified(request, etag)
    if unchanged is not None:
        return unchanged
    return revalidate(render(request, "nodes/_node_table.html", _node_list_context(request)), etag)


def _back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    """Where an action returns to: the form's ``next`` when it is a page of this site."""
    target = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = default
    return HttpResponseRedirect(target)


@login_required
@require_POST
def node_drain_action(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("cluster"), id=node_id)
    if not is_operator(request.user):
        raise PermissionDenied
    try:
        node_drain(actor=request_user(request), node=node, reason=request.POST.get("reason", ""))
        messages.success(request, f"{node.name} is {node.state} in Slurm.")
    except ApplicationError as error:
        messages.error(request, f"Could not drain {node.name}: {error.message}")
    return _back(request, reverse("node-detail", args=[node.id]))


@login_required
@require_POST
def node_resume_action(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("cluster"), id=node_id)
    if not is_operator(request.user):
        raise PermissionDenied
    try:
        node_resume(actor=request_user(request), node=node)
        messages.success(request, f"{node.name} is {node.state} in Slurm.")
    except ApplicationError as error:
        messages.error(request, f"Could not resume {node.name}: {error.message}")
    return _back(request, reverse("node-detail", args=[node.id]))


@login_required
@require_POST
def cluster_sync_action(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_object_or_404(Cluster, id=cluster_id)
    if not is_operator(request.user):
        raise PermissionDenied
    cluster_sync_request(actor=request_user(request), cluster=cluster)
    messages.success(request, f"A sync of {cluster.name} is on its way.")
    return HttpResponseRedirect(reverse("overview"))


@login_required
def cluster_access_page(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """Who runs as whom on a cluster: your account there, the user CA's public key and the
    sshd line an admin adds, and (operators) every mapping."""
    cluster = get_object_or_404(Cluster, id=cluster_id)
    operator = is_operator(request.user)
    return render(
        request,
        "nodes/cluster_access.html",
        {
            "cluster": cluster,
            "identity": cluster_identity_for_user(cluster=cluster, user=request_user(request)),
            "identities": list(cluster_identity_list(cluster=cluster)) if operator else [],
            "can_operate": operator,
            "trusted_ca_file": trusted_ca_file(cluster),
            "trusted_keys": "\n".join(trusted_ca_keys(cluster)),
            "sshd_lines": "\n".join(sshd_config_lines(cluster)),
        },
    )
