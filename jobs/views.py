from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.access import can_act
from core.errors import ApplicationError, FieldError
from core.roles import is_operator, is_researcher
from jobs.goodput import format_duration
from jobs.models import Checkpoint, Job
from jobs.pending_queue import job_pending_summary
from jobs.placement import (
    job_placement_check,
)
from jobs.script import job_script
from jobs.selectors import job_get_for_user, job_goodput, job_list
from jobs.services import job_cancel, job_resume
from jobs.work_at_risk import job_work_at_risk
from nodes.models import Node


@login_required
def job_list_page(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state") or ""
    owner = request.GET.get("owner") or ""
    search = (request.GET.get("q") or "").strip()
    sees_all = is_operator(request.user)
    mine = request.GET.get("mine", "1" if not sees_all else "0") == "1"
    error = ""
    try:
        jobs = list(
            job_list(
                user=request.user,
                state=state or None,
                owner=(owner or None) if sees_all else None,
                search=search or None,
                mine=mine,
            ).order_by("-created_at")[:100]
        )
    except FieldError as refused:
        jobs, error = [], refused.message
    return render(
        request,
        "jobs/job_list.html",
        {
            "jobs": jobs,
            "error": error,
            "states": Job.State.choices,
            "state": state,
            "owner": owner,
            "search": search,
            "mine": mine,
            "sees_all": sees_all,
            "can_submit": is_researcher(request.user),
        },
    )


def _switches_spanned(job: Job) -> list[str]:
    names = job.allocated_node_names
    if not names:
        return []
    leaves = (
        Node.objects.filter(cluster=job.cluster, name__in=names)
        .exclude(leaf_switch__isnull=True)
        .values_list("leaf_switch__name", flat=True)
    )
    return sorted(set(leaves))


def _pending_display(job: Job) -> dict[str, Any] | None:
    """Why a pending job waits, when Slurm expects it to start, its place in the queue."""
    return job_pending_summary(job=job)


def _job_page_context(request: HttpRequest, job: Job, *, live_only: bool) -> dict[str, Any]:
    """The one context of the job page; ``live_only`` is what its polled header needs."""
    context: dict[str, Any] = {
        "job": job,
        "throughput": job.throughput_now,
        "events": list(job.events.all()),
        "checkpoints": list(job.checkpoints.order_by("-step")),
        "can_act": can_act(request.user, owner_id=job.owner_id),
        "switches": _switches_spanned(job),
        "placement_check": job_placement_check(job),
        "pending": _pending_display(job),
        "can_submit": is_researcher(request.user),
    }
    if live_only:
        return context
    context.update(
        children=list(job.children.order_by("-created_at")),
        acceptance_json=(
            json.dumps(job.acceptance, indent=2, sort_keys=True) if job.acceptance else ""
        ),
        config_json=json.dumps(job.config, indent=2, sort_keys=True),
        script=job_script(job),
        goodput=_goodput_display(job_goodput(job=job)),
        work_at_risk=job_work_at_risk(job=job),
    )
    return context


# Bucket colours and names on the job page's goodput bar, in bar order.
_GOODPUT_BUCKETS = (
    ("productive", "productive", "#15803d"),
    ("data_wait", "data wait", "#0e7490"),
    ("checkpoint_blocking", "checkpoint blocking", "#2563eb"),
    ("restore", "restore", "#7c3aed"),
    ("startup", "startup", "#a3a3a3"),
    ("queued", "queued", "#d4d4d8"),
    ("idle", "idle between jobs", "#fcd34d"),
    ("lost_progress", "lost progress (redone)", "#b91c1c"),
    ("other", "other", "#e5e7eb"),
)


def _goodput_display(ledger: dict[str, Any]) -> dict[str, Any]:
    """The goodput ledger as the page shows it: bar segments with widths in %, and the
    checkpoint-interval advice in words."""
    wall = ledger["wall_s"]
    rows = []
    for name, label, colour in _GOODPUT_BUCKETS:
        seconds = ledger["buckets"][name]
        rows.append(
            {
                "name": name,
                "label": label,
                "colour": colour,
                "seconds": seconds,
                "duration": format_duration(seconds),
                "job_seconds": ledger["job"]["buckets"][name],
                "percent": 100 * seconds / wall if wall > 0 else 0.0,
            }
        )
    advice = ledger["advice"]
    inputs = advice["inputs"]
    return {
        **ledger,
        "rows": rows,
        "wall": format_duration(wall),
        "percent": None if ledger["ratio"] is None else 100 * ledger["ratio"],
        "lineage_size": len(ledger["lineage"]),
        "current_interval": format_duration(advice["current_interval_s"]),
        "optimal_interval": format_duration(advice["optimal_interval_s"]),
        "expected_now": _percent(advice["expected_ratio_now"]),
        "expected_optimal": _percent(advice["expected_ratio_optimal"]),
        "checkpoint_cost": format_duration(inputs["checkpoint_cost_s"]),
        "mtti": format_duration(inputs["mtti_s"]),
        "restore": format_duration(inputs["restore_s"]),
    }


def _percent(ratio: float | None) -> str:
    return "—" if ratio is None else f"{100 * ratio:.1f}%"


@login_required
def job_detail_page(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    job = job_get_for_user(user=request.user, job_id=job_id)
    return render(request, "jobs/job_detail.html", _job_page_context(request, job, live_only=False))


@login_required
def job_status_partial(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    """The live header of the job page, polled while the tab is visible."""
    job = job_get_for_user(user=request.user, job_id=job_id)
    return render(request, "jobs/_job_status.html", _job_page_context(request, job, live_only=True))


@login_required
@require_POST
def job_cancel_action(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    job = job_get_for_user(user=request.user, job_id=job_id)
    try:
        outcome = job_cancel(actor=request.user, job=job)
        messages.success(request, f"{job.name}: {outcome}.")
    except ApplicationError as error:
        messages.error(request, error.message)
    return HttpResponseRedirect(reverse("job-detail", args=[job.id]))


@login_required
@require_POST
def job_resume_action(request: HttpRequest, job_id: uuid.UUID, checkpoint_id: int) -> HttpResponse:
    job = job_get_for_user(user=request.user, job_id=job_id)
    checkpoint = Checkpoint.objects.filter(job=job, pk=checkpoint_id).first()
    if checkpoint is None:
        messages.error(request, "No such checkpoint.")
        return HttpResponseRedirect(reverse("job-detail", args=[job.id]))
    try:
        new_job = job_resume(actor=request.user, checkpoint=checkpoint)
    except ApplicationError as error:
        messages.error(request, error.message)
        return HttpResponseRedirect(reverse("job-detail", args=[job.id]))
    messages.success(request, f"Resuming from step {checkpoint.step} as a new job.")
    return HttpResponseRedirect(reverse("job-detail", args=[new_job.id]))
