from __future__ import annotations

from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404

from controlplane.roles import is_operator
from jobs.models import Job, RestoreDrill


def job_list_for_user(*, user: Any) -> QuerySet[Job]:
    """Jobs a user may see: all for operators, their own for everyone else."""
    jobs = Job.objects.select_related("cluster", "owner")
    if is_operator(user):
        return jobs
    if not getattr(user, "is_authenticated", False):
        return jobs.none()
    return jobs.filter(owner=user)


def job_get_for_user(*, user: Any, job_id: UUID | str) -> Job:
    """The one access check for a job, used by pages, API and tasks alike.

    Raises Http404 both for a missing job and for someone else's: no existence leak.
    """
    try:
        return job_list_for_user(user=user).get(id=job_id)
    except (Job.DoesNotExist, ValueError, TypeError, ValidationError):
        raise Http404("No such job.") from None


def restore_drill_list_for_user(*, user: Any) -> QuerySet[RestoreDrill]:
    drills = RestoreDrill.objects.select_related("checkpoint", "checkpoint__job")
    if is_operator(user):
        return drills
    if not getattr(user, "is_authenticated", False):
        return drills.none()
    return drills.filter(checkpoint__job__owner=user)
