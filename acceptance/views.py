"""Pages of acceptance: the runs and the start form (operators start), a run's tiers,
criteria, busbw chart and convicted nodes (each with the node's own audited drain), and
the certificate as a JSON download."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from acceptance.models import REQUESTABLE_TIERS, AcceptanceRun, Certificate, Tier
from acceptance.selectors import run_get, run_list, run_view
from acceptance.services import (
    DEFAULT_OPTIONS,
    OPTION_BOUNDS,
    RunRequest,
    acceptance_run_cancel,
    acceptance_run_start,
)
from core.access import request_user
from core.errors import ApplicationError, FieldError
from core.roles import is_operator
from nodes.models import Cluster

LIST_LIMIT = 100


@login_required
def acceptance_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "acceptance/run_list.html",
        {
            "runs": run_list()[:LIST_LIMIT],
            "clusters": Cluster.objects.order_by("name"),
            "scopes": AcceptanceRun.Scope.choices,
            "tiers": [(t.value, t.label) for t in REQUESTABLE_TIERS],
            "default_tiers": [Tier.INVENTORY.value, Tier.COLLECTIVES.value],
            "defaults": DEFAULT_OPTIONS,
            "can_operate": is_operator(request.user),
        },
    )


def _whole_number(request: HttpRequest, name: str) -> int | None:
    text = request.POST.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise FieldError(f"options.{name}", "a whole number")
    return int(text)


def _start_request(request: HttpRequest) -> RunRequest:
    cluster = request.POST.get("cluster", "")
    if not cluster.isdigit():
        raise FieldError("cluster", "choose a cluster")
    options: dict[str, Any] = {}
    for name in OPTION_BOUNDS:
        value = _whole_number(request, name)
        if value is not None:
            options[name] = value
    return RunRequest(
        cluster_id=int(cluster),
        scope=request.POST.get("scope", ""),
        value=request.POST.get("value", ""),
        tiers=request.POST.getlist("tiers"),
        options=options,
    )


@login_required
@require_POST
def acceptance_start_action(request: HttpRequest) -> HttpResponse:
    if not is_operator(request.user):
        raise PermissionDenied
    try:
        run = acceptance_run_start(actor=request_user(request), request=_start_request(request))
    except ApplicationError as error:
        messages.error(request, f"Could not start the acceptance run: {error.message}")
        return render(
            request,
            "acceptance/start_refused.html",
            {"message": error.message},
            status=error.status_code,
        )
    messages.success(request, f"Acceptance run of {len(run.nodes)} nodes started.")
    return HttpResponseRedirect(reverse("acceptance-detail", args=[run.id]))


@login_required
def acceptance_detail(request: HttpRequest, run_id: str) -> HttpResponse:
    view = run_view(run=run_get(run_id=run_id))
    return render(
        request,
        "acceptance/run_detail.html",
        {"view": view, "run": view.run, "can_operate": is_operator(request.user)},
    )


@login_required
@require_POST
def acceptance_cancel_action(request: HttpRequest, run_id: str) -> HttpResponse:
    run = run_get(run_id=run_id)
    if not is_operator(request.user):
        raise PermissionDenied
    try:
        outcome = acceptance_run_cancel(actor=request_user(request), run=run)
        messages.success(request, f"Acceptance run: {outcome}.")
    except ApplicationError as error:
        messages.error(request, f"Could not cancel: {error.message}")
    return HttpResponseRedirect(reverse("acceptance-detail", args=[run.id]))


@login_required
def certificate_download(request: HttpRequest, run_id: str) -> HttpResponse:
    run = run_get(run_id=run_id)
    certificate = Certificate.objects.filter(run=run).first()
    if certificate is None:
        raise Http404("The run has not issued its certificate yet.")
    body = json.dumps({**certificate.document, "digest": certificate.digest}, indent=2)
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="certificate-{run.id}.json"'
    return response
