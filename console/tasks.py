"""Celery tasks for the console: thin, one call each."""

from __future__ import annotations

from celery import shared_task

from console.overview import overview_goodput_refresh
from controlplane.tasknames import OVERVIEW_GOODPUT_REFRESH


@shared_task(name=OVERVIEW_GOODPUT_REFRESH, time_limit=300, soft_time_limit=240)
def overview_goodput_refresh_task(user_id: int | None) -> bool:
    """The overview's goodput table computed again off the request path, when a page view
    found it older than a minute (``console.overview._goodput_weeks``)."""
    return overview_goodput_refresh(user_id=user_id)
