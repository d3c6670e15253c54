from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.access import can_act
from core.errors import ApplicationError, FieldError
from core.roles import is_operator, is_researcher
from jobs.forms import JobForm
from jobs.goodput import format_duration
from jobs.models import Checkpoint, Job
from jobs.pending import pending_reason
from jobs.placement import (
    job_placement_check,
    job_request_with_advice,
    placement_advice_for_request,
)
from jobs.script import job_script
from jobs.selectors import job_get_for_user, job_goodput, job_list, job_queue_position
from jobs.services import job_cancel, job_preview, job_resume, job_submit
from jobs.validation import JobRequest
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


def _form_request(form: JobForm) -> JobRequest:
    data = form.cleaned_data
    cluster = data["cluster"]
    return JobRequest(
        cluster=cluster,
        name=data["name"],
        config=form.trainer_config(),
        partition=data.get("partition") or cluster.default_partition,
        nodes=data["nodes"],
        gpus_per_node=data["gpus_per_node"],
        gpu_type=data.get("gpu_type") or "",
        tasks_per_node=data.get("tasks_per_node") or max(1, data["gpus_per_node"]),
        cpus_per_task=data["cpus_per_task"],
        memory_mb=data.get("memory_mb"),
        time_limit_minutes=data["time_limit_minutes"],
        nodelist=(data.get("nodelist") or "").strip(),
        switches=(data.get("switches") or "").strip(),
    )


@login_required
def job_new_page(request: HttpRequest) -> HttpResponse:
    if not is_researcher(request.user):
        raise PermissionDenied
    script = None
    advice = None
    form = JobForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        job_id = form.cleaned_data.get("job_id") or uuid.uuid4()
        try:
            job_request = _form_request(form)
            if form.cleaned_data.get("use_placement_advice"):
                job_request, advice = job_request_with_advice(job_request)
            if request.POST.get("action") == "preview":
                _, script = job_preview(user=request.user, request=job_request, job_id=job_id)
                if advice is None:
                    advice = placement_advice_for_request(job_request)
                data = request.POST.copy()
                data["job_id"] = str(job_id)
                form = JobForm(data)
                form.is_valid()
            else:
                job = job_submit(user=request.user, request=job_request, job_id=job_id)
                messages.success(
                    request, f"Job {job.name} is queued; Gantry is submitting it to Slurm."
                )
                return HttpResponseRedirect(reverse("job-detail", args=[job.id]))
        except FieldError as error:
            form.attach_error(error.field, error.why)
    return render(request, "jobs/job_new.html", {"form": form, "script": script, "advice": advice})


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
    """Why a pending job waits, in words, and its place in Gantry's view of the queue."""
    if job.state != Job.State.PENDING:
        return None
    return {**pending_reason(job.state_reason), "queue": job_queue_position(job=job)}


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
