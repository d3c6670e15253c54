from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from jobs.models import Job
from jobs.selectors import drill_fleet_health, job_list_for_user
from nodes.selectors import cluster_health_list


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    jobs = job_list_for_user(user=request.user)
    throughput = (
        jobs.filter(state=Job.State.RUNNING).aggregate(total=Sum("throughput_now"))["total"] or 0.0
    )
    context = {
        "throughput_now": throughput,
        "drill_health": drill_fleet_health(user=request.user),
        "cluster_health": cluster_health_list(),
        "running_count": jobs.filter(state=Job.State.RUNNING).count(),
        "pending_count": jobs.filter(
            state__in=[Job.State.QUEUED, Job.State.SUBMITTING, Job.State.PENDING]
        ).count(),
        "recent_failures": list(
            jobs.filter(state__in=[Job.State.FAILED, Job.State.NODE_FAIL, Job.State.LOST]).order_by(
                "-ended_at", "-created_at"
            )[:5]
        ),
    }
    return render(request, "overview.html", context)
