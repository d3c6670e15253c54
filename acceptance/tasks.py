"""Celery tasks of acceptance: thin, ids in, one lifecycle call each."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from acceptance.lifecycle import STEPS
from controlplane.tasknames import ACCEPTANCE_STEP_SUBMIT
from slurm.errors import TRANSIENT_ERRORS


@shared_task(
    bind=True,
    name=ACCEPTANCE_STEP_SUBMIT,
    acks_late=True,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=2,
    retry_backoff_max=30,
    retry_jitter=False,
    time_limit=120,
    soft_time_limit=100,
)
def acceptance_step_submit_task(self: Any, step_id: str) -> str:
    """Submit one acceptance step's Slurm job, exactly once (the lifecycle looks its tag up
    before any sbatch). When the cluster stays unreachable the step ends inconclusive."""
    self.max_retries = settings.DRILL_SUBMIT_RETRIES
    try:
        return STEPS.submit_exactly_once(step_id)
    except TRANSIENT_ERRORS as error:
        if self.request.retries >= self.max_retries:
            STEPS.submit_gave_up(step_id, error)
            return "gave up: cluster unreachable"
        raise
