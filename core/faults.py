"""Fault points: places where the fault-injection suite may kill the process on purpose.

Off unless ``GANTRY_FAULTPOINTS`` names them, e.g.
``GANTRY_FAULTPOINTS="job_submit.after_sbatch:0.3,job_submit.after_claim:0.2"``: at each
named point the process is SIGKILLed with that probability, as a crash would. Used only by
``scripts/faults``; a production deployment never sets the variable.
"""

from __future__ import annotations

import os
import random
import signal
from functools import cache


@cache
def _configured() -> dict[str, float]:
    points: dict[str, float] = {}
    for item in os.environ.get("GANTRY_FAULTPOINTS", "").split(","):
        name, _, probability = item.strip().partition(":")
        if name:
            points[name] = float(probability or 1.0)
    return points


def faultpoint(name: str) -> None:
    probability = _configured().get(name)
    if probability and random.random() < probability:
        os.kill(os.getpid(), signal.SIGKILL)
