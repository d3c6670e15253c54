"""The Celery application. Workers and beat start with ``celery -A controlplane ...``."""

from __future__ import annotations

import logging.config
import os
from typing import Any

from celery import Celery
from celery.signals import setup_logging

from controlplane.env import envbool

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("gantry")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

if envbool("GANTRY_QUIET_LOGS", False):
    # With a receiver Celery leaves logging alone: the worker and beat then use Django's
    # LOGGING, whose filter drops the lines every periodic task writes (--loglevel has no
    # effect; GANTRY_LOG_LEVEL has).

    @setup_logging.connect
    def _django_logging(**_: Any) -> None:
        from django.conf import settings

        logging.config.dictConfig(settings.LOGGING)
