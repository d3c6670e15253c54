from __future__ import annotations

import csv
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from core.access import request_user
from core.errors import FieldError
from core.roles import is_researcher
from studies.forms import StudyForm
from studies.selectors import CSV_COLUMNS, study_get_for_user, study_list_for_user, study_report
from studies.services import study_create, study_results_freeze


@login_required
def study_list_page(request: HttpRequest) -> HttpResponse:
    studies = list(study_list_for_user(user=request_user(request)).prefetch_related("points")[:100])
    return render(
        request,
        "studies/study_list.html",
        {"studies": studies, "can_create": is_researcher(request.user)},
    )


@login_required
def study_new_page(request: HttpRequest) -> HttpResponse:
    if not is_researcher(request.user):
        raise PermissionDenied
    form = StudyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        cluster = data["cluster"]
        try:
            study = study_create(
                user=request_user(request),
                cluster=cluster,
                name=data["name"],
                kind=data["kind"],
                scales=data["scales"],
                config={"preset": data["preset"], "checkpoint_every": 0},
                batch_size=data["batch_size"],
                warmup_steps=data["warmup_steps"],
                measured_steps=data["measured_steps"],
                partition=data.get("partition") or cluster.default_partition,
                ranks_per_node=data["ranks_per_node"],
                gpus_per_rank=data["gpus_per_rank"],
                time_limit_minutes=data["time_limit_minutes"],
                use_placement=data["use_placement"],
                target_requested=data["target_requested"],
            )
        except FieldError as error:
            form.attach_error(error.field, error.why)
        else:
            return HttpResponseRedirect(reverse("study-detail", args=[study.pk]))
    return render(request, "studies/study_new.html", {"form": form})


def _context(request: HttpRequest, study_id: int) -> dict[str, Any]:
    study = study_get_for_user(user=request_user(request), study_id=study_id)
    study_results_freeze(study=study)
    return {"study": study, "report": study_report(study=study)}


@login_required
def study_detail_page(request: HttpRequest, study_id: int) -> HttpResponse:
    return render(request, "studies/study_detail.html", _context(request, study_id))


@login_required
def study_status_partial(request: HttpRequest, study_id: int) -> HttpResponse:
    """The live table of the study page, polled while points run."""
    return render(request, "studies/_study_status.html", _context(request, study_id))


@login_required
def study_export_csv(request: HttpRequest, study_id: int) -> HttpResponse:
    context = _context(request, study_id)
    study = context["study"]
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    filename = f"study-{study.pk}-{study.kind}.csv"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for row in context["report"]["rows"]:
        writer.writerow(["" if row.get(col) is None else row.get(col) for col in CSV_COLUMNS])
    return response
