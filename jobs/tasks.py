"""Celery tasks for jobs: thin, ids in, one service call each."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from controlplane.tasknames import JOB_LOG_TAIL_READ, JOB_SUBMIT, METRICS_ROLLUP
from jobs.metric_retention import metrics_rollup_due
from jobs.services import job_log_tail_read, job_submit_gave_up, job_submit_to_slurm
from slurm.errors import TRANSIENT_ERRORS


@shared_task(
    bind=True,
    name=JOB_SUBMIT,
    acks_late=True,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=8,
    time_limit=120,
    soft_time_limit=100,
)
def job_submit_task(self: Any, job_id: str) -> str:
    """Submit one job to Slurm. Idempotent (tag lookup before sbatch), so acks_late is safe
    and a redelivery after a worker crash adopts the Slurm job instead of submitting again.
    When retries run out on a transient error the job goes back to ``queued``."""
    try:
        return job_submit_to_slurm(job_id=job_id)
    except TRANSIENT_ERRORS as error:
        if self.request.retries >= self.max_retries:
            job_submit_gave_up(job_id=job_id, error=error)
            return "gave up for now: cluster unreachable"
        raise


@shared_task(name=METRICS_ROLLUP, time_limit=300, soft_time_limit=240)
def metrics_rollup_task() -> dict[str, int]:
    """Beat's metric retention run (``jobs.metric_retention``): rolls long jobs' old steps
    up within a time budget, the rest next run. Safe to re-run and to overlap: each batch
    moves the job's watermark conditionally, in the transaction that deletes its points."""
    result = metrics_rollup_due(time_budget_s=180.0)
    return {"jobs": result.jobs, "buckets": result.buckets, "points": result.points}


@shared_task(name=JOB_LOG_TAIL_READ, time_limit=90, soft_time_limit=80)
def job_log_tail_read_task(job_id: str) -> str:
    """Read one job's log tail (bounded bytes) as its account for the page. Not retried:
    a failure is stored with the tail and shown, and the next look asks again. Safe to
    re-run: each read replaces the stored tail with a newer one."""
    return job_log_tail_read(job_id=job_id)
