"""Celery tasks of the Slurm lifecycle: thin, ids in, one call each."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from controlplane.tasknames import SLURM_REQUEST_CARRY_OUT
from runs.lifecycle.requests import (
    REQUEST_TASK_SOFT_TIME_LIMIT,
    REQUEST_TASK_TIME_LIMIT,
    slurm_request_carry_out,
    slurm_request_gave_up,
)
from slurm.errors import TRANSIENT_ERRORS


@shared_task(
    bind=True,
    name=SLURM_REQUEST_CARRY_OUT,
    acks_late=True,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=2,
    retry_backoff_max=30,
    retry_jitter=True,
    max_retries=3,
    time_limit=REQUEST_TASK_TIME_LIMIT,
    soft_time_limit=REQUEST_TASK_SOFT_TIME_LIMIT,
)
def slurm_request_carry_out_task(self: Any, request_id: int) -> str:
    """Carry out one open cancel, hold or release as its object's account. Idempotent
    (the request is closed by one conditional update; scancel, hold and release change
    nothing twice), so acks_late is safe. Only transient SSH errors are retried; when
    they run out the request fails with the reason, on that object's page only."""
    try:
        return slurm_request_carry_out(request_id=request_id)
    except TRANSIENT_ERRORS as error:
        if self.request.retries >= self.max_retries:
            return slurm_request_gave_up(request_id=request_id, error=error)
        raise
