"""The submit page: the form built from the inventory, prefilled from a template or a job
("run again"), its live check (a small JSON endpoint the form calls as you type), submit,
and "save as template"."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.access import request_user
from core.errors import FieldError
from core.roles import is_researcher
from jobs.compose.form import JobForm
from jobs.compose.inventory import checkpoint_advice_for_request, submit_inventory
from jobs.compose.presets import preset_descriptions
from jobs.compose.settings import form_initial, job_request_from_values, job_settings
from jobs.compose.templates import (
    job_template_create,
    job_template_get_for_user,
    template_environment_to_confirm,
)
from jobs.placement import job_request_with_advice, placement_advice_for_request
from jobs.selectors import job_get_for_user
from jobs.services import job_preview, job_submit
from jobs.validation import JobRequest
from nodes.models import Cluster
from nodes.placement_service import placement_as_dict


def _form_request(form: JobForm) -> JobRequest:
    return job_request_from_values(form.settings(), cluster=form.cleaned_data["cluster"])


def _prefill(request: HttpRequest) -> tuple[dict[str, Any], str]:
    """Initial values from ``?template=<id>`` or ``?from_job=<id>`` (run again), and a line
    saying where they came from. Someone else's private template or job is not found."""
    template_id = request.GET.get("template")
    if template_id:
        template = job_template_get_for_user(user=request_user(request), template_id=template_id)
        initial = form_initial(template.settings, cluster=template.cluster)
        origin = f"From template “{template.name}” ({template.owner.get_username()})."
        foreign = template_environment_to_confirm(user=request_user(request), template=template)
        if foreign:
            origin += (
                f" It sets environment variables for your job ({', '.join(sorted(foreign))}):"
                " check them under Environment before you submit."
            )
        return initial, origin
    job_id = request.GET.get("from_job")
    if job_id:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        initial = form_initial(job_settings(job), cluster=job.cluster)
        return initial, f"The settings of {job.name}: change what you like and submit."
    return {}, ""


def _save_template(request: HttpRequest, form: JobForm) -> HttpResponse | None:
    name = (form.cleaned_data.get("save_name") or "").strip()
    if not name:
        form.add_error("save_name", "Name the template to save it.")
        return None
    template = job_template_create(
        user=request_user(request),
        name=name,
        cluster=form.cleaned_data["cluster"],
        settings=form.settings(),
        shared=bool(form.cleaned_data.get("save_shared")),
    )
    messages.success(request, f"Template “{template.name}” saved.")
    return HttpResponseRedirect(reverse("job-template-list"))


@login_required
def job_new_page(request: HttpRequest) -> HttpResponse:
    if not is_researcher(request.user):
        raise PermissionDenied
    inventory = submit_inventory()
    script = advice = None
    origin = ""
    if request.method == "POST":
        form = JobForm(request.POST, inventory=inventory)
    else:
        initial, origin = _prefill(request)
        # The id the job will have: the live script shows it, and a second submit of the
        # same form is refused instead of making a second job.
        initial["job_id"] = uuid.uuid4()
        form = JobForm(initial=initial, inventory=inventory)
    action = request.POST.get("action")
    if request.method == "POST" and form.is_valid():
        job_id = form.cleaned_data.get("job_id") or uuid.uuid4()
        try:
            if action == "save_template":
                saved = _save_template(request, form)
                if saved is not None:
                    return saved
            else:
                job_request = _form_request(form)
                if form.cleaned_data.get("use_placement_advice"):
                    job_request, advice = job_request_with_advice(job_request)
                if action == "preview":
                    _, script = job_preview(
                        user=request_user(request), request=job_request, job_id=job_id
                    )
                    advice = advice or placement_advice_for_request(job_request)
                    data = request.POST.copy()
                    data["job_id"] = str(job_id)
                    form = JobForm(data, inventory=inventory)
                    form.is_valid()
                else:
                    job = job_submit(user=request_user(request), request=job_request, job_id=job_id)
                    messages.success(
                        request, f"Job {job.name} is queued; Gantry is submitting it to Slurm."
                    )
                    return HttpResponseRedirect(reverse("job-detail", args=[job.id]))
        except FieldError as error:
            form.attach_error(error.field, error.why)
    context = {
        "form": form,
        "script": script,
        "advice": advice,
        "origin": origin,
        "inventory": inventory,
        "presets": _presets_for(form),
    }
    return render(request, "jobs/job_form.html", context)


def _presets_for(form: JobForm) -> list[dict[str, Any]]:
    cluster = form.chosen_cluster()
    partition = form.chosen_partition()
    chosen = Cluster.objects.filter(pk=cluster["id"]).first() if cluster else None
    return preset_descriptions(cluster=chosen, partition=partition["name"] if partition else None)


def _errors(form: JobForm) -> dict[str, list[str]]:
    return {field: [str(message) for message in errors] for field, errors in form.errors.items()}


def _int_or(raw: Any, default: int) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        return default


def _checkpoint_advice(form: JobForm, data: Any) -> dict[str, Any] | None:
    cluster = form.cleaned_data.get("cluster")
    partition = form.chosen_partition()
    if cluster is None or partition is None:
        return None
    gpus = _int_or(data.get("gpus_per_node"), 0)
    return checkpoint_advice_for_request(
        cluster=cluster,
        partition=partition["name"],
        preset=data.get("preset") or None,
        checkpoint_every=_int_or(data.get("checkpoint_every"), 0),
        nodes=_int_or(data.get("nodes"), 1),
        gpus_per_node=gpus,
        tasks_per_node=_int_or(data.get("tasks_per_node"), max(1, gpus)),
    )


@login_required
@require_POST
def job_compose_check(request: HttpRequest) -> JsonResponse:
    """The form's live check, called as the person types: the same validation as submit
    and the API, and what the page shows beside the form (placement advice, the exact
    sbatch script, the presets on the chosen partition, checkpoint-interval advice).
    Saves nothing. Field errors are keyed by the form's field names."""
    if not is_researcher(request.user):
        raise PermissionDenied
    data = request.POST.copy()
    # The script and advice show before a name is typed; the name's own error only once
    # the person has touched it (the page decides).
    data["name"] = data.get("name", "").strip() or "untitled"
    form = JobForm(data, inventory=submit_inventory())
    body: dict[str, Any] = {"ok": False, "errors": {}, "script": None, "advice": None}
    if form.is_valid():
        try:
            job_request = _form_request(form)
            if form.cleaned_data.get("use_placement_advice"):
                job_request, advice = job_request_with_advice(job_request)
            else:
                advice = placement_advice_for_request(job_request)
            job, script = job_preview(
                user=request_user(request),
                request=job_request,
                job_id=form.cleaned_data.get("job_id"),
            )
            body.update(
                ok=True, script=script, advice=placement_as_dict(advice), world=job.world_size
            )
        except FieldError as error:
            form.attach_error(error.field, error.why)
    body["errors"] = _errors(form)
    body["presets"] = _presets_for(form)
    body["partition"] = form.chosen_partition()
    body["checkpoint_advice"] = _checkpoint_advice(form, request.POST)
    return JsonResponse(body)
