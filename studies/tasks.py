"""Celery tasks for studies: thin, one service call each."""

from __future__ import annotations

from celery import shared_task

from controlplane.tasknames import STUDIES_ADVANCE
from studies.services import studies_advance_all


@shared_task(name=STUDIES_ADVANCE, time_limit=120, soft_time_limit=100)
def studies_advance_all_task() -> int:
    """Submit the next point of every study whose previous point ended. Safe to re-run."""
    return studies_advance_all()
