"""Pages of job templates: the list (yours and the shared ones), submit from one, share or
unshare, delete; and "save as template" on a job's page."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.access import can_act, request_user
from core.errors import ApplicationError
from core.roles import is_researcher
from jobs.compose.templates import (
    job_template_delete,
    job_template_from_job,
    job_template_get_for_user,
    job_template_list_for_user,
    job_template_submit,
    job_template_update,
    template_environment_to_confirm,
)
from jobs.selectors import job_get_for_user


def _summary(settings: dict) -> str:
    config = settings.get("config") or {}
    gpus = settings.get("gpus_per_node") or 0
    parts = [
        f"{settings.get('partition') or 'default partition'}",
        f"{settings.get('nodes', 1)} node{'s' if settings.get('nodes', 1) != 1 else ''}",
    ]
    if gpus:
        parts.append(f"{gpus} {settings.get('gpu_type') or 'GPU'}/node")
    parts.append(f"preset {config.get('preset', 'default')}")
    if config.get("steps"):
        parts.append(f"{config['steps']} steps")
    return " · ".join(parts)


@login_required
def job_template_list_page(request: HttpRequest) -> HttpResponse:
    rows = [
        {
            "template": template,
            "summary": _summary(template.settings),
            "can_act": can_act(request.user, owner_id=template.owner_id),
            # For the "you" label only; what one may do is can_act's.
            "mine": template.owner == request.user,
            # Someone else's variables: shown in the form before anything is submitted.
            "environment_to_confirm": sorted(
                template_environment_to_confirm(user=request_user(request), template=template)
            ),
        }
        for template in job_template_list_for_user(user=request_user(request))
    ]
    return render(
        request,
        "jobs/job_templates.html",
        {"rows": rows, "can_submit": is_researcher(request.user)},
    )


@login_required
@require_POST
def job_template_submit_action(request: HttpRequest, template_id: int) -> HttpResponse:
    template = job_template_get_for_user(user=request_user(request), template_id=template_id)
    if template_environment_to_confirm(user=request_user(request), template=template):
        # Never applied unseen: the form shows the template's variables; submitting it
        # is the confirmation.
        messages.info(
            request,
            f"“{template.name}” sets environment variables for your job: check them below "
            "before you submit.",
        )
        return HttpResponseRedirect(f"{reverse('job-new')}?template={template.pk}")
    try:
        job = job_template_submit(user=request_user(request), template=template)
    except ApplicationError as error:
        messages.error(request, f"{template.name}: {error.message}")
        return HttpResponseRedirect(reverse("job-template-list"))
    messages.success(request, f"Job {job.name} is queued from template “{template.name}”.")
    return HttpResponseRedirect(reverse("job-detail", args=[job.id]))


@login_required
@require_POST
def job_template_share_action(request: HttpRequest, template_id: int) -> HttpResponse:
    template = job_template_get_for_user(user=request_user(request), template_id=template_id)
    shared = request.POST.get("shared") == "1"
    job_template_update(actor=request_user(request), template=template, shared=shared)
    messages.success(
        request, f"“{template.name}” is {'shared with everyone' if shared else 'private'}."
    )
    return HttpResponseRedirect(reverse("job-template-list"))


@login_required
@require_POST
def job_template_delete_action(request: HttpRequest, template_id: int) -> HttpResponse:
    template = job_template_get_for_user(user=request_user(request), template_id=template_id)
    job_template_delete(actor=request_user(request), template=template)
    messages.success(request, f"Template “{template.name}” deleted.")
    return HttpResponseRedirect(reverse("job-template-list"))


@login_required
@require_POST
def job_save_template_action(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    job = job_get_for_user(user=request_user(request), job_id=job_id)
    try:
        template = job_template_from_job(
            user=request_user(request),
            job=job,
            name=request.POST.get("name") or job.name,
            shared=request.POST.get("shared") == "1",
        )
    except ApplicationError as error:
        messages.error(request, f"Not saved: {error.message}")
        return HttpResponseRedirect(reverse("job-detail", args=[job.id]))
    messages.success(request, f"Saved as template “{template.name}”.")
    return HttpResponseRedirect(reverse("job-template-list"))
