"""Page actions on one job beyond cancel and resume: hold and release a pending job, and
download its whole output (or one rank's), streamed from the cluster."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core.access import request_user
from core.errors import ApplicationError
from jobs.output import job_output_response
from jobs.pending_queue import job_hold, job_release
from jobs.selectors import job_get_for_user


def _hold_or_release(request: HttpRequest, job_id: uuid.UUID, *, hold: bool) -> HttpResponse:
    job = job_get_for_user(user=request_user(request), job_id=job_id)
    try:
        outcome = (job_hold if hold else job_release)(actor=request_user(request), job=job)
        messages.success(request, f"{job.name}: {outcome}; Slurm's new reason shows shortly.")
    except ApplicationError as error:
        messages.error(request, error.message)
    return HttpResponseRedirect(reverse("job-detail", args=[job.id]))


@login_required
@require_POST
def job_hold_action(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    return _hold_or_release(request, job_id, hold=True)


@login_required
@require_POST
def job_release_action(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    return _hold_or_release(request, job_id, hold=False)


@login_required
@require_GET
def job_output_download(
    request: HttpRequest, job_id: uuid.UUID, rank: int | None = None
) -> HttpResponseBase:
    """The whole Slurm output (or rank ``rank``'s) as a file; honours ``Range``."""
    job = job_get_for_user(user=request_user(request), job_id=job_id)
    try:
        return job_output_response(job=job, rank=rank, range_header=request.headers.get("Range"))
    except ApplicationError as error:
        if error.status_code == 404:
            raise Http404(error.message) from None
        messages.error(request, error.message)
        return HttpResponseRedirect(reverse("job-detail", args=[job.id]))
