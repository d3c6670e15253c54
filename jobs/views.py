from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.roles import is_operator
from jobs.models import Job
from jobs.selectors import job_list_for_user, restore_drill_list_for_user


@login_required
def job_list_page(request: HttpRequest) -> HttpResponse:
    jobs = job_list_for_user(user=request.user)
    state = request.GET.get("state") or ""
    if state:
        jobs = jobs.filter(state=state)
    return render(
        request,
        "jobs/job_list.html",
        {
            "jobs": list(jobs.order_by("-created_at")[:100]),
            "states": Job.State.choices,
            "state": state,
            "sees_all": is_operator(request.user),
        },
    )


@login_required
def drill_list_page(request: HttpRequest) -> HttpResponse:
    drills = restore_drill_list_for_user(user=request.user).order_by("-created_at")[:100]
    return render(request, "jobs/drill_list.html", {"drills": list(drills)})
