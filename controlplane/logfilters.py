"""Log filters for a quiet console (``GANTRY_QUIET_LOGS``, which ``make run`` sets): what
changes (job state changes, warnings, errors) is printed; what every periodic task says
each few seconds is not."""

from __future__ import annotations

import logging

# Loggers whose INFO lines come with every periodic task or polled page, not with a change.
_CHATTY = (
    "celery.beat",  # "Scheduler: Sending due task ..."
    "celery.worker.strategy",  # "Task ... received"
    "celery.app.trace",  # "Task ... succeeded in 0.01s"
    "celery.worker.consumer",  # heartbeats, mingle, gossip
    "django.server",  # "GET /jobs/.../status/ 200" every poll; 4xx/5xx are warnings
    "slurm.transport",  # idle SSH connections closed
)


class QuietPeriodic(logging.Filter):
    """Drops records below WARNING from the chatty loggers; keeps everything else."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return not any(
            record.name == name or record.name.startswith(name + ".") for name in _CHATTY
        )
