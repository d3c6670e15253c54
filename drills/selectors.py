"""Reads for drills: who may see which drill, the drill list, fleet drill health."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db.models import Count, Max, QuerySet
from django.http import Http404

from core.errors import FieldError
from core.types import MaybeUser
from drills.models import RestoreDrill
from drills.reference import recorded_trainer_digest
from jobs import checkpoint_state
from jobs.models import Checkpoint, Job
from jobs.selectors import job_list_for_user


def restore_drill_list_for_user(*, user: MaybeUser) -> QuerySet[RestoreDrill]:
    """Drills a user may see: those of the jobs they may see (``job_list_for_user``)."""
    return RestoreDrill.objects.select_related("checkpoint", "checkpoint__job").filter(
        checkpoint__job__in=job_list_for_user(user=user)
    )


def drill_get_for_user(*, user: MaybeUser, drill_id: UUID | str) -> RestoreDrill:
    """The one access check for a drill; 404 for a missing drill and for someone else's."""
    try:
        return (
            restore_drill_list_for_user(user=user)
            .select_related("requested_by", "checkpoint__job__cluster")
            .get(id=drill_id)
        )
    except (RestoreDrill.DoesNotExist, ValueError, TypeError, ValidationError):
        raise Http404("No such drill.") from None


def drill_list(
    *,
    user: MaybeUser,
    state: str | None = None,
    verdict: str | None = None,
    job: str | None = None,
    cluster: str | None = None,
) -> QuerySet[RestoreDrill]:
    """The one drill list behind the drills page and the API, filtered; unknown state or
    verdict names are refused with the field."""
    drills = restore_drill_list_for_user(user=user).select_related("requested_by")
    if state:
        if state not in RestoreDrill.State.values:
            raise FieldError("state", f"unknown state {state!r}")
        drills = drills.filter(state=state)
    if verdict:
        if verdict not in RestoreDrill.Verdict.values:
            raise FieldError("verdict", f"unknown verdict {verdict!r}")
        drills = drills.filter(verdict=verdict)
    if job:
        drills = drills.filter(checkpoint__job_id=job)
    if cluster:
        drills = drills.filter(cluster__name=cluster)
    return drills


def drill_fleet_health(*, user: MaybeUser) -> dict[str, Any]:
    """Share of running jobs whose newest checkpoint is proven, recent failures,
    the time-to-restore distribution and drills in flight. Passes and restore times count
    verifier-attested drills only (a self-attested one is the owner's word, counted apart)."""
    newest_proven = checkpoint_state.newest_checkpoint_proof()
    running_jobs = job_list_for_user(user=user).filter(state=Job.State.RUNNING)
    running = running_jobs.count()
    proven = (
        running_jobs.annotate(newest_proven=newest_proven)
        .filter(newest_proven__isnull=False)
        .count()
    )
    drills = restore_drill_list_for_user(user=user)
    failures = list(
        drills.filter(verdict=RestoreDrill.Verdict.FAILED).order_by("-finished_at")[:10]
    )
    errors = list(drills.filter(verdict=RestoreDrill.Verdict.ERROR).order_by("-finished_at")[:5])
    inconclusive = list(
        drills.filter(verdict=RestoreDrill.Verdict.INCONCLUSIVE).order_by("-finished_at")[:5]
    )
    attested_passes = drills.filter(
        verdict=RestoreDrill.Verdict.PASSED, attestation=RestoreDrill.Attestation.VERIFIER
    )
    load_times = list(
        attested_passes.filter(load_s__isnull=False)
        .order_by("-finished_at")
        .values_list("load_s", flat=True)[:500]
    )
    in_flight = list(drills.filter(state__in=RestoreDrill.ACTIVE_STATES).order_by("created_at"))
    proven_checkpoints = checkpoint_state.proven(
        Checkpoint.objects.filter(job__in=job_list_for_user(user=user))
    ).count()
    return {
        "running_jobs": running,
        "running_jobs_proven": proven,
        "proven_share": (proven / running) if running else None,
        "recent_failures": failures,
        "recent_errors": errors,
        "recent_inconclusive": inconclusive,
        "load_times": sorted(load_times),
        "in_flight": in_flight,
        "proven_checkpoints": proven_checkpoints,
        "passed": attested_passes.count(),
        "self_attested_passed": drills.filter(
            verdict=RestoreDrill.Verdict.PASSED, attestation=RestoreDrill.Attestation.SELF
        ).count(),
        "failed": drills.filter(verdict=RestoreDrill.Verdict.FAILED).count(),
        "inconclusive": drills.filter(verdict=RestoreDrill.Verdict.INCONCLUSIVE).count(),
        "errored": drills.filter(verdict=RestoreDrill.Verdict.ERROR).count(),
    }


def checkpoint_proofs(*, checkpoint: Checkpoint) -> list[dict[str, Any]]:
    """Which trainer versions proved ``checkpoint`` restorable: per version, how many
    verifier-attested drills passed, the newest pass, and whether it was the version that
    wrote it (a self-attested pass proves nothing)."""
    rows = (
        RestoreDrill.objects.filter(
            checkpoint=checkpoint,
            verdict=RestoreDrill.Verdict.PASSED,
            attestation=RestoreDrill.Attestation.VERIFIER,
        )
        .exclude(trainer_digest="")
        .values("trainer_digest")
        .annotate(passes=Count("id"), last_passed_at=Max("finished_at"))
        .order_by("-last_passed_at")
    )
    wrote_it = recorded_trainer_digest(checkpoint)
    return [
        {
            "trainer_digest": row["trainer_digest"],
            "passes": row["passes"],
            "last_passed_at": row["last_passed_at"],
            "wrote_it": row["trainer_digest"] == wrote_it,
        }
        for row in rows
    ]
