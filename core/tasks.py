from __future__ import annotations

from celery import shared_task

from controlplane.tasknames import PING


@shared_task(name=PING, time_limit=10, soft_time_limit=5)
def ping() -> str:
    """Answer ``pong``: proves a worker is consuming from the broker."""
    return "pong"
