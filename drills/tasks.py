"""Celery tasks for drills: thin, ids in, one service call each."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from controlplane.tasknames import CHECKPOINT_VERIFY, DRILL_POLICIES_APPLY, DRILL_SUBMIT
from drills.policies import drill_policies_apply
from drills.services import (
    checkpoint_verify,
    restore_drill_submit_gave_up,
    restore_drill_submit_to_slurm,
)
from slurm.errors import TRANSIENT_ERRORS


@shared_task(
    bind=True,
    name=DRILL_SUBMIT,
    acks_late=True,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=2,
    retry_backoff_max=30,
    retry_jitter=False,
    time_limit=120,
    soft_time_limit=100,
)
def restore_drill_submit_task(self: Any, drill_id: str) -> str:
    """Submit a drill's Slurm job. Idempotent like the job submit (tag lookup first).
    When the cluster stays unreachable the drill ends ``error``: it could not run."""
    self.max_retries = settings.DRILL_SUBMIT_RETRIES
    try:
        return restore_drill_submit_to_slurm(drill_id=drill_id)
    except TRANSIENT_ERRORS as error:
        if self.request.retries >= self.max_retries:
            restore_drill_submit_gave_up(drill_id=drill_id, error=error)
            return "gave up: cluster unreachable"
        raise


@shared_task(name=CHECKPOINT_VERIFY, time_limit=700, soft_time_limit=650)
def checkpoint_verify_task(checkpoint_id: int) -> str:
    """Integrity check of one checkpoint; read-only on the cluster, safe to repeat."""
    checkpoint = checkpoint_verify(checkpoint_id=checkpoint_id)
    return checkpoint.integrity


@shared_task(name=DRILL_POLICIES_APPLY, time_limit=60, soft_time_limit=50)
def drill_policies_apply_task() -> int:
    """Beat: start the drills that policies ask for, bounded per cluster."""
    return drill_policies_apply()
