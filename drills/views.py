"""Pages for restore drills: the checkpoint integrity panel, drills, fleet health, policies,
and each owner's drill budget."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from core.access import can_act, request_user
from core.conditional import etag_for, not_modified, revalidate, this_minute
from core.errors import ApplicationError, FieldError
from core.roles import is_operator
from drills.budgets import DrillUsage, drill_usage
from drills.models import DrillPolicy, RestoreDrill
from drills.policies import drill_policy_update
from drills.reference import next_checkpoint_step
from drills.selectors import (
    checkpoint_proofs,
    drill_fleet_health,
    drill_get_for_user,
    drill_list,
)
from drills.services import (
    allocation_for,
    checkpoint_verify_request,
    restore_drill_cancel,
    restore_drill_start,
)
from jobs.models import Checkpoint
from jobs.selectors import checkpoint_get_for_user, job_get_for_user
from nodes.models import Cluster
from trainer.sharding import rank_summary

# Rows of the "which rank holds which rows" table on the checkpoint page (the API has all).
SHARDING_ROWS = 400


def sharding_panel(manifest: dict[str, Any]) -> dict[str, Any]:
    """What each rank of a checkpoint holds, from its manifest: the strategy, per rank its
    files and bytes and how many slices / whole tensors, and per tensor which rank holds
    which rows (format 3; a format-2 checkpoint is DDP: everything whole on rank 0)."""
    table = manifest.get("sharding") or {}
    tensors = []
    for key, item in sorted(table.items())[:SHARDING_ROWS]:
        if not isinstance(item, dict):
            continue
        shape = item.get("global_shape") or []
        holders = [
            {
                "rank": shard.get("rank"),
                "rows": (
                    f"rows {shard.get('start')}–{int(shard.get('start') or 0) + int(shard['rows'])}"
                    if item.get("placement") == "shard0" and shard.get("rows") is not None
                    else "whole"
                ),
                "nbytes": shard.get("nbytes"),
            }
            for shard in sorted(item.get("shards") or [], key=lambda s: s.get("rank", 0))
        ]
        tensors.append(
            {
                "key": key,
                "shape": "×".join(str(n) for n in shape) or "scalar",
                "dtype": item.get("dtype"),
                "placement": item.get("placement"),
                "holders": holders,
            }
        )
    return {
        "strategy": manifest.get("strategy") or "ddp",
        "ranks": rank_summary(manifest) if table else [],
        "tensors": tensors,
        "tensor_count": len(table),
    }


def _int(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        return None


@login_required
def checkpoint_page(request: HttpRequest, job_id: uuid.UUID, step: int) -> HttpResponse:
    job = job_get_for_user(user=request_user(request), job_id=job_id)
    checkpoint = get_object_or_404(Checkpoint, job=job, step=step)
    files = [f for f in (checkpoint.manifest.get("files") or []) if isinstance(f, dict)]
    files.sort(key=lambda f: (f.get("rank", 0), str(f.get("name"))))
    drills = list(checkpoint.drills.order_by("-created_at")[:20])
    return render(
        request,
        "drills/checkpoint.html",
        {
            "job": job,
            "checkpoint": checkpoint,
            "files": files,
            "drills": drills,
            "last_drill": drills[0] if drills else None,
            "allocation": allocation_for(job),
            "can_act": can_act(request.user, owner_id=job.owner_id),
            "versions": json.dumps(checkpoint.manifest.get("versions") or {}, indent=2),
            "default_steps": min(5, max(1, (job.last_step or 0) - checkpoint.step)),
            "next_step": next_checkpoint_step(checkpoint),
            "fingerprint": job.fingerprints.filter(step=checkpoint.step).first(),
            "proofs": checkpoint_proofs(checkpoint=checkpoint),
            "sharding": sharding_panel(checkpoint.manifest or {}),
            # The budget the checkpoint's owner's drills count against (whoever looks).
            "budget": drill_usage(owner_id=job.owner_id, cluster=job.cluster, now=timezone.now()),
        },
    )


@login_required
@require_POST
def checkpoint_drill_action(request: HttpRequest, checkpoint_id: int) -> HttpResponse:
    checkpoint = checkpoint_get_for_user(user=request_user(request), checkpoint_id=checkpoint_id)
    back = reverse("checkpoint", args=[checkpoint.job_id, checkpoint.step])
    allocation: dict[str, Any] = {}
    if request.POST.get("allocation") == "custom":
        for key in ("nodes", "tasks_per_node", "gpus_per_node"):
            value = _int(request.POST.get(key))
            if value is not None:
                allocation[key] = value
        if request.POST.get("partition"):
            allocation["partition"] = request.POST["partition"].strip()
    try:
        drill = restore_drill_start(
            actor=request_user(request),
            checkpoint=checkpoint,
            steps=_int(request.POST.get("steps")),
            allocation=allocation,
            trainer=request.POST.get("trainer") or RestoreDrill.Trainer.RECORDED,
        )
    except ApplicationError as error:
        messages.error(request, error.message)
        return HttpResponseRedirect(back)
    messages.success(request, "Restore drill started; the verdict appears here when it ends.")
    return HttpResponseRedirect(reverse("drill-detail", args=[drill.id]))


@login_required
@require_POST
def checkpoint_verify_action(request: HttpRequest, checkpoint_id: int) -> HttpResponse:
    checkpoint = checkpoint_get_for_user(user=request_user(request), checkpoint_id=checkpoint_id)
    try:
        checkpoint_verify_request(actor=request_user(request), checkpoint=checkpoint)
        messages.success(request, "Integrity check requested; refresh in a few seconds.")
    except ApplicationError as error:
        messages.error(request, error.message)
    return HttpResponseRedirect(reverse("checkpoint", args=[checkpoint.job_id, checkpoint.step]))


@login_required
def drill_detail_page(request: HttpRequest, drill_id: uuid.UUID) -> HttpResponse:
    drill = drill_get_for_user(user=request_user(request), drill_id=drill_id)
    evidence = drill.evidence or {}
    steps = [s for s in (evidence.get("steps") or []) if isinstance(s, dict)]
    job = drill.checkpoint.job
    state = evidence.get("state")
    state = state if isinstance(state, dict) else {}
    state_checks = [
        {"label": label, **state[key]}
        for key, label in (("at_load", "as loaded"), ("at_end", "after replay"))
        if isinstance(state.get(key), dict)
    ]
    return render(
        request,
        "drills/drill_detail.html",
        {
            "drill": drill,
            "job": job,
            "steps": steps,
            "state_checks": state_checks,
            "ranks": [r for r in (evidence.get("ranks") or []) if isinstance(r, dict)],
            "timings": evidence.get("timings") or {},
            "evidence_json": json.dumps(evidence, indent=2, sort_keys=True) if evidence else "",
            "chart": {
                "step": [s.get("step") for s in steps],
                "drill": [s.get("loss") for s in steps],
                "reference": [s.get("reference") for s in steps],
            },
            "can_act": can_act(request.user, owner_id=job.owner_id),
        },
    )


@login_required
def drill_status_partial(request: HttpRequest, drill_id: uuid.UUID) -> HttpResponseBase:
    """The drill's state and verdict, polled while it runs: rendered only when the drill
    changed (or the minute did: it says "running for 3 minutes"), 304 otherwise."""
    drill = drill_get_for_user(user=request_user(request), drill_id=drill_id)
    etag = etag_for(
        [getattr(drill, field.attname) for field in RestoreDrill._meta.concrete_fields],
        this_minute(),
    )
    unchanged = not_modified(request, etag)
    if unchanged is not None:
        return unchanged
    return revalidate(render(request, "drills/_drill_status.html", {"drill": drill}), etag)


@login_required
@require_POST
def drill_cancel_action(request: HttpRequest, drill_id: uuid.UUID) -> HttpResponse:
    drill = drill_get_for_user(user=request_user(request), drill_id=drill_id)
    try:
        outcome = restore_drill_cancel(actor=request_user(request), drill=drill)
        messages.success(request, f"Drill {outcome}.")
    except ApplicationError as error:
        messages.error(request, error.message)
    return HttpResponseRedirect(reverse("drill-detail", args=[drill.id]))


@login_required
def drill_list_page(request: HttpRequest) -> HttpResponse:
    verdict = request.GET.get("verdict") or ""
    error = ""
    try:
        drills = list(
            drill_list(user=request_user(request), verdict=verdict).order_by("-created_at")[:100]
        )
    except FieldError as refused:
        drills, error = [], refused.message
    health = drill_fleet_health(user=request_user(request))
    policies = []
    budgets: list[tuple[Cluster, DrillUsage]] = []
    now = timezone.now()
    for cluster in Cluster.objects.order_by("name"):
        policy, _ = DrillPolicy.objects.get_or_create(cluster=cluster)
        policies.append(policy)
        usage = drill_usage(owner_id=request_user(request).pk, cluster=cluster, now=now)
        budgets.append((cluster, usage))
    return render(
        request,
        "drills/drill_list.html",
        {
            "drills": drills,
            "error": error,
            "health": health,
            "load_times": health["load_times"],
            "policies": policies,
            "budgets": budgets,
            "verdict": verdict,
            "verdicts": RestoreDrill.Verdict.choices,
            "can_set_policy": is_operator(request.user),
        },
    )


@login_required
@require_POST
def drill_policy_action(request: HttpRequest, cluster_id: int) -> HttpResponse:
    if not is_operator(request.user):
        raise PermissionDenied
    cluster = get_object_or_404(Cluster, pk=cluster_id)
    hours = request.POST.get("running_every_hours", "").strip()
    try:
        drill_policy_update(
            actor=request_user(request),
            cluster=cluster,
            enabled=request.POST.get("enabled") == "on",
            running_every_hours=float(hours) if hours else None,
            drill_final_checkpoint=request.POST.get("drill_final_checkpoint") == "on",
            max_in_flight=int(request.POST.get("max_in_flight") or 2),
            steps=int(request.POST.get("steps") or 5),
        )
        messages.success(request, f"Drill policy of {cluster.name} saved.")
    except ValueError:
        messages.error(request, "Policy not saved: hours, drills in flight and steps are numbers.")
    except ApplicationError as error:
        messages.error(request, f"Policy not saved: {error.message}")
    return HttpResponseRedirect(reverse("drill-list"))
