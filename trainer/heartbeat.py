"""Each rank's heartbeat: a thread that rewrites ``<run dir>/ranks/rank-<N>.beat`` every
``INTERVAL_S`` seconds with the rank, its node, its process, the step it is at and the time.

A rank blocked in a collective keeps beating (its thread runs); a rank whose process stopped
(SIGSTOP, a hung driver call holding the interpreter) or died does not. So when a job's
steps stop, the stale heartbeats name the ranks that stopped, and their nodes; fresh ones
everywhere say the ranks are alive and waiting on something else (the network, a peer).
Format in ``trainer/SCHEMA.md`` (``ranks/rank-<N>.beat``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable

INTERVAL_S = 2.0
DIRECTORY = "ranks"


def beat_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, DIRECTORY, f"rank-{rank}.beat")


def write_beat(run_dir: str, rank: int, node: str, step: int) -> None:
    """One heartbeat, written whole (a temporary file renamed over the last one)."""
    path = beat_path(run_dir, rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {"rank": rank, "node": node, "pid": os.getpid(), "step": step, "time": time.time()}
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record, separators=(",", ":")) + "\n")
    os.replace(temporary, path)


class Heartbeat:
    """The heartbeat thread of one rank (a daemon: it never keeps the process alive)."""

    def __init__(self, run_dir: str, rank: int, node: str, step: Callable[[], int]) -> None:
        self._args = (run_dir, rank, node)
        self._step = step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=INTERVAL_S * 2)

    def _run(self) -> None:
        run_dir, rank, node = self._args
        while not self._stop.is_set():
            # A full disk or a removed directory: the next beat tries again.
            with contextlib.suppress(OSError):
                write_beat(run_dir, rank, node, self._step())
            self._stop.wait(INTERVAL_S)
