"""A checkpoint's state, owned here: every change to it, and the one rule of when it counts.

The rule. A checkpoint is **usable** once Gantry registered it from its manifest (the
trainer writes the manifest last, atomically, so a registered checkpoint is complete), for
as long as it is on the cluster (not retired) and no integrity check or drill failed it. It
is **proven** when, besides, a restore drill attested by the cluster's verifier passed on it
(``last_proven_at``). A failed drill or integrity check makes it unusable and voids any
earlier proof; an OK from the owner's own account never clears a failure (the owner is not
the one who attests). Recovery, work at risk, drills, the fleet's proven share and
``/metrics`` read "usable" and "proven" through the querysets here, never their own copy.

Every change is one conditional update, so two workers applying the same evidence apply it
once: registering creates the row once (a job's step is unique), retiring applies to a
checkpoint still on the cluster, an unattested OK skips a failed checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery

from jobs.models import Checkpoint, Job


def checkpoint_register(*, job: Job, step: int, values: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint of ``job`` at ``step``, registered from its manifest with ``values``
    (path, sizes, state keys, manifest and its digest); None when it was registered before."""
    checkpoint, created = Checkpoint.objects.get_or_create(job=job, step=step, defaults=values)
    return checkpoint if created else None


def checkpoints_retire(*, job: Job, steps: Iterable[int], now: datetime) -> int:
    """The trainer's retention removed these steps of ``job`` from the cluster: the rows stay,
    no longer usable."""
    return Checkpoint.objects.filter(job=job, step__in=list(steps), deleted_at__isnull=True).update(
        deleted_at=now
    )


def checkpoint_retire(*, checkpoint_id: int, now: datetime) -> int:
    """One checkpoint found gone from the cluster (removed while a drill ran)."""
    return Checkpoint.objects.filter(pk=checkpoint_id, deleted_at__isnull=True).update(
        deleted_at=now
    )


def checkpoint_integrity_record(
    *,
    checkpoint_id: int,
    ok: bool,
    detail: str,
    report: dict[str, Any] | None,
    attested: bool,
    now: datetime,
) -> int:
    """An integrity check's outcome. A failure blocks resuming from the checkpoint; an OK
    from the owner's own account (``attested`` False) leaves a failed checkpoint failed."""
    checked = Checkpoint.objects.filter(pk=checkpoint_id)
    if ok and not attested:
        checked = checked.exclude(integrity=Checkpoint.Integrity.FAILED)
    return checked.update(
        integrity=Checkpoint.Integrity.OK if ok else Checkpoint.Integrity.FAILED,
        integrity_detail="" if ok else detail[:2000],
        integrity_checked_at=now,
        integrity_report=report,
    )


def checkpoint_proof_record(*, checkpoint_id: int, now: datetime) -> int:
    """A drill attested by the verifier passed: the checkpoint is proven, and its integrity
    is OK (a passing restore checked every file)."""
    return Checkpoint.objects.filter(pk=checkpoint_id).update(
        last_proven_at=now,
        integrity=Checkpoint.Integrity.OK,
        integrity_detail="",
        integrity_checked_at=now,
    )


def checkpoint_state_proof_record(*, checkpoint_id: int, now: datetime) -> int:
    """A verifier-attested drill at the level state-exact, no replay passed: every file held
    to the registered manifest and the loaded state bit for bit to the saved fingerprint.
    Recorded apart from ``last_proven_at`` (never blurred with a replayed pass); integrity
    is OK."""
    return Checkpoint.objects.filter(pk=checkpoint_id).update(
        state_proven_at=now,
        integrity=Checkpoint.Integrity.OK,
        integrity_detail="",
        integrity_checked_at=now,
    )


def checkpoint_proof_void(*, checkpoint_id: int, detail: str, now: datetime) -> int:
    """A drill found the checkpoint at fault (whoever attested it): it is failed, and an
    earlier pass no longer stands."""
    return Checkpoint.objects.filter(pk=checkpoint_id).update(
        integrity=Checkpoint.Integrity.FAILED,
        integrity_detail=detail[:2000],
        integrity_checked_at=now,
        last_proven_at=None,
        state_proven_at=None,
    )


def usable(checkpoints: QuerySet[Checkpoint]) -> QuerySet[Checkpoint]:
    """Of ``checkpoints``, those on the cluster whose integrity did not fail."""
    return checkpoints.filter(deleted_at__isnull=True).exclude(
        integrity=Checkpoint.Integrity.FAILED
    )


def proven(checkpoints: QuerySet[Checkpoint]) -> QuerySet[Checkpoint]:
    """Of ``checkpoints``, the usable ones a verifier-attested drill passed."""
    return usable(checkpoints).filter(last_proven_at__isnull=False)


def newest_proven(*, jobs: Iterable[Job] | QuerySet[Job]) -> Checkpoint | None:
    """The newest proven checkpoint of any of ``jobs`` (a lineage)."""
    return (
        proven(Checkpoint.objects.filter(job__in=jobs)).order_by("-step", "-registered_at").first()
    )


def newest_checkpoint_proof() -> Subquery:
    """Per job (``OuterRef("pk")``), when its newest checkpoint was proven (None: not
    proven): "the running job's newest checkpoint is proven", as the drills page, the
    overview and ``/metrics`` count it."""
    newest = usable(Checkpoint.objects.filter(job=OuterRef("pk"))).order_by("-step")
    return Subquery(newest.values("last_proven_at")[:1])
