"""For ``web_list_bench.py --gc-log`` only (on ``PYTHONPATH`` of the servers under test):
times every garbage collection of the process and its forked workers, one line per
collection (milliseconds, generation) appended to ``$GANTRY_BENCH_GC_LOG``."""

from __future__ import annotations

import gc
import os
import time
from typing import Any

_LOG = os.environ.get("GANTRY_BENCH_GC_LOG")
_started: list[float] = []


def _timed(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[:] = [time.perf_counter()]
        return
    if not _started or _LOG is None:
        return
    elapsed_ms = (time.perf_counter() - _started[0]) * 1000
    with open(_LOG, "a") as log:
        log.write(f"{elapsed_ms:.3f} {info.get('generation')}\n")


if _LOG:
    gc.callbacks.append(_timed)
