"""The recovery page: incidents per cluster and week (time to detect, to recover, work
lost), the incidents a person may see, and for operators the suspect nodes with their
evidence, each offered for draining (one click, the node's audited drain) or clearing."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.access import request_user
from core.roles import is_operator, is_researcher
from nodes.models import Cluster, Node
from recovery.detect import policy_for
from recovery.operators import suspect_node_clear
from recovery.selectors import incident_fleet_weeks, incident_list_for_user, suspect_nodes


@login_required
def recovery_page(request: HttpRequest) -> HttpResponse:
    if not is_researcher(request.user):
        raise PermissionDenied
    operator = is_operator(request.user)
    return render(
        request,
        "recovery.html",
        {
            "weeks": incident_fleet_weeks() if operator else [],
            "incidents": list(
                incident_list_for_user(user=request_user(request)).order_by("-detected_at")[:50]
            ),
            "suspects": suspect_nodes() if operator else [],
            "policies": [policy_for(cluster) for cluster in Cluster.objects.order_by("name")],
            "can_operate": operator,
        },
    )


@login_required
@require_POST
def suspect_clear_action(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(Node, pk=node_id)
    if not is_operator(request.user):
        raise PermissionDenied
    cleared = suspect_node_clear(
        actor=request_user(request), node=node, why=request.POST.get("why", "")
    )
    messages.success(request, f"{node.name}: {cleared} suspicion(s) cleared.")
    return HttpResponseRedirect(reverse("recovery"))
