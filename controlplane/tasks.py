from __future__ import annotations

from celery import shared_task


@shared_task(name="controlplane.ping", time_limit=10, soft_time_limit=5)
def ping() -> str:
    """Answer ``pong``: proves a worker is consuming from the broker."""
    return "pong"
